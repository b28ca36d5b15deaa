package tests

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/workflows"
)

func TestPaymentEndToEnd(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "2000.00")

	r := s.pay(m, "key-1", payBody("45982", "1000.00", "TRY", acct))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	p := r.json(t)
	id := p["id"].(string)
	require.Equal(t, "succeeded", p["status"])
	require.Equal(t, "1000.00", p["amount"])
	require.Equal(t, "/v1/payments/"+id, r.Header.Get("Location"))
	require.NotNil(t, p["provider_reference"])

	// Exactly one money movement at the bank, under the operation id.
	require.Equal(t, 1, s.simCount(id))

	// One balanced posting: payer -1000.00, merchant settlement +1000.00.
	entries, err := db.LedgerEntries(context.Background(), id)
	require.NoError(t, err)
	require.Len(t, entries, 2)
	require.Equal(t, entries[0].PostingID, entries[1].PostingID)
	require.Equal(t, "payment", entries[0].Kind)
	require.Equal(t, int64(0), entries[0].AmountMinor+entries[1].AmountMinor)
	var payerEntry, settlementEntry = entries[0], entries[1]
	if payerEntry.AmountMinor > 0 {
		payerEntry, settlementEntry = settlementEntry, payerEntry
	}
	require.Equal(t, acct, payerEntry.AccountID.String())
	require.Equal(t, int64(-100000), payerEntry.AmountMinor)
	settlement, err := db.Account(context.Background(), settlementEntry.AccountID)
	require.NoError(t, err)
	require.Equal(t, "settlement", settlement.Kind)
	require.Equal(t, m.ID, settlement.MerchantID.String())
	require.Equal(t, int64(100000), settlement.Balance)

	a := s.account(m, acct)
	require.Equal(t, "1000.00", a["balance"])
	require.Equal(t, "0.00", a["reserved"])
	require.Equal(t, "1000.00", a["available"])

	// The same request again is a byte-identical replay, and moves nothing.
	again := s.pay(m, "key-1", payBody("45982", "1000", "try", acct))
	require.Equal(t, http.StatusCreated, again.Status)
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	require.Equal(t, string(r.Body), string(again.Body))
	require.Equal(t, 1, s.simCount(id))

	got := s.do("GET", "/v1/payments/"+id, m.APIKey, "")
	require.Equal(t, http.StatusOK, got.Status)
	require.Equal(t, "succeeded", got.json(t)["status"])
	byKey := s.do("GET", "/v1/payments?idempotency_key=key-1", m.APIKey, "")
	require.Equal(t, http.StatusOK, byKey.Status)
	require.Equal(t, id, byKey.json(t)["id"])
	requireVerified(t)
}

func TestInsufficientFunds(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "500.00")

	r := s.pay(m, "key-1", payBody("inv-1", "500.01", "TRY", acct))
	require.Equal(t, http.StatusPaymentRequired, r.Status, "%s", r.Body)
	p := r.json(t)
	require.Equal(t, "failed", p["status"])
	require.Equal(t, "insufficient_funds", p["failure_code"])
	require.Equal(t, 0, s.simCount(p["id"].(string)), "no charge may reach the bank")

	a := s.account(m, acct)
	require.Equal(t, "500.00", a["balance"])
	require.Equal(t, "0.00", a["reserved"])
	entries, err := db.LedgerEntries(context.Background(), p["id"].(string))
	require.NoError(t, err)
	require.Empty(t, entries)

	// A failed payment does not block the invoice: a new key may pay it when funds suffice.
	r = s.pay(m, "key-2", payBody("inv-1", "500.00", "TRY", acct))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	requireVerified(t)
}

func TestDeclinedByBankReleasesReservation(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	s.setFaults(`{"rules":[{"on":"charge","action":"decline","count":1}]}`)

	r := s.pay(m, "key-1", payBody("inv-1", "40.00", "TRY", acct))
	require.Equal(t, http.StatusPaymentRequired, r.Status, "%s", r.Body)
	require.Equal(t, "declined", r.json(t)["failure_code"])
	require.Equal(t, 0, s.simCount(r.json(t)["id"].(string)))
	a := s.account(m, acct)
	require.Equal(t, "100.00", a["balance"])
	require.Equal(t, "0.00", a["reserved"])
	requireVerified(t)
}

func TestProviderErrorsAreRetriedWithTheSameKey(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	// The bank takes the money but the answer is lost, then fails twice: the idempotent
	// provider must still see one money movement.
	s.setFaults(`{"rules":[{"on":"charge","action":"drop_response","count":1},{"on":"charge","action":"error_500","count":2}]}`)

	r := s.pay(m, "key-1", payBody("inv-1", "40.00", "TRY", acct))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Equal(t, 1, s.simCount(r.json(t)["id"].(string)))
	require.Equal(t, "60.00", s.account(m, acct)["balance"])
	requireVerified(t)
}

func TestUnknownOutcomeIsParkedUntilSettlement(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	s.setFaults(`{"rules":[{"on":"charge","action":"drop_response","count":1}]}`)

	r := s.pay(m, "key-1", payBody("inv-1", "40.00", "TRY", acct))
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	p := r.json(t)
	require.Equal(t, "unknown", p["status"])
	id := p["id"].(string)
	require.Equal(t, 1, s.simCount(id), "the bank moved the money; kasa must not send again")
	a := s.account(m, acct)
	require.Equal(t, "40.00", a["reserved"], "an unknown payment keeps its reservation")

	// A retry answers 202 unknown without executing anything.
	again := s.pay(m, "key-1", payBody("inv-1", "40.00", "TRY", acct))
	require.Equal(t, http.StatusAccepted, again.Status)
	require.Equal(t, "unknown", again.json(t)["status"])
	require.NotEmpty(t, again.Header.Get("Retry-After"))
	requireVerified(t)

	// Reconciliation says the bank charged it.
	ctx := context.Background()
	wfID := workflows.PaymentWorkflowID(mustUUID(t, m.ID), "key-1")
	require.NoError(t, tc.SignalWorkflow(ctx, wfID, "", workflows.SignalSettlement,
		workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: "ch_from_settlement"}))
	var res workflows.PaymentResult
	require.NoError(t, tc.GetWorkflow(ctx, wfID, "").Get(ctx, &res))
	require.Equal(t, "succeeded", res.Status)

	final := s.pay(m, "key-1", payBody("inv-1", "40.00", "TRY", acct))
	require.Equal(t, http.StatusCreated, final.Status, "%s", final.Body)
	require.Equal(t, "ch_from_settlement", final.json(t)["provider_reference"])
	a = s.account(m, acct)
	require.Equal(t, "60.00", a["balance"])
	require.Equal(t, "0.00", a["reserved"])
	require.Equal(t, 1, s.simCount(id))
	requireVerified(t)
}

func TestAuthAndIsolation(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityIdempotent)
	m1, m2 := s.newMerchant(), s.newMerchant()
	acct := s.newAccount(m1, "TRY", "100.00")

	require.Equal(t, http.StatusUnauthorized, s.do("POST", "/admin/v1/merchants", "wrong", `{"name":"x"}`).Status)
	require.Equal(t, http.StatusUnauthorized, s.do("GET", "/v1/accounts/"+acct, "", "").Status)
	require.Equal(t, http.StatusUnauthorized, s.do("GET", "/v1/accounts/"+acct, "sk_nope", "").Status)
	r := s.do("GET", "/v1/accounts/"+acct, m2.APIKey, "")
	require.Equal(t, http.StatusNotFound, r.Status, "another merchant's account does not exist for m2")
	require.Equal(t, "application/problem+json", r.Header.Get("Content-Type"))
	require.Equal(t, "not_found", r.json(t)["code"])

	// m2 cannot pay from m1's account; nothing is written.
	r = s.pay(m2, "k", payBody("inv-1", "1.00", "TRY", acct))
	require.Equal(t, http.StatusBadRequest, r.Status)
	require.Equal(t, "invalid_request", r.json(t)["code"])
	nothing := s.do("GET", "/v1/payments?idempotency_key=k", m2.APIKey, "")
	require.Equal(t, http.StatusNotFound, nothing.Status)

	paid := s.pay(m1, "k", payBody("inv-1", "1.00", "TRY", acct))
	require.Equal(t, http.StatusCreated, paid.Status, "%s", paid.Body)
	id := paid.json(t)["id"].(string)
	require.Equal(t, http.StatusNotFound, s.do("GET", "/v1/payments/"+id, m2.APIKey, "").Status)
	requireVerified(t)
}

// The API learns a payment's outcome from the worker's store when both run in one process (kasa
// dev), with no call to Temporal for the workflow's result, and asks Temporal otherwise (kasa
// api with workers elsewhere). The answers are the same either way. In process, the fallback
// (ask Temporal after PollAfter) is set long, so that only a missing announcement calls it.
func TestAPIAwaitsOutcomesInProcessOrThroughTemporal(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		remote bool
		awaits int32
	}{
		{name: "in process", remote: false, awaits: 0},
		{name: "through temporal", remote: true, awaits: 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: tc, remoteWorker: c.remote, pollAfter: 10 * time.Second})
			m := s.newMerchant()
			acct := s.newAccount(m, "TRY", "100.00")

			r := s.pay(m, "k-paid", payBody("inv-1", "60.00", "TRY", acct))
			require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
			paid := r.json(t)
			require.Equal(t, "succeeded", paid["status"])
			require.Equal(t, 1, s.simCount(paid["id"].(string)))

			r = s.pay(m, "k-poor", payBody("inv-2", "60.00", "TRY", acct))
			require.Equal(t, http.StatusPaymentRequired, r.Status, "%s", r.Body)
			require.Equal(t, "insufficient_funds", r.json(t)["failure_code"])

			require.Equal(t, c.awaits, s.awaits.Load(), "calls to Temporal for a workflow's result")
			a := s.account(m, acct)
			require.Equal(t, "40.00", a["balance"])
			require.Equal(t, "0.00", a["reserved"])
			requireVerified(t)
		})
	}
}
