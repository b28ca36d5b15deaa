package provider_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/provider"
	"github.com/kasa-pay/kasa/tools/banksim"
)

// call is one of the authorization calls as a test sends it: what it asked (path, key, body)
// must be what the provider sees, and its answer's status is what it returns.
type call struct {
	name, path, key, body string
	send                  func(c *provider.Client) (status string, succeeded bool, err error)
}

var (
	authorizeCall = call{"authorize", "/v1/authorizations", "pay/1",
		`{"reference":"pay/1","amount_minor":100,"currency":"TRY","account_id":"acc"}`,
		func(c *provider.Client) (string, bool, error) {
			a, err := c.Authorize(context.Background(), "pay/1", provider.ChargeRequest{Reference: "pay/1", AmountMinor: 100, Currency: "TRY", AccountID: "acc"})
			return a.Status, a.Succeeded(), err
		}}
	captureCall = call{"capture", "/v1/authorizations/au%2F1%3F/capture", "cp-1", `{"amount_minor":60}`,
		func(c *provider.Client) (string, bool, error) {
			r, err := c.Capture(context.Background(), "cp-1", "au/1?", 60)
			return r.Status, r.Succeeded(), err
		}}
	voidCall = call{"void", "/v1/authorizations/au%2F1%3F/void", "vd-1", `{}`,
		func(c *provider.Client) (string, bool, error) {
			r, err := c.Void(context.Background(), "vd-1", "au/1?")
			return r.Status, r.Succeeded(), err
		}}
	inquireCall = call{"inquire", "/v1/authorizations?reference=pay%2F1", "", "",
		func(c *provider.Client) (string, bool, error) {
			a, err := c.InquireAuthorization(context.Background(), "pay/1")
			return a.Status, a.Succeeded(), err
		}}
)

// Authorization, capture and void answers are classified as charges are: only one with a known
// status decides; a 404 or 501 means something only to an inquiry.
func TestAuthorizationAnswersClassified(t *testing.T) {
	posts := []call{authorizeCall, captureCall, voidCall}
	for _, tc := range []struct {
		name   string
		calls  []call
		status int
		body   string
		want   string // the answer's status, or the error
	}{
		{"succeeded", posts, 201, `{"id":"x_1","reference":"pay/1","authorization_id":"au/1?","status":"succeeded"}`, "succeeded"},
		{"declined", posts, 201, `{"id":"x_1","reference":"pay/1","authorization_id":"au/1?","status":"declined"}`, "declined"},
		{"an answer about another reference", posts, 201, `{"id":"x_1","reference":"pay/2","authorization_id":"au/2","status":"succeeded"}`, "provider outcome unknown"},
		{"201 without a status", posts, 201, `{"id":"x_1"}`, "provider outcome unknown"},
		{"201 with an unknown status", posts, 201, `{"id":"x_1","status":"pending"}`, "provider outcome unknown"},
		{"200 garbage", posts, 200, `{"id":"x_1","sta`, "provider outcome unknown"},
		{"409 in progress", posts, 409, `{"error":"a request with this key is in progress"}`, "provider outcome unknown"},
		{"422", posts, 422, `{}`, "provider outcome unknown"},
		{"429", posts, 429, ``, "provider outcome unknown"},
		{"500", posts, 500, ``, "provider outcome unknown"},
		{"404", posts, 404, `{"error":"no such authorization"}`, "provider outcome unknown"},
		{"501", posts, 501, ``, "provider outcome unknown"},
		{"a long error body is cut short", posts, 503, strings.Repeat("x", 5000), "(5000 bytes)"},
		{"inquiry found", []call{inquireCall}, 200, `{"id":"au_1","reference":"pay/1","status":"succeeded","state":"captured"}`, "succeeded"},
		{"inquiry found declined", []call{inquireCall}, 200, `{"id":"au_1","reference":"pay/1","status":"declined"}`, "declined"},
		{"inquiry about another reference", []call{inquireCall}, 200, `{"id":"au_2","reference":"pay/2","status":"succeeded"}`, "provider outcome unknown"},
		{"inquiry not found", []call{inquireCall}, 404, ``, provider.ErrNotFound.Error()},
		{"inquiry unsupported", []call{inquireCall}, 501, ``, provider.ErrInquiryUnsupported.Error()},
		{"inquiry garbage", []call{inquireCall}, 200, `not json`, "provider outcome unknown"},
		{"inquiry 503", []call{inquireCall}, 503, ``, "provider outcome unknown"},
	} {
		for _, cl := range tc.calls {
			t.Run(tc.name+"/"+cl.name, func(t *testing.T) {
				var path, key, body string
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					b, _ := io.ReadAll(r.Body)
					path, key, body = r.URL.RequestURI(), r.Header.Get("Idempotency-Key"), string(b)
					w.WriteHeader(tc.status)
					_, _ = w.Write([]byte(tc.body))
				}))
				defer srv.Close()
				status, succeeded, err := cl.send(provider.New(srv.URL, 5*time.Second))
				require.Equal(t, cl.path, path, "the id is one escaped path segment")
				require.Equal(t, cl.key, key)
				if cl.body != "" {
					require.JSONEq(t, cl.body, body)
				}
				if err != nil {
					require.Contains(t, err.Error(), tc.want)
					require.Less(t, len(err.Error()), 400, "the error carries at most an excerpt of the body")
					return
				}
				require.Equal(t, tc.want, status)
				require.Equal(t, tc.want == provider.StatusSucceeded, succeeded)
			})
		}
	}
}

func (b bank) held(t *testing.T, ref string) banksim.Held {
	t.Helper()
	h, err := banksim.Control{URL: b.url}.Authorizations(context.Background(), ref)
	require.NoError(t, err)
	return h
}

// The client against the simulator, for every capability: a hold, its inquiry, a partial
// capture, the declines, and every fault on each call read as ambiguous (never as a decline).
func TestAuthorizationAgainstSimulator(t *testing.T) {
	for _, c := range []banksim.Capability{banksim.CapabilityIdempotent, banksim.CapabilityInquiry, banksim.CapabilityNone} {
		t.Run(string(c), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := startBank(t, c)
			authorize := func(ref string) provider.Authorization {
				a, err := b.client.Authorize(ctx, ref, provider.ChargeRequest{Reference: ref, AmountMinor: 10000, Currency: "TRY", AccountID: "acc"})
				require.NoError(t, err)
				require.True(t, a.Succeeded())
				return a
			}

			a := authorize("pay-1")
			require.Equal(t, provider.Authorization{ID: a.ID, Reference: "pay-1", AmountMinor: 10000, Currency: "TRY",
				Status: provider.StatusSucceeded, State: "authorized"}, a)
			over, err := b.client.Capture(ctx, "cp-0", a.ID, 10001)
			require.NoError(t, err, "a decline is an answer, not an error")
			require.False(t, over.Succeeded())
			cp, err := b.client.Capture(ctx, "cp-1", a.ID, 6000)
			require.NoError(t, err)
			require.Equal(t, provider.CaptureResult{ID: cp.ID, AuthorizationID: a.ID, Reference: "pay-1",
				AmountMinor: 6000, Status: provider.StatusSucceeded}, cp)
			vd, err := b.client.Void(ctx, "vd-1", a.ID)
			require.NoError(t, err)
			require.Equal(t, provider.StatusDeclined, vd.Status, "captured: nothing to void")
			require.Equal(t, banksim.Held{Count: 1, CapturedMinor: 6000}, b.held(t, "pay-1"))

			found, err := b.client.InquireAuthorization(ctx, "pay-1")
			_, missing := b.client.InquireAuthorization(ctx, "pay-none")
			if c == banksim.CapabilityNone {
				require.ErrorIs(t, err, provider.ErrInquiryUnsupported)
				require.ErrorIs(t, missing, provider.ErrInquiryUnsupported)
			} else {
				require.NoError(t, err)
				require.Equal(t, "captured", found.State)
				require.Equal(t, int64(6000), found.CapturedMinor)
				require.ErrorIs(t, missing, provider.ErrNotFound)
			}

			v := authorize("pay-2")
			vd, err = b.client.Void(ctx, "vd-2", v.ID)
			require.NoError(t, err)
			require.Equal(t, provider.VoidResult{ID: vd.ID, AuthorizationID: v.ID, Reference: "pay-2", Status: provider.StatusSucceeded}, vd)
			require.True(t, b.held(t, "pay-2").Voided)

			_, err = b.client.Capture(ctx, "cp-x", "au/unknown", 1)
			require.ErrorIs(t, err, provider.ErrAmbiguous, "a 404 on a POST decides nothing")

			one := 1
			open := authorize("pay-3")
			fast := provider.New(b.url, 300*time.Millisecond) // a hang costs its timeout
			for i, action := range []string{"drop_response", "error_500", "late_booking", "error_409", "error_503", "error_429", "garbage", "hang"} {
				for _, on := range []string{"authorize", "capture", "void"} {
					key := fmt.Sprintf("%s-fault-%d", on, i)
					b.faults(t, banksim.Rule{On: on, Action: action, DelayMS: 50, Count: &one})
					switch on {
					case "authorize":
						_, err = fast.Authorize(ctx, key, provider.ChargeRequest{Reference: key, AmountMinor: 1, Currency: "TRY", AccountID: "acc"})
					case "capture":
						_, err = fast.Capture(ctx, key, open.ID, 1)
					case "void":
						_, err = fast.Void(ctx, key, open.ID)
					}
					require.ErrorIs(t, err, provider.ErrAmbiguous, "%s on %s", action, on)
				}
			}

			b.faults(t, banksim.Rule{On: "authorize", Action: "decline", Count: &one})
			dec, err := b.client.Authorize(ctx, "pay-dec", provider.ChargeRequest{Reference: "pay-dec", AmountMinor: 1, Currency: "TRY", AccountID: "acc"})
			require.NoError(t, err)
			require.Equal(t, provider.StatusDeclined, dec.Status)
			require.Equal(t, "declined", dec.State)
			require.Equal(t, 0, b.held(t, "pay-dec").Count)
		})
	}
}
