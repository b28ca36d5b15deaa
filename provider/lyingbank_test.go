package provider_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/provider"
)

// lie is one call kasa makes and how to read its answer: the status, or an error.
type lie struct {
	name    string
	inquiry bool
	send    func(c *provider.Client) (string, error)
}

var lyingCalls = []lie{
	{"charge", false, func(c *provider.Client) (string, error) {
		r, err := c.Charge(context.Background(), "r", provider.ChargeRequest{Reference: "r", AmountMinor: 1000, Currency: "TRY"})
		return r.Status, err
	}},
	{"refund", false, func(c *provider.Client) (string, error) {
		r, err := c.Refund(context.Background(), "r", provider.RefundRequest{Reference: "r", ChargeReference: "p", AmountMinor: 1000, Currency: "TRY"})
		return r.Status, err
	}},
	{"authorize", false, func(c *provider.Client) (string, error) {
		r, err := c.Authorize(context.Background(), "r", provider.ChargeRequest{Reference: "r", AmountMinor: 1000, Currency: "TRY"})
		return r.Status, err
	}},
	{"capture", false, func(c *provider.Client) (string, error) {
		r, err := c.Capture(context.Background(), "k", "r", 1000)
		return r.Status, err
	}},
	{"void", false, func(c *provider.Client) (string, error) {
		r, err := c.Void(context.Background(), "k", "r")
		return r.Status, err
	}},
	{"inquire charge", true, func(c *provider.Client) (string, error) {
		r, err := c.Inquire(context.Background(), "r")
		return r.Status, err
	}},
	{"inquire refund", true, func(c *provider.Client) (string, error) {
		r, err := c.InquireRefund(context.Background(), "r")
		return r.Status, err
	}},
	{"inquire authorization", true, func(c *provider.Client) (string, error) {
		r, err := c.InquireAuthorization(context.Background(), "r")
		return r.Status, err
	}},
}

// A bank whose answers do not add up, for every call: only one answer that says one thing about
// the operation asked decides it; every other is ambiguous. ok is the honest status code
// (201 to a send, 200 to an inquiry); 0 in a case means it.
func TestLyingBankAnswers(t *testing.T) {
	const head = `"id":"x_1","reference":"r","authorization_id":"r"`
	for _, tc := range []struct {
		name   string
		status int
		body   string
		want   string // the status read, or "ambiguous"
		money  bool   // about the money named: only the sends that name some check it here
	}{
		{"honest", 0, `{` + head + `,"status":"succeeded"}`, "succeeded", false},
		{"unknown fields are ignored", 0, `{` + head + `,"status":"declined","risk":{"score":0.3,"status":"succeeded"},"extra":[1,2]}`, "declined", false},
		{"the status twice, succeeded last", 0, `{` + head + `,"status":"declined","status":"succeeded"}`, "ambiguous", false},
		{"the status twice, declined last", 0, `{` + head + `,"status":"succeeded","status":"declined"}`, "ambiguous", false},
		{"the status twice in other case", 0, `{` + head + `,"status":"declined","Status":"succeeded"}`, "ambiguous", false},
		{"the status twice, folded", 0, `{` + head + `,"status":"declined","ſtatus":"succeeded"}`, "ambiguous", false},
		{"the reference twice", 0, `{"id":"x","reference":"other","authorization_id":"other","reference":"r","authorization_id":"r","status":"succeeded"}`, "ambiguous", false},
		{"the amount twice", 0, `{` + head + `,"amount_minor":5000,"amount_minor":1000,"status":"succeeded"}`, "ambiguous", false},
		{"the same field twice with the same value", 0, `{` + head + `,"status":"succeeded","status":"succeeded"}`, "succeeded", false},
		{"a zero amount", 0, `{` + head + `,"amount_minor":0,"currency":"TRY","status":"succeeded"}`, "ambiguous", false},
		{"no money, as null", 0, `{` + head + `,"amount_minor":null,"currency":null,"status":"succeeded"}`, "succeeded", false},
		{"an id longer than a settlement file's", 0, `{"id":"` + strings.Repeat("x", 256) + `","reference":"r","authorization_id":"r","status":"succeeded"}`, "ambiguous", false},
		{"an id as long as a settlement file's", 0, `{"id":"` + strings.Repeat("x", 255) + `","reference":"r","authorization_id":"r","status":"succeeded"}`, "succeeded", false},
		{"a status in capitals", 0, `{` + head + `,"status":"SUCCEEDED"}`, "ambiguous", false},
		{"a status kasa does not know", 0, `{` + head + `,"status":"pending_review"}`, "ambiguous", false},
		{"an empty body", 0, ``, "ambiguous", false},
		{"null", 0, `null`, "ambiguous", false},
		{"an empty object", 0, `{}`, "ambiguous", false},
		{"a truncated body", 0, `{` + head + `,"status":"succ`, "ambiguous", false},
		{"two answers", 0, `{` + head + `,"status":"declined"}{` + head + `,"status":"succeeded"}`, "ambiguous", false},
		{"an array", 0, `[{` + head + `,"status":"succeeded"}]`, "ambiguous", false},
		{"an amount as a string", 0, `{` + head + `,"amount_minor":"1000","status":"succeeded"}`, "ambiguous", true},
		{"a negative amount", 0, `{` + head + `,"amount_minor":-1000,"status":"succeeded"}`, "ambiguous", true},
		{"202", 202, `{` + head + `,"status":"succeeded"}`, "ambiguous", false},
		{"204", 204, ``, "ambiguous", false},
		{"206", 206, `{` + head + `,"status":"succeeded"}`, "ambiguous", false},
	} {
		for _, cl := range lyingCalls {
			if tc.money && (cl.inquiry || cl.name == "void") {
				continue // an inquiry's caller checks the money (activities); a void names none
			}
			t.Run(tc.name+"/"+cl.name, func(t *testing.T) {
				status := tc.status
				if status == 0 {
					status = map[bool]int{false: http.StatusCreated, true: http.StatusOK}[cl.inquiry]
				}
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
					w.WriteHeader(status)
					_, _ = w.Write([]byte(tc.body))
				}))
				defer srv.Close()
				got, err := cl.send(provider.New(srv.URL, 5*time.Second))
				if tc.want == "ambiguous" {
					require.ErrorIs(t, err, provider.ErrAmbiguous, "read as %q", got)
					require.Less(t, len(err.Error()), 400)
					return
				}
				require.NoError(t, err)
				require.Equal(t, tc.want, got)
			})
		}
	}
}

// The other status code of the pair (200 to a send, 201 to an inquiry), a body cut short by the
// connection, and an answer after the timeout: none decides.
func TestLyingBankTransport(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler func(cl lie) http.HandlerFunc
	}{
		{"the other 2xx", func(cl lie) http.HandlerFunc {
			return func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(map[bool]int{false: http.StatusOK, true: http.StatusCreated}[cl.inquiry])
				_, _ = w.Write([]byte(`{"id":"x","reference":"r","authorization_id":"r","status":"succeeded"}`))
			}
		}},
		{"a body shorter than its length", func(lie) http.HandlerFunc {
			return func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Length", "500")
				w.WriteHeader(map[bool]int{false: http.StatusCreated, true: http.StatusOK}[false])
				_, _ = w.Write([]byte(`{"id":"x","reference":"r","authorization_id":"r","status":"declined"}`))
			}
		}},
		{"an answer after the timeout", func(cl lie) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) {
				time.Sleep(300 * time.Millisecond)
				w.WriteHeader(map[bool]int{false: http.StatusCreated, true: http.StatusOK}[cl.inquiry])
				_, _ = w.Write([]byte(`{"id":"x","reference":"r","authorization_id":"r","status":"declined"}`))
			}
		}},
		{"a huge body", func(cl lie) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(map[bool]int{false: http.StatusCreated, true: http.StatusOK}[cl.inquiry])
				_, _ = w.Write([]byte(`{"id":"x","reference":"r","authorization_id":"r","status":"declined","pad":"` + strings.Repeat("x", 2<<20) + `"}`))
			}
		}},
	} {
		for _, cl := range lyingCalls {
			t.Run(tc.name+"/"+cl.name, func(t *testing.T) {
				srv := httptest.NewServer(tc.handler(cl))
				defer srv.Close()
				got, err := cl.send(provider.New(srv.URL, 100*time.Millisecond))
				require.ErrorIs(t, err, provider.ErrAmbiguous, "read as %q", got)
			})
		}
	}
}

// An inquiry answered 404 says the bank has no such record, unless its body is one: a 404 that
// names the operation's status contradicts itself, and is no "not found" that would let a
// charge be sent again.
func TestLyingBankNotFound(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       error
	}{
		{"not found", `{"error":"not found"}`, provider.ErrNotFound},
		{"no body", ``, provider.ErrNotFound},
		{"a page", `<html>Not Found</html>`, provider.ErrNotFound},
		{"an error status", `{"status":"error","message":"no such reference"}`, provider.ErrNotFound},
		{"a record that succeeded", `{"id":"x_1","reference":"r","status":"succeeded","state":"captured"}`, provider.ErrAmbiguous},
		{"a record that declined", `{"id":"x_1","reference":"r","status":"declined"}`, provider.ErrAmbiguous},
	} {
		for _, cl := range lyingCalls {
			if !cl.inquiry {
				continue
			}
			t.Run(tc.name+"/"+cl.name, func(t *testing.T) {
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
					w.WriteHeader(http.StatusNotFound)
					_, _ = w.Write([]byte(tc.body))
				}))
				defer srv.Close()
				_, err := cl.send(provider.New(srv.URL, 5*time.Second))
				require.ErrorIs(t, err, tc.want)
			})
		}
	}
}
