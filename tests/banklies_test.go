package tests

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/workflows"
)

// A bank whose answer to a charge names its status twice: the simulator's "succeeded" (it
// charged), then "declined". kasa cannot tell which one the bank meant, so it never fails the
// payment (releasing the hold of money the bank took): it parks it unknown (none) or asks
// (inquiry), whose answer says the charge was made.
func TestChargeAnswerNamingItsStatusTwiceIsNoDecline(t *testing.T) {
	t.Parallel()
	statusTwice := func(sim http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodPost || r.URL.Path != "/v1/charges" {
				sim.ServeHTTP(w, r)
				return
			}
			rec := httptest.NewRecorder()
			sim.ServeHTTP(rec, r)
			body := bytes.TrimSpace(rec.Body.Bytes())
			if rec.Code == http.StatusCreated && bytes.HasSuffix(body, []byte("}")) {
				body = append(body[:len(body)-1], `,"status":"declined"}`...)
			}
			w.WriteHeader(rec.Code)
			_, _ = w.Write(body)
		})
	}
	for _, c := range []struct {
		capability workflows.Capability
		status     string
	}{
		{workflows.CapabilityNone, "unknown"},
		{workflows.CapabilityInquiry, "succeeded"},
	} {
		t.Run(string(c.capability), func(t *testing.T) {
			t.Parallel()
			s := newStackWith(t, stackOptions{capability: c.capability, temporal: tc, bookingWindow: 3 * time.Second, bank: statusTwice})
			m := s.newMerchant()
			acct := s.newAccount(m, "TRY", "100.00")
			id := s.pay(m, "key-1", payBody("inv-1", "40.00", "TRY", acct)).json(t)["id"].(string)
			require.Eventually(t, func() bool { return paymentByKey(t, m, "key-1").Status != "processing" }, 30*time.Second, 100*time.Millisecond)
			require.Equal(t, c.status, string(paymentByKey(t, m, "key-1").Status))
			require.Equal(t, 1, s.simCount(id), "the bank charged once")
			a := s.account(m, acct)
			if c.status == "succeeded" {
				require.Equal(t, "60.00", a["balance"])
				require.Equal(t, "0.00", a["reserved"])
			} else {
				require.Equal(t, "100.00", a["balance"])
				require.Equal(t, "40.00", a["reserved"], "an unknown payment keeps its hold")
			}
			requireVerified(t)
		})
	}
}

// An operator settles a manual payment whose authorization got no answer as charged, with the
// id of another payment's authorization (mistyped). The bank captures that authorization and
// answers about the other payment: kasa posts nothing for this one from that answer, and keeps
// its hold (unknown) until someone finds out what the bank did.
func TestCaptureAnsweredAboutAnotherPaymentIsNoCapture(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	other, _, _ := s.authorize(m, "auth-other", "40.00", "100.00")
	payer := s.newAccount(m, "TRY", "100.00")
	id := s.authorizeUnknown(m, "auth-lost", payer)

	mistyped := s.held(other).Live[0]
	status, err := workflows.Starter{Client: tc}.Settle(context.Background(), workflows.PaymentWorkflowID(mustUUID(t, m.ID), "auth-lost"),
		workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: mistyped, OperationID: mustUUID(t, id), Note: "bank ticket 1"})
	require.NoError(t, err)
	require.Equal(t, string(payment.StatusRequiresCapture), status)

	r := s.command(m, id, "capture", "auth-lost-capture", `{"amount":"25.00"}`)
	require.Equal(t, int64(2500), s.held(other).CapturedMinor, "the bank captured the other payment's authorization")
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	require.Equal(t, "unknown", r.json(t)["status"])
	require.Equal(t, int64(2500), reserved(t, payer), "the hold is kept")
	require.Equal(t, int64(10000), balance(t, payer), "nothing posted")
	requireVerified(t)
}
