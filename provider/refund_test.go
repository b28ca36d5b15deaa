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
	"github.com/kasa-pay/kasa/tools/banksim"
)

// Refund answers are classified as charges are: only a refund with a known status decides.
func TestRefundAnswersClassified(t *testing.T) {
	for _, tc := range []struct {
		name    string
		inquiry bool
		status  int
		body    string
		want    string // the refund status, or the error
	}{
		{"refunded", false, 201, `{"id":"rf_1","reference":"r","status":"succeeded"}`, "succeeded"},
		{"declined", false, 201, `{"id":"rf_1","reference":"r","status":"declined"}`, "declined"},
		{"201 without a status", false, 201, `{"id":"rf_1"}`, "provider outcome unknown"},
		{"201 with an unknown status", false, 201, `{"id":"rf_1","status":"pending"}`, "provider outcome unknown"},
		{"200 garbage", false, 200, `{"id":"rf_1","sta`, "provider outcome unknown"},
		{"409 in progress", false, 409, `{"error":"a request with this key is in progress"}`, "provider outcome unknown"},
		{"422", false, 422, `{}`, "provider outcome unknown"},
		{"429", false, 429, ``, "provider outcome unknown"},
		{"500", false, 500, ``, "provider outcome unknown"},
		{"404 on a refund", false, 404, ``, "provider outcome unknown"},
		{"501 on a refund", false, 501, ``, "provider outcome unknown"},
		{"inquiry found", true, 200, `{"id":"rf_1","reference":"r/1","status":"succeeded"}`, "succeeded"},
		{"an answer about another reference", false, 201, `{"id":"rf_1","reference":"other","status":"succeeded"}`, "provider outcome unknown"},
		{"inquiry found declined", true, 200, `{"id":"rf_1","reference":"r/1","status":"declined"}`, "declined"},
		{"inquiry not found", true, 404, ``, provider.ErrNotFound.Error()},
		{"inquiry unsupported", true, 501, ``, provider.ErrInquiryUnsupported.Error()},
		{"inquiry garbage", true, 200, `not json`, "provider outcome unknown"},
		{"inquiry 503", true, 503, ``, "provider outcome unknown"},
		{"a long error body is cut short", false, 503, strings.Repeat("x", 5000), "(5000 bytes)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got *http.Request
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got = r
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			c := provider.New(srv.URL, 5*time.Second)
			var rf provider.Refund
			var err error
			if tc.inquiry {
				rf, err = c.InquireRefund(context.Background(), "r/1")
				require.Equal(t, "/v1/refunds", got.URL.Path)
				require.Equal(t, "r/1", got.URL.Query().Get("reference"))
			} else {
				rf, err = c.Refund(context.Background(), "k", provider.RefundRequest{Reference: "r", ChargeReference: "p", AmountMinor: 1, Currency: "EUR"})
				require.Equal(t, "/v1/refunds", got.URL.Path)
				require.Equal(t, "k", got.Header.Get("Idempotency-Key"))
			}
			if err != nil {
				require.Contains(t, err.Error(), tc.want)
				require.Less(t, len(err.Error()), 400, "the error carries at most an excerpt of the body")
				return
			}
			require.Equal(t, tc.want, rf.Status)
			require.Equal(t, tc.want == provider.StatusSucceeded, rf.Succeeded())
		})
	}
}

type bank struct {
	url    string
	client *provider.Client
}

func startBank(t *testing.T, c banksim.Capability) bank {
	t.Helper()
	sim, err := banksim.New(banksim.Options{DataDir: t.TempDir(), Capability: c})
	require.NoError(t, err)
	srv := httptest.NewServer(sim.Handler())
	t.Cleanup(func() { srv.Close(); _ = sim.Close() })
	return bank{url: srv.URL, client: provider.New(srv.URL, 2*time.Second)}
}

func (b bank) refunds(t *testing.T, ref string) int {
	t.Helper()
	m, err := banksim.Control{URL: b.url}.Refunds(context.Background(), ref)
	require.NoError(t, err)
	return m.Count
}

func (b bank) faults(t *testing.T, rules ...banksim.Rule) {
	t.Helper()
	require.NoError(t, banksim.Control{URL: b.url}.SetFaults(context.Background(), rules...))
}

// The client against the simulator, for every capability: refunds, declines above the charge,
// inquiries, and every fault on a refund read as ambiguous (never as a decline).
func TestRefundAgainstSimulator(t *testing.T) {
	for _, c := range []banksim.Capability{banksim.CapabilityIdempotent, banksim.CapabilityInquiry, banksim.CapabilityNone} {
		t.Run(string(c), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := startBank(t, c)
			ch, err := b.client.Charge(ctx, "pay-1", provider.ChargeRequest{Reference: "pay-1", AmountMinor: 10000, Currency: "TRY", AccountID: "acc"})
			require.NoError(t, err)
			require.True(t, ch.Succeeded())

			req := provider.RefundRequest{Reference: "rf-1", ChargeReference: "pay-1", AmountMinor: 3000, Currency: "TRY"}
			rf, err := b.client.Refund(ctx, "rf-1", req)
			require.NoError(t, err)
			require.True(t, rf.Succeeded())
			require.Equal(t, "rf-1", rf.Reference)
			require.NotEmpty(t, rf.ID)
			require.Equal(t, 1, b.refunds(t, "rf-1"))

			over, err := b.client.Refund(ctx, "rf-2", provider.RefundRequest{Reference: "rf-2", ChargeReference: "pay-1", AmountMinor: 7001, Currency: "TRY"})
			require.NoError(t, err, "a decline is an answer, not an error")
			require.Equal(t, provider.StatusDeclined, over.Status)
			require.False(t, over.Succeeded())
			require.Equal(t, 0, b.refunds(t, "rf-2"))

			found, err := b.client.InquireRefund(ctx, "rf-1")
			_, missing := b.client.InquireRefund(ctx, "rf-none")
			if c == banksim.CapabilityNone {
				require.ErrorIs(t, err, provider.ErrInquiryUnsupported)
				require.ErrorIs(t, missing, provider.ErrInquiryUnsupported)
			} else {
				require.NoError(t, err)
				require.Equal(t, rf, found)
				require.ErrorIs(t, missing, provider.ErrNotFound)
			}

			one := 1
			for i, action := range []string{"drop_response", "error_500", "late_booking", "error_409", "error_503", "error_429", "garbage", "hang"} {
				key := fmt.Sprintf("rf-fault-%d", i)
				b.faults(t, banksim.Rule{On: "refund", Action: action, DelayMS: 50, Count: &one})
				_, err := b.client.Refund(ctx, key, provider.RefundRequest{Reference: key, ChargeReference: "pay-1", AmountMinor: 1, Currency: "TRY"})
				require.ErrorIs(t, err, provider.ErrAmbiguous, action)
			}

			b.faults(t, banksim.Rule{On: "refund", Action: "decline", Count: &one})
			dec, err := b.client.Refund(ctx, "rf-dec", provider.RefundRequest{Reference: "rf-dec", ChargeReference: "pay-1", AmountMinor: 1, Currency: "TRY"})
			require.NoError(t, err)
			require.Equal(t, provider.StatusDeclined, dec.Status)
			require.Equal(t, 0, b.refunds(t, "rf-dec"))
		})
	}
}
