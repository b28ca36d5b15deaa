package provider_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/provider"
)

// Only a charge with a known status is an answer; every other reply leaves the outcome open.
func TestAnswersClassified(t *testing.T) {
	long := strings.Repeat("x", 5000)
	for _, tc := range []struct {
		name    string
		inquiry bool
		status  int
		body    string
		want    string // the charge status, or the error
	}{
		{"charged", false, 201, `{"id":"ch_1","reference":"r","status":"succeeded"}`, "succeeded"},
		{"declined", false, 201, `{"id":"ch_1","reference":"r","status":"declined"}`, "declined"},
		{"201 without a status", false, 201, `{"id":"ch_1"}`, "provider outcome unknown"},
		{"201 with an unknown status", false, 201, `{"id":"ch_1","status":"pending"}`, "provider outcome unknown"},
		{"200 with a body that is not JSON", false, 200, "<html>oops", "provider outcome unknown"},
		{"201 with a body that is not JSON", false, 201, "\x00\x01garbage", "provider outcome unknown"},
		{"409 in progress", false, 409, `{"error":"a request with this key is in progress"}`, "provider outcome unknown"},
		{"400", false, 400, `{"error":"bad"}`, "provider outcome unknown"},
		{"422", false, 422, `{}`, "provider outcome unknown"},
		{"429", false, 429, ``, "provider outcome unknown"},
		{"500", false, 500, ``, "provider outcome unknown"},
		{"503", false, 503, ``, "provider outcome unknown"},
		{"404 on a charge", false, 404, ``, "provider outcome unknown"},
		{"inquiry found", true, 200, `{"id":"ch_1","reference":"r","status":"succeeded"}`, "succeeded"},
		{"an answer about another reference", false, 201, `{"id":"ch_1","reference":"other","status":"succeeded"}`, "provider outcome unknown"},
		{"inquiry found declined", true, 200, `{"id":"ch_1","reference":"r","status":"declined"}`, "declined"},
		{"inquiry not found", true, 404, ``, provider.ErrNotFound.Error()},
		{"inquiry unsupported", true, 501, ``, provider.ErrInquiryUnsupported.Error()},
		{"inquiry garbage", true, 200, `not json`, "provider outcome unknown"},
		{"inquiry 409", true, 409, `{}`, "provider outcome unknown"},
		{"inquiry 503", true, 503, ``, "provider outcome unknown"},
		{"a long error body is cut short", false, 503, long, "(5000 bytes)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			c := provider.New(srv.URL, 5*time.Second)
			var ch provider.Charge
			var err error
			if tc.inquiry {
				ch, err = c.Inquire(context.Background(), "r")
			} else {
				ch, err = c.Charge(context.Background(), "k", provider.ChargeRequest{Reference: "r", AmountMinor: 1, Currency: "EUR"})
			}
			if err != nil {
				require.Contains(t, err.Error(), tc.want)
				require.Less(t, len(err.Error()), 400, "the error carries at most an excerpt of the body")
				return
			}
			require.Equal(t, tc.want, ch.Status)
		})
	}
}

// A connection closed without an answer is ambiguous, never a decline.
func TestDroppedConnectionIsAmbiguous(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		conn, _, err := w.(http.Hijacker).Hijack()
		require.NoError(t, err)
		_ = conn.Close()
	}))
	defer srv.Close()
	_, err := provider.New(srv.URL, 5*time.Second).Charge(context.Background(), "k", provider.ChargeRequest{Reference: "r"})
	require.ErrorIs(t, err, provider.ErrAmbiguous)
}

// A redirect is no answer from the bank: kasa does not follow it, so that whatever the other
// address says (a 404 read as "no such charge", a re-sent POST) never decides an operation.
func TestRedirectIsAmbiguous(t *testing.T) {
	for _, code := range []int{301, 302, 303, 307, 308} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			var moved int
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/elsewhere" {
					moved++
					http.NotFound(w, r)
					return
				}
				http.Redirect(w, r, "/elsewhere", code)
			}))
			defer srv.Close()
			c := provider.New(srv.URL, 5*time.Second)
			_, err := c.Inquire(context.Background(), "r")
			require.ErrorIs(t, err, provider.ErrAmbiguous)
			_, err = c.Charge(context.Background(), "k", provider.ChargeRequest{Reference: "r", AmountMinor: 1, Currency: "EUR"})
			require.ErrorIs(t, err, provider.ErrAmbiguous)
			_, err = c.InquireRefund(context.Background(), "r")
			require.ErrorIs(t, err, provider.ErrAmbiguous)
			_, err = c.InquireAuthorization(context.Background(), "r")
			require.ErrorIs(t, err, provider.ErrAmbiguous)
			require.Zero(t, moved, "the redirect is not followed")
		})
	}
}

// An answer longer than kasa reads is not read in part: the start of a body that is not JSON as a
// whole (here a decline, then garbage past the limit) decides nothing.
func TestOversizedAnswerIsAmbiguous(t *testing.T) {
	answer := `{"id":"ch_1","reference":"r","status":"declined"}` + strings.Repeat(" ", 1<<20) + "garbage"
	for _, tc := range []struct {
		name   string
		status int
		call   func(c *provider.Client) error
	}{
		{"charge", 201, func(c *provider.Client) error {
			_, err := c.Charge(context.Background(), "k", provider.ChargeRequest{Reference: "r", AmountMinor: 1, Currency: "EUR"})
			return err
		}},
		{"inquiry", 200, func(c *provider.Client) error { _, err := c.Inquire(context.Background(), "r"); return err }},
		{"inquiry 404", 404, func(c *provider.Client) error { _, err := c.Inquire(context.Background(), "r"); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(answer))
			}))
			defer srv.Close()
			err := tc.call(provider.New(srv.URL, 5*time.Second))
			require.ErrorIs(t, err, provider.ErrAmbiguous)
			require.Less(t, len(err.Error()), 400, "the error carries at most an excerpt of the body")
		})
	}
}

// A definite answer that names other money than the call asked for (another amount or currency)
// is no answer about it: posting what was asked would put in the ledger what the bank did not
// do. An answer that names no money is read by its reference alone.
func TestAnswerNamingOtherMoneyIsAmbiguous(t *testing.T) {
	ctx := context.Background()
	calls := map[string]func(c *provider.Client) (string, error){
		"charge": func(c *provider.Client) (string, error) {
			r, err := c.Charge(ctx, "k", provider.ChargeRequest{Reference: "r", AmountMinor: 1000, Currency: "TRY"})
			return r.Status, err
		},
		"refund": func(c *provider.Client) (string, error) {
			r, err := c.Refund(ctx, "k", provider.RefundRequest{Reference: "r", ChargeReference: "p", AmountMinor: 1000, Currency: "TRY"})
			return r.Status, err
		},
		"authorize": func(c *provider.Client) (string, error) {
			r, err := c.Authorize(ctx, "k", provider.ChargeRequest{Reference: "r", AmountMinor: 1000, Currency: "TRY"})
			return r.Status, err
		},
		"capture": func(c *provider.Client) (string, error) {
			r, err := c.Capture(ctx, "k", "r", 1000)
			return r.Status, err
		},
	}
	for _, tc := range []struct {
		name, money string
		calls       []string
		ambiguous   bool
	}{
		{"the money asked", `"amount_minor":1000,"currency":"TRY"`, []string{"charge", "refund", "authorize", "capture"}, false},
		{"no money named", `"id":"x"`, []string{"charge", "refund", "authorize", "capture"}, false},
		{"another amount", `"amount_minor":100,"currency":"TRY"`, []string{"charge", "refund", "authorize", "capture"}, true},
		{"another currency", `"amount_minor":1000,"currency":"EUR"`, []string{"charge", "refund", "authorize"}, true},
	} {
		for _, status := range []string{"succeeded", "declined"} {
			for _, name := range tc.calls {
				t.Run(fmt.Sprintf("%s/%s/%s", tc.name, status, name), func(t *testing.T) {
					body := fmt.Sprintf(`{"reference":"r","authorization_id":"r","status":%q,%s}`, status, tc.money)
					srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
						w.WriteHeader(http.StatusCreated)
						_, _ = w.Write([]byte(body))
					}))
					defer srv.Close()
					got, err := calls[name](provider.New(srv.URL, 5*time.Second))
					if tc.ambiguous {
						require.ErrorIs(t, err, provider.ErrAmbiguous)
						return
					}
					require.NoError(t, err)
					require.Equal(t, status, got)
				})
			}
		}
	}
}
