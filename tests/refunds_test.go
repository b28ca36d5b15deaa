package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/outbox"
	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/workflows"
)

// simRefunds is how many times the simulator moved money back for a refund's reference.
func (s *stack) simRefunds(reference string) int {
	s.t.Helper()
	return bankRefunds(s.t, s.sim.URL, reference)
}

func (s *stack) refund(m merchant, paymentID, key, body string) response {
	s.t.Helper()
	return s.do("POST", "/v1/payments/"+paymentID+"/refunds", m.APIKey, body, "Idempotency-Key", key)
}

// balance is an account's balance in minor units, as the ledger left it.
func balance(t *testing.T, id string) int64 {
	t.Helper()
	a, err := db.Account(context.Background(), mustUUID(t, id))
	require.NoError(t, err)
	return a.Balance
}

// A payment refunded in part, then in whole, through the running system: the bank pays back
// once per refund, the money moves settlement -> payer in a balanced `refund` posting, the
// merchant hears of it by a signed webhook, and nothing more is refundable after the whole.
// Not parallel: the event pipeline publishes every outbox row of the shared database.
func TestRefundEndToEnd(t *testing.T) {
	s := newStack(t, workflows.CapabilityIdempotent)
	hook := newSink(t)
	startEventPipeline(t)
	ctx := context.Background()

	r := s.do("POST", "/admin/v1/merchants", adminToken, fmt.Sprintf(`{"name":"Refunding","webhook_url":%q}`, hook.URL))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	created := r.json(t)
	m := merchant{ID: created["id"].(string), APIKey: created["api_key"].(string)}
	secret := created["webhook_secret"].(string)
	payer := s.newAccount(m, "TRY", "500.00")

	r = s.pay(m, "pay-1", payBody("inv-refund-1", "100.00", "TRY", payer))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	paymentID := r.json(t)["id"].(string)
	entries, err := db.LedgerEntries(ctx, paymentID)
	require.NoError(t, err)
	require.Len(t, entries, 2)
	settlement := entries[0].AccountID.String()
	if entries[0].AmountMinor < 0 {
		settlement = entries[1].AccountID.String()
	}
	require.Equal(t, int64(40000), balance(t, payer))
	require.Equal(t, int64(10000), balance(t, settlement))

	// A refund of 30.00.
	r = s.refund(m, paymentID, "ref-1", `{"amount":"30.00","reason":"damaged in transit"}`)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	first := r
	rf := r.json(t)
	refundID := rf["id"].(string)
	require.Equal(t, "/v1/refunds/"+refundID, r.Header.Get("Location"))
	require.Equal(t, "succeeded", rf["status"])
	require.Equal(t, paymentID, rf["payment_id"])
	require.Equal(t, "30.00", rf["amount"])
	require.Equal(t, "TRY", rf["currency"])
	require.Equal(t, "damaged in transit", rf["reason"])
	require.Nil(t, rf["failure_code"])
	require.NotNil(t, rf["provider_reference"])
	require.Equal(t, 1, s.simRefunds(refundID), "one refund at the bank, under the refund's id")
	require.Equal(t, int64(43000), balance(t, payer), "the payer gets 30.00 back")
	require.Equal(t, int64(7000), balance(t, settlement), "from the merchant's settlement")
	require.Equal(t, "430.00", s.account(m, payer)["balance"])

	refunded, err := db.LedgerEntries(ctx, refundID)
	require.NoError(t, err)
	require.Len(t, refunded, 2)
	require.Equal(t, refunded[0].PostingID, refunded[1].PostingID)
	byAccount := map[string]int64{}
	for _, e := range refunded {
		require.Equal(t, "refund", e.Kind)
		byAccount[e.AccountID.String()] = e.AmountMinor
	}
	require.Equal(t, map[string]int64{settlement: -3000, payer: 3000}, byAccount)

	p := s.do("GET", "/v1/payments/"+paymentID, m.APIKey, "")
	require.Equal(t, http.StatusOK, p.Status)
	require.Equal(t, "30.00", p.json(t)["amount_refunded"])
	got := s.do("GET", "/v1/refunds/"+refundID, m.APIKey, "")
	require.Equal(t, http.StatusOK, got.Status)
	require.Equal(t, string(first.Body), string(got.Body), "the refund as it is now is its answer")

	// The merchant hears of it: refund.succeeded, signed, with the refund resource.
	var delivered []byte
	var signature string
	require.Eventually(t, func() bool {
		for _, h := range hook.Requests() {
			var w struct {
				Type string         `json:"type"`
				Data map[string]any `json:"data"`
			}
			if json.Unmarshal(h.Body, &w) == nil && w.Type == "refund.succeeded" && w.Data["id"] == refundID {
				delivered, signature = h.Body, h.Signature
				return true
			}
		}
		return false
	}, 30*time.Second, 20*time.Millisecond)
	require.NoError(t, outbox.Verify(secret, signature, delivered, 5*time.Minute))
	var event struct {
		Data json.RawMessage `json:"data"`
	}
	require.NoError(t, json.Unmarshal(delivered, &event))
	require.JSONEq(t, string(first.Body), string(event.Data))

	// The same key again: byte-identical, and nothing at the bank.
	again := s.refund(m, paymentID, "ref-1", `{"reason":"damaged in transit","amount":30}`)
	require.Equal(t, http.StatusCreated, again.Status, "%s", again.Body)
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	require.Equal(t, string(first.Body), string(again.Body))
	require.Equal(t, 1, s.simRefunds(refundID))

	// The whole remainder, without an amount.
	r = s.refund(m, paymentID, "ref-2", `{}`)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	rest := r.json(t)
	require.Equal(t, "70.00", rest["amount"])
	require.Equal(t, "succeeded", rest["status"])
	require.Equal(t, 1, s.simRefunds(rest["id"].(string)))
	require.Equal(t, int64(50000), balance(t, payer))
	require.Equal(t, int64(0), balance(t, settlement))
	require.Equal(t, "100.00", s.do("GET", "/v1/payments/"+paymentID, m.APIKey, "").json(t)["amount_refunded"])

	// Nothing is left: a third refund is refused, and keeps nothing.
	r = s.refund(m, paymentID, "ref-3", `{"amount":"1.00"}`)
	require.Equal(t, http.StatusConflict, r.Status, "%s", r.Body)
	problem := r.json(t)
	require.Equal(t, "refund_exceeds_refundable", problem["code"])
	require.Equal(t, "0.00", problem["refundable"])
	_, err = db.RefundRecord(ctx, mustUUID(t, m.ID), "ref-3")
	require.Error(t, err, "no record kept for a refused refund")

	// The first key still replays after the payment was refunded in whole.
	again = s.refund(m, paymentID, "ref-1", `{"amount":"30.00","reason":"damaged in transit"}`)
	require.Equal(t, http.StatusCreated, again.Status, "%s", again.Body)
	require.Equal(t, string(first.Body), string(again.Body))
	require.Equal(t, 1, s.simRefunds(refundID))

	// The payment's refunds, newest first.
	list := s.do("GET", "/v1/payments/"+paymentID+"/refunds", m.APIKey, "")
	require.Equal(t, http.StatusOK, list.Status, "%s", list.Body)
	var page struct {
		Data []struct {
			ID     string `json:"id"`
			Amount string `json:"amount"`
		} `json:"data"`
		HasMore bool `json:"has_more"`
	}
	require.NoError(t, json.Unmarshal(list.Body, &page))
	require.False(t, page.HasMore)
	require.Len(t, page.Data, 2)
	require.Equal(t, rest["id"], page.Data[0].ID)
	require.Equal(t, refundID, page.Data[1].ID)
	list = s.do("GET", "/v1/payments/"+paymentID+"/refunds?limit=1", m.APIKey, "")
	require.NoError(t, json.Unmarshal(list.Body, &page))
	require.True(t, page.HasMore)
	require.Len(t, page.Data, 1)

	// A failed payment cannot be refunded.
	poor := s.newAccount(m, "TRY", "10.00")
	r = s.pay(m, "pay-2", payBody("inv-refund-2", "50.00", "TRY", poor))
	require.Equal(t, http.StatusPaymentRequired, r.Status, "%s", r.Body)
	failed := r.json(t)["id"].(string)
	r = s.refund(m, failed, "ref-4", `{}`)
	require.Equal(t, http.StatusConflict, r.Status, "%s", r.Body)
	require.Equal(t, "payment_not_refundable", r.json(t)["code"])
	require.Equal(t, 2, s.simRefunds(""), "refused refunds never reach the bank")
	require.Equal(t, int64(1000), balance(t, poor))

	// Another merchant sees neither the payment nor its refunds.
	other := s.newMerchant()
	for _, r := range []response{
		s.refund(other, paymentID, "ref-1", `{"amount":"1.00"}`),
		s.do("GET", "/v1/refunds/"+refundID, other.APIKey, ""),
		s.do("GET", "/v1/payments/"+paymentID+"/refunds", other.APIKey, ""),
	} {
		require.Equal(t, http.StatusNotFound, r.Status, "%s", r.Body)
		require.False(t, bytes.Contains(r.Body, []byte(paymentID)), "nothing of the payment shows")
	}
	require.Equal(t, int64(50000), balance(t, payer))
	requireVerified(t)
}

// Each capability's strategy refunds once at the bank, and a refund the bank declines fails
// (402) with its hold given back, under every capability.
func TestRefundEachCapability(t *testing.T) {
	t.Parallel()
	for _, c := range workflows.Capabilities {
		t.Run(string(c), func(t *testing.T) {
			t.Parallel()
			s := newStack(t, c)
			m := s.newMerchant()
			payer := s.newAccount(m, "TRY", "100.00")
			r := s.pay(m, "pay-1", payBody("inv-1", "100.00", "TRY", payer))
			require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
			paymentID := r.json(t)["id"].(string)

			r = s.refund(m, paymentID, "ref-1", `{"amount":"30.00"}`)
			require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
			refundID := r.json(t)["id"].(string)
			require.Equal(t, 1, s.simRefunds(refundID))
			require.Equal(t, "30.00", s.account(m, payer)["balance"])

			s.setFaults(`{"rules":[{"on":"refund","action":"decline"}]}`)
			r = s.refund(m, paymentID, "ref-2", `{"amount":"50.00"}`)
			require.Equal(t, http.StatusPaymentRequired, r.Status, "%s", r.Body)
			declined := r.json(t)
			require.Equal(t, "failed", declined["status"])
			require.Equal(t, "declined", declined["failure_code"])
			require.Equal(t, "/v1/refunds/"+declined["id"].(string), r.Header.Get("Location"))
			require.Zero(t, s.simRefunds(declined["id"].(string)))
			require.Equal(t, "30.00", s.account(m, payer)["balance"])

			// The declined refund's hold is given back: the rest is refundable again.
			r = s.refund(m, paymentID, "ref-3", `{"amount":"1000.00"}`)
			require.Equal(t, http.StatusConflict, r.Status, "%s", r.Body)
			require.Equal(t, "70.00", r.json(t)["refundable"])
			requireVerified(t)
		})
	}
}

// Parallel refunds of one payment never pay back more than it was, and one key sent many times
// at once makes one refund at the bank.
func TestRefundsInParallel(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	payer := s.newAccount(m, "TRY", "100.00")
	r := s.pay(m, "pay-1", payBody("inv-1", "100.00", "TRY", payer))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	paymentID := r.json(t)["id"].(string)

	answers := make([]response, 8)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() { answers[i] = s.refund(m, paymentID, fmt.Sprintf("par-%d", i), `{"amount":"30.00"}`) })
	}
	wg.Wait()
	codes := map[int]int{}
	for _, a := range answers {
		codes[a.Status]++
		if a.Status == http.StatusConflict {
			require.Equal(t, "refund_exceeds_refundable", a.json(t)["code"])
		}
	}
	require.Equal(t, map[int]int{http.StatusCreated: 3, http.StatusConflict: 5}, codes)
	require.Equal(t, 3, s.simRefunds(""))
	require.Equal(t, "90.00", s.do("GET", "/v1/payments/"+paymentID, m.APIKey, "").json(t)["amount_refunded"])
	require.Equal(t, "90.00", s.account(m, payer)["balance"])

	same := make([]response, 50)
	for i := range same {
		wg.Go(func() { same[i] = s.refund(m, paymentID, "same", `{"amount":"5.00"}`) })
	}
	wg.Wait()
	var body string
	for _, a := range same {
		switch a.Status {
		case http.StatusCreated:
			if body == "" {
				body = string(a.Body)
			}
			require.Equal(t, body, string(a.Body), "every answer is the one refund")
		case http.StatusConflict:
			require.Equal(t, "idempotency_key_in_use", a.json(t)["code"])
		default:
			t.Fatalf("unexpected answer %d: %s", a.Status, a.Body)
		}
	}
	require.NotEmpty(t, body)
	require.Equal(t, 4, s.simRefunds(""), "one more refund at the bank, for fifty requests")
	require.Equal(t, "95.00", s.account(m, payer)["balance"])
	requireVerified(t)
}

// A refund's payment is checked before its key (docs/api.md): a key the merchant used for a
// refund of its own payment, sent again for another merchant's payment or for no payment at
// all, answers 404, never 422, and the first refund is untouched.
func TestRefundOfAnotherMerchantsPaymentIs404EvenWithAUsedKey(t *testing.T) {
	s := newStack(t, workflows.CapabilityIdempotent)
	a, b := s.newMerchant(), s.newMerchant()
	pa, pb := s.newAccount(a, "TRY", "100.00"), s.newAccount(b, "TRY", "100.00")
	own := s.pay(a, "pa", payBody("pa", "10", "TRY", pa)).json(t)["id"].(string)
	theirs := s.pay(b, "pb", payBody("pb", "10", "TRY", pb)).json(t)["id"].(string)
	refund := func(id string) response {
		return s.do("POST", "/v1/payments/"+id+"/refunds", a.APIKey, `{"amount":"1"}`, "Idempotency-Key", "ref-1", "Content-Type", "application/json")
	}
	r := refund(own)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	for _, id := range []string{theirs, payment.NewID().String()} {
		requireProblem(t, refund(id), http.StatusNotFound, "not_found")
	}
	r = refund(own)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Equal(t, "true", r.Header.Get("Idempotent-Replayed"))
}

// A key the API answered from its memory of replays (the replay cache) is held to the same checks
// as one read from the database (docs/api.md): sent for another merchant's payment or for none,
// it answers 404, never 422; with an amount of more digits than the payment's currency has, 400,
// never the first refund's answer. Nothing more is refunded.
func TestRefundKeyAnsweredFromMemoryChecksItsPaymentFirst(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityIdempotent)
	a, b := s.newMerchant(), s.newMerchant()
	pa, pb := s.newAccount(a, "JPY", "1000"), s.newAccount(b, "JPY", "1000")
	own := s.pay(a, "pa", payBody("pa", "100", "JPY", pa)).json(t)["id"].(string)
	theirs := s.pay(b, "pb", payBody("pb", "100", "JPY", pb)).json(t)["id"].(string)
	refund := func(id, body string) response {
		return s.do("POST", "/v1/payments/"+id+"/refunds", a.APIKey, body, "Idempotency-Key", "ref-mem", "Content-Type", "application/json")
	}
	first := refund(own, `{"amount":"30"}`)
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
	for range 2 { // the first replay is read from the database, the second from memory
		r := refund(own, `{"amount":"30"}`)
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		require.Equal(t, "true", r.Header.Get("Idempotent-Replayed"))
		require.Equal(t, string(first.Body), string(r.Body))
	}
	for _, id := range []string{theirs, payment.NewID().String()} {
		requireProblem(t, refund(id, `{"amount":"30"}`), http.StatusNotFound, "not_found")
	}
	for _, body := range []string{`{"amount":"30.0"}`, `{"amount":30.00}`} {
		r := refund(own, body)
		requireProblem(t, r, http.StatusBadRequest, "invalid_request")
		require.Equal(t, "amount", r.json(t)["errors"].([]any)[0].(map[string]any)["field"], "%s", r.Body)
	}
	require.Equal(t, 1, s.simRefunds(first.json(t)["id"].(string)))
	require.Equal(t, int64(930), balance(t, pa))
	requireVerified(t)
}
