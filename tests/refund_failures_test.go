package tests

// The failure-first table for refunds, on the real stack: every scenario asserts what the bank
// did (/_sim/refunds), what the database holds (refund and payment rows, the holds on the payment
// and on the merchant's settlement account, the ledger's refund postings) and that `kasa verify`
// finds nothing wrong afterwards.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/activities"
	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/provider"
	"github.com/kasa-pay/kasa/reconcile"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
	"github.com/kasa-pay/kasa/workflows"
)

// refundState is what the database holds of a payment's refunds.
type refundState struct {
	Refunded, Held           int64 // payments.refunded_minor, refund_held_minor
	Balance, Reserved        int64 // the merchant's settlement account in the payment's currency
	Refunds                  int   // refund rows of the payment
	ActiveHolds, Settled     int   // its refunds' reservations on the settlement account: active, finalized
	Postings                 int   // ledger postings of kind refund for its refunds
	Succeeded, Failed, Other int   // its refunds by status (Other: processing or unknown)
}

// readRefundState reads a payment's refund state from the database at dbURL.
func readRefundState(t *testing.T, dbURL, paymentID string) refundState {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer c.Close(ctx)
	var s refundState
	require.NoError(t, c.QueryRow(ctx, `
-- A settlement account's balance lives in its shards (the account's own row holds 0).
SELECT p.refunded_minor, p.refund_held_minor,
  a.balance + (SELECT coalesce(sum(sh.balance), 0) FROM settlement_shards sh WHERE sh.account_id = a.id),
  a.reserved + (SELECT coalesce(sum(sh.reserved), 0) FROM settlement_shards sh WHERE sh.account_id = a.id),
  (SELECT count(*) FROM refunds r WHERE r.payment_id = p.id),
  (SELECT count(*) FILTER (WHERE b.status = 'active') FROM balance_reservations b JOIN refunds r ON r.id = b.operation_id WHERE r.payment_id = p.id),
  (SELECT count(*) FILTER (WHERE b.status = 'finalized') FROM balance_reservations b JOIN refunds r ON r.id = b.operation_id WHERE r.payment_id = p.id),
  (SELECT count(*) FROM ledger_postings l JOIN refunds r ON l.reference = r.id::text WHERE r.payment_id = p.id AND l.kind = 'refund'),
  (SELECT count(*) FROM refunds r WHERE r.payment_id = p.id AND r.status = 'succeeded'),
  (SELECT count(*) FROM refunds r WHERE r.payment_id = p.id AND r.status = 'failed'),
  (SELECT count(*) FROM refunds r WHERE r.payment_id = p.id AND r.status IN ('processing', 'unknown'))
FROM payments p JOIN accounts a ON a.merchant_id = p.merchant_id AND a.kind = 'settlement' AND a.currency = p.currency
WHERE p.id = $1`, paymentID).Scan(&s.Refunded, &s.Held, &s.Balance, &s.Reserved, &s.Refunds, &s.ActiveHolds, &s.Settled,
		&s.Postings, &s.Succeeded, &s.Failed, &s.Other))
	return s
}

// outboxOf lists the event types of an aggregate (a payment or refund id), oldest first.
func outboxOf(t *testing.T, dbURL, id string) []string {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer c.Close(ctx)
	var types []string
	require.NoError(t, c.QueryRow(ctx, `SELECT coalesce(array_agg(type ORDER BY created_at, id), '{}') FROM outbox WHERE aggregate_id = $1`, id).Scan(&types))
	return types
}

// paidFor pays amount from a fresh payer account holding deposit and returns the payment's id.
func (s *stack) paidFor(m merchant, key, amount, deposit string) (paymentID, payer string) {
	s.t.Helper()
	payer = s.newAccount(m, "TRY", deposit)
	r := s.pay(m, key, payBody("inv-"+key, amount, "TRY", payer))
	require.Equal(s.t, http.StatusCreated, r.Status, "%s", r.Body)
	return r.json(s.t)["id"].(string), payer
}

// Sequential replays, a reused key and another merchant's payment, on one stack: the bank
// refunds once, a replay is the first answer byte for byte, a different request under the key is
// refused without touching the first refund, and nothing of one merchant shows to another.
func TestRefundKeyReplaysAndStrangers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	paymentID, payer := s.paidFor(m, "pay-1", "100.00", "100.00")

	// The same key 100 times in sequence.
	const body = `{"amount":"30.00","reason":"damaged"}`
	first := s.refund(m, paymentID, "same", body)
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
	require.Empty(t, first.Header.Get("Idempotent-Replayed"))
	refundID := first.json(t)["id"].(string)
	for i := range 99 {
		again := s.refund(m, paymentID, "same", body)
		require.Equal(t, http.StatusCreated, again.Status, "replay %d: %s", i, again.Body)
		require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"), "replay %d", i)
		require.Equal(t, string(first.Body), string(again.Body), "replay %d", i)
		require.Equal(t, first.Header.Get("Location"), again.Header.Get("Location"))
	}
	require.Equal(t, 1, s.simRefunds(refundID), "one refund at the bank for 100 requests")
	require.Equal(t, 1, s.simRefunds(""))
	want := refundState{Refunded: 3000, Balance: 7000, Refunds: 1, Settled: 1, Postings: 1, Succeeded: 1}
	require.Equal(t, want, readRefundState(t, env.DatabaseURL, paymentID))
	require.Equal(t, "30.00", s.account(m, payer)["balance"])
	require.Equal(t, []string{"refund.succeeded"}, outboxOf(t, env.DatabaseURL, refundID))
	requireVerified(t)

	// Another request under the same key: refused, the first refund untouched.
	for _, other := range []string{`{"amount":"40.00","reason":"damaged"}`, `{"amount":"30.00","reason":"late"}`, `{"amount":"30.00"}`, `{}`} {
		r := s.refund(m, paymentID, "same", other)
		require.Equal(t, http.StatusUnprocessableEntity, r.Status, "%s: %s", other, r.Body)
		require.Equal(t, "idempotency_key_reused", r.json(t)["code"], other)
	}
	// The same key on another payment of the merchant is another request too.
	second, _ := s.paidFor(m, "pay-2", "50.00", "50.00")
	r := s.refund(m, second, "same", body)
	require.Equal(t, http.StatusUnprocessableEntity, r.Status, "%s", r.Body)
	require.Equal(t, "idempotency_key_reused", r.json(t)["code"])
	require.Equal(t, refundState{Balance: 12000}, readRefundState(t, env.DatabaseURL, second))

	got := s.do("GET", "/v1/refunds/"+refundID, m.APIKey, "")
	require.Equal(t, http.StatusOK, got.Status)
	require.Equal(t, string(first.Body), string(got.Body), "the first refund as it was")
	again := s.refund(m, paymentID, "same", body)
	require.Equal(t, string(first.Body), string(again.Body), "the key still answers its first request")
	require.Equal(t, 1, s.simRefunds(""))
	want.Balance = 12000 // the second payment's 50.00 came in
	require.Equal(t, want, readRefundState(t, env.DatabaseURL, paymentID))
	requireVerified(t)

	// Another merchant: 404 everywhere, nothing of the payment or its refund shows, nothing kept.
	other := s.newMerchant()
	otherPayment, _ := s.paidFor(other, "pay-1", "10.00", "10.00")
	for name, r := range map[string]response{
		"refund its payment":           s.refund(other, paymentID, "theirs", `{"amount":"1.00"}`),
		"refund it whole":              s.refund(other, paymentID, "theirs-2", `{}`),
		"get its refund":               s.do("GET", "/v1/refunds/"+refundID, other.APIKey, ""),
		"list its refunds":             s.do("GET", "/v1/payments/"+paymentID+"/refunds", other.APIKey, ""),
		"list a page of them":          s.do("GET", "/v1/payments/"+paymentID+"/refunds?limit=1&starting_after="+refundID, other.APIKey, ""),
		"refund a payment nobody has":  s.refund(other, payment.NewID().String(), "nobody", `{"amount":"1.00"}`),
		"the owner, another's payment": s.refund(m, otherPayment, "mine", `{"amount":"1.00"}`),
	} {
		require.Equal(t, http.StatusNotFound, r.Status, "%s: %s", name, r.Body)
		require.NotContains(t, string(r.Body), paymentID, name)
		require.NotContains(t, string(r.Body), refundID, name)
	}
	for _, k := range []struct{ merchant, key string }{{other.ID, "theirs"}, {other.ID, "theirs-2"}, {other.ID, "nobody"}, {m.ID, "mine"}} {
		_, err := db.RefundRecord(ctx, mustUUID(t, k.merchant), k.key)
		require.ErrorIs(t, err, payment.ErrNotFound, "no record kept for %s", k.key)
	}
	require.Equal(t, want, readRefundState(t, env.DatabaseURL, paymentID))
	require.Equal(t, refundState{Balance: 1000}, readRefundState(t, env.DatabaseURL, otherPayment))
	require.Equal(t, 1, s.simRefunds(""))
	requireVerified(t)

	// While a refund is still at the bank (its first send hangs until the provider timeout, the
	// second succeeds), another request under its key is refused (422), the same request is in
	// use (409), and the refund finishes unaffected.
	s.setFaults(`{"rules":[{"on":"refund","action":"hang","count":1}]}`)
	inflight := make(chan response, 1)
	go func() {
		r, err := httpCall("POST", s.api.URL+"/v1/payments/"+second+"/refunds", m.APIKey, `{"amount":"20.00"}`, "Idempotency-Key", "slow")
		if err != nil {
			r.Body = []byte(err.Error())
		}
		inflight <- r
	}()
	require.Eventually(t, func() bool { return readRefundState(t, env.DatabaseURL, second).ActiveHolds == 1 }, 10*time.Second, 10*time.Millisecond)
	r = s.refund(m, second, "slow", `{"amount":"25.00"}`)
	require.Equal(t, http.StatusUnprocessableEntity, r.Status, "%s", r.Body)
	require.Equal(t, "idempotency_key_reused", r.json(t)["code"])
	r = s.refund(m, second, "slow", `{"amount":"20.00"}`)
	require.Equal(t, http.StatusConflict, r.Status, "%s", r.Body)
	require.Equal(t, "idempotency_key_in_use", r.json(t)["code"])
	require.NotEmpty(t, r.Header.Get("Retry-After"))
	require.Equal(t, refundState{Held: 2000, Balance: 12000, Reserved: 2000, Refunds: 1, ActiveHolds: 1, Other: 1},
		readRefundState(t, env.DatabaseURL, second))
	slow := <-inflight
	require.Equal(t, http.StatusCreated, slow.Status, "%s", slow.Body)
	require.Equal(t, "20.00", slow.json(t)["amount"])
	require.Equal(t, 1, s.simRefunds(slow.json(t)["id"].(string)))
	require.Equal(t, refundState{Refunded: 2000, Balance: 10000, Refunds: 1, Settled: 1, Postings: 1, Succeeded: 1},
		readRefundState(t, env.DatabaseURL, second))
	requireVerified(t)
}

// A payment that is not succeeded cannot be refunded: failed (declined or short of funds), still
// processing (its charge hangs at the bank), or unknown (the charge's answer was lost, whether or
// not the bank moved money). Each refusal is 409 payment_not_refundable and keeps nothing.
func TestRefundOfUnrefundablePayments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	merchantID := mustUUID(t, m.ID)

	// refuse asks for a whole and a partial refund of the payment and checks nothing was kept.
	refuse := func(t *testing.T, paymentID, key string) {
		t.Helper()
		before := readRefundState(t, env.DatabaseURL, paymentID)
		require.Zero(t, before.Refunds)
		for i, body := range []string{`{}`, `{"amount":"1.00","reason":"too early"}`} {
			k := fmt.Sprintf("%s-%d", key, i)
			r := s.refund(m, paymentID, k, body)
			require.Equal(t, http.StatusConflict, r.Status, "%s: %s", k, r.Body)
			require.Equal(t, "payment_not_refundable", r.json(t)["code"], "%s", r.Body)
			_, err := db.RefundRecord(ctx, merchantID, k)
			require.ErrorIs(t, err, payment.ErrNotFound, "no record kept for %s", k)
		}
		require.Equal(t, before, readRefundState(t, env.DatabaseURL, paymentID), "nothing held")
		require.Zero(t, s.simRefunds(""), "nothing reached the bank")
		list := s.do("GET", "/v1/payments/"+paymentID+"/refunds", m.APIKey, "")
		require.Equal(t, http.StatusOK, list.Status, "%s", list.Body)
		require.JSONEq(t, `{"data":[],"has_more":false}`, string(list.Body))
		requireVerified(t)
	}

	t.Run("failed/insufficient_funds", func(t *testing.T) {
		poor := s.newAccount(m, "TRY", "10.00")
		r := s.pay(m, "poor", payBody("inv-poor", "50.00", "TRY", poor))
		require.Equal(t, http.StatusPaymentRequired, r.Status, "%s", r.Body)
		refuse(t, r.json(t)["id"].(string), "poor")
	})
	t.Run("failed/declined", func(t *testing.T) {
		acct := s.newAccount(m, "TRY", "100.00")
		s.setFaults(`{"rules":[{"on":"charge","action":"decline","count":1}]}`)
		r := s.pay(m, "declined", payBody("inv-declined", "50.00", "TRY", acct))
		require.Equal(t, http.StatusPaymentRequired, r.Status, "%s", r.Body)
		refuse(t, r.json(t)["id"].(string), "declined")
	})
	t.Run("processing_then_unknown_not_charged", func(t *testing.T) {
		acct := s.newAccount(m, "TRY", "100.00")
		s.setFaults(`{"rules":[{"on":"charge","action":"hang","count":1}]}`)
		answer := make(chan response, 1)
		go func() {
			r, err := httpCall("POST", s.api.URL+"/v1/payments", m.APIKey, payBody("inv-hang", "50.00", "TRY", acct), "Idempotency-Key", "hang")
			if err != nil {
				r.Body = []byte(err.Error())
			}
			answer <- r
		}()
		var p payment.Payment
		require.Eventually(t, func() bool {
			var err error
			p, err = db.PaymentByKey(ctx, merchantID, "hang")
			return err == nil
		}, 10*time.Second, 10*time.Millisecond)
		require.Equal(t, payment.StatusProcessing, p.Status)
		refuse(t, p.ID.String(), "hang-processing")
		p, err := db.PaymentByKey(ctx, merchantID, "hang")
		require.NoError(t, err)
		require.Equal(t, payment.StatusProcessing, p.Status, "still at the bank while it was refused")

		r := <-answer // the provider timeout ends the hang: capability none cannot tell, so unknown
		require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
		require.Equal(t, "unknown", r.json(t)["status"])
		require.Zero(t, s.simCount(p.ID.String()))
		refuse(t, p.ID.String(), "hang-unknown")
	})
	t.Run("unknown_charged", func(t *testing.T) {
		acct := s.newAccount(m, "TRY", "100.00")
		p := s.payUnknown(m, "lost", payBody("inv-lost", "50.00", "TRY", acct), "drop_response")
		require.Equal(t, 1, s.simCount(p.ID.String()), "the bank has the money")
		refuse(t, p.ID.String(), "lost")

		// Once the bank's file settles it as charged, it is refundable.
		time.Sleep(bookingWindow)
		rep, ok := decodeReport(t, s.importSettlements(m, s.settlementFile(today())))
		require.True(t, ok, "%+v", rep.Mismatches)
		require.Equal(t, 1, rep.Counts.ResolvedCharged, "%+v", rep)
		r := s.refund(m, p.ID.String(), "lost-1", `{}`)
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		require.Equal(t, "50.00", r.json(t)["amount"])
		require.Equal(t, 1, s.simRefunds(""))
		require.Equal(t, refundState{Refunded: 5000, Refunds: 1, Settled: 1, Postings: 1, Succeeded: 1},
			readRefundState(t, env.DatabaseURL, p.ID.String()))
		requireVerified(t)
	})
}

// A refund's answer lost with capability none: the refund is unknown, keeps its holds on the
// payment and the settlement account, and the merchant hears refund.unknown. The bank's
// settlement file then settles it as it happened: listed (the bank paid back) -> succeeded; not
// listed on a day the file covers (an error that moved no money) -> failed, the holds given back
// and the amount refundable again.
// Not parallel: the event pipeline publishes every outbox row of the shared database.
func TestRefundResponseLostSettledByFile(t *testing.T) {
	s := newStack(t, workflows.CapabilityNone)
	hook := newSink(t)
	startEventPipeline(t)
	m := s.newHookedMerchant(hook.URL)
	payer := s.newAccount(m, "TRY", "500.00")
	pay := func(key string) string {
		r := s.pay(m, key, payBody("inv-"+key, "100.00", "TRY", payer))
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		return r.json(t)["id"].(string)
	}
	charged, notCharged := pay("p-charged"), pay("p-not-charged")

	// webhook waits for the merchant's webhook of an event about a refund, and returns its data.
	webhook := func(typ, refundID string) map[string]any {
		t.Helper()
		var data map[string]any
		require.Eventually(t, func() bool {
			for _, h := range hook.Requests() {
				var w struct {
					Type string         `json:"type"`
					Data map[string]any `json:"data"`
				}
				if json.Unmarshal(h.Body, &w) == nil && w.Type == typ && w.Data["id"] == refundID {
					data = w.Data
					return true
				}
			}
			return false
		}, 30*time.Second, 20*time.Millisecond, "%s of %s", typ, refundID)
		return data
	}
	// lost refunds amount of a payment with the fault on the refund, and requires it unknown.
	lost := func(paymentID, key, amount, fault string) string {
		t.Helper()
		s.setFaults(`{"rules":[{"on":"refund","action":"` + fault + `","count":1}]}`)
		r := s.refund(m, paymentID, key, `{"amount":"`+amount+`"}`)
		require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
		rf := r.json(t)
		require.Equal(t, "unknown", rf["status"])
		require.Nil(t, rf["failure_code"])
		id := rf["id"].(string)
		require.Equal(t, "/v1/refunds/"+id, r.Header.Get("Location"))
		require.Equal(t, "unknown", webhook("refund.unknown", id)["status"])
		require.Equal(t, []string{"refund.unknown"}, outboxOf(t, env.DatabaseURL, id))
		return id
	}

	// The bank pays back, the answer is lost.
	paidBack := lost(charged, "r-charged", "40.00", "drop_response")
	require.Equal(t, 1, s.simRefunds(paidBack), "the bank paid back")
	require.Equal(t, refundState{Held: 4000, Balance: 20000, Reserved: 4000, Refunds: 1, ActiveHolds: 1, Other: 1},
		readRefundState(t, env.DatabaseURL, charged), "the holds are kept on the payment and the settlement account")
	require.Equal(t, "300.00", s.account(m, payer)["balance"], "the payer has nothing back yet")
	require.Equal(t, "0.00", s.do("GET", "/v1/payments/"+charged, m.APIKey, "").json(t)["amount_refunded"])
	// The same key again: the refund as it is now, still unknown, and nothing sent to the bank.
	r := s.refund(m, charged, "r-charged", `{"amount":"40.00"}`)
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	require.Equal(t, paidBack, r.json(t)["id"])
	require.Equal(t, "unknown", r.json(t)["status"])
	require.NotEmpty(t, r.Header.Get("Retry-After"))
	require.Equal(t, 1, s.simRefunds(""))
	r = s.refund(m, charged, "r-too-much", `{"amount":"70.00"}`)
	require.Equal(t, http.StatusConflict, r.Status, "%s", r.Body)
	require.Equal(t, "60.00", r.json(t)["refundable"], "the unknown refund's amount stays held")
	requireVerified(t)

	// The bank answers an error before doing anything: no money moves, but kasa cannot know.
	never := lost(notCharged, "r-not-charged", "30.00", "error_500")
	require.Zero(t, s.simRefunds(never))
	require.Equal(t, refundState{Held: 3000, Balance: 20000, Reserved: 7000, Refunds: 1, ActiveHolds: 1, Other: 1},
		readRefundState(t, env.DatabaseURL, notCharged))
	requireVerified(t)

	// The bank's own file for today, made after the booking window: it lists the first refund only.
	time.Sleep(bookingWindow + 100*time.Millisecond)
	file := s.settlementFile(today())
	require.Contains(t, file, paidBack)
	require.NotContains(t, file, never)
	rep, ok := decodeReport(t, s.importSettlements(m, file))
	require.True(t, ok, "%+v %+v", rep.Mismatches, rep.RefundMismatches)
	require.Equal(t, reconcile.Counts{Matched: 2, RefundResolvedCharged: 1, RefundResolvedNotCharged: 1}, rep.Counts, "%+v", rep.RefundPending)

	// Listed: succeeded, the money moved settlement -> payer once.
	got := s.do("GET", "/v1/refunds/"+paidBack, m.APIKey, "").json(t)
	require.Equal(t, "succeeded", got["status"])
	require.Equal(t, "succeeded", webhook("refund.succeeded", paidBack)["status"])
	require.Equal(t, "40.00", s.do("GET", "/v1/payments/"+charged, m.APIKey, "").json(t)["amount_refunded"])
	require.Equal(t, refundState{Refunded: 4000, Balance: 16000, Refunds: 1, Settled: 1, Postings: 1, Succeeded: 1},
		readRefundState(t, env.DatabaseURL, charged))
	require.Equal(t, 1, s.simRefunds(paidBack), "settling never refunds again")

	// Not listed: failed, both holds given back.
	got = s.do("GET", "/v1/refunds/"+never, m.APIKey, "").json(t)
	require.Equal(t, "failed", got["status"])
	require.NotNil(t, got["failure_code"])
	require.Equal(t, "failed", webhook("refund.failed", never)["status"])
	require.Equal(t, "0.00", s.do("GET", "/v1/payments/"+notCharged, m.APIKey, "").json(t)["amount_refunded"])
	require.Equal(t, refundState{Balance: 16000, Refunds: 1, Failed: 1}, readRefundState(t, env.DatabaseURL, notCharged))
	require.Equal(t, "340.00", s.account(m, payer)["balance"])
	requireVerified(t)

	// Their keys now answer the settled outcomes, as final answers.
	for key, want := range map[string]struct {
		paymentID, body string
		status          int
	}{"r-charged": {charged, `{"amount":"40.00"}`, http.StatusCreated}, "r-not-charged": {notCharged, `{"amount":"30.00"}`, http.StatusPaymentRequired}} {
		r := s.refund(m, want.paymentID, key, want.body)
		require.Equal(t, want.status, r.Status, "%s: %s", key, r.Body)
		require.Equal(t, "true", r.Header.Get("Idempotent-Replayed"), key)
		id := r.json(t)["id"].(string)
		require.JSONEq(t, string(s.do("GET", "/v1/refunds/"+id, m.APIKey, "").Body), string(r.Body), key)
	}
	require.Equal(t, 1, s.simRefunds(""))

	// The released amount is refundable again: all of it.
	r = s.refund(m, notCharged, "r-again", `{}`)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Equal(t, "100.00", r.json(t)["amount"])
	require.Equal(t, 1, s.simRefunds(r.json(t)["id"].(string)))
	require.Equal(t, refundState{Refunded: 10000, Balance: 6000, Refunds: 2, Settled: 1, Postings: 1, Succeeded: 1, Failed: 1},
		readRefundState(t, env.DatabaseURL, notCharged))
	require.Equal(t, "440.00", s.account(m, payer)["balance"])
	require.Equal(t, 2, s.simRefunds(""))

	// A second import changes nothing.
	rep, ok = decodeReport(t, s.importSettlements(m, s.settlementFile(today())))
	require.True(t, ok, "%+v %+v", rep.Mismatches, rep.RefundMismatches)
	require.Equal(t, reconcile.Counts{Matched: 2, RefundMatched: 2}, rep.Counts)
	require.Equal(t, refundState{Refunded: 4000, Balance: 6000, Refunds: 1, Settled: 1, Postings: 1, Succeeded: 1},
		readRefundState(t, env.DatabaseURL, charged))
	requireVerified(t)
}

// A payment's refunds listed page by page while more refunds of it are being created: a walk
// never returns a refund twice, never misses one that existed before it began, and keeps the
// order newest first.
func TestRefundPagesOverConcurrentInserts(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	paymentID, _ := s.paidFor(m, "pay-1", "100.00", "100.00")

	type item struct {
		ID        string    `json:"id"`
		CreatedAt time.Time `json:"created_at"`
	}
	// walk lists every page of limit refunds.
	walk := func(limit int) []item {
		var all []item
		after := ""
		for {
			path := fmt.Sprintf("/v1/payments/%s/refunds?limit=%d", paymentID, limit)
			if after != "" {
				path += "&starting_after=" + after
			}
			r := s.do("GET", path, m.APIKey, "")
			require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
			var page struct {
				Data    []item `json:"data"`
				HasMore bool   `json:"has_more"`
			}
			require.NoError(t, json.Unmarshal(r.Body, &page))
			require.LessOrEqual(t, len(page.Data), limit)
			all = append(all, page.Data...)
			if !page.HasMore {
				return all
			}
			require.NotEmpty(t, page.Data, "has_more with an empty page")
			after = page.Data[len(page.Data)-1].ID
		}
	}
	create := func(key string) string {
		r := s.refund(m, paymentID, key, `{"amount":"1.00"}`)
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		return r.json(t)["id"].(string)
	}

	var before []string
	for i := range 10 {
		before = append(before, create(fmt.Sprintf("before-%02d", i)))
	}

	var wg sync.WaitGroup
	done := make(chan struct{})
	var during []string
	var mu sync.Mutex
	for w := range 3 {
		wg.Go(func() {
			for i := range 8 {
				id := create(fmt.Sprintf("during-%d-%02d", w, i))
				mu.Lock()
				during = append(during, id)
				mu.Unlock()
			}
		})
	}
	go func() { wg.Wait(); close(done) }()

	walks := 0
	for running := true; running; walks++ {
		select {
		case <-done:
			running = false // one more walk after the last insert
		default:
		}
		seen := map[string]bool{}
		items := walk(1 + walks%3)
		for i, it := range items {
			require.False(t, seen[it.ID], "walk %d returned %s twice", walks, it.ID)
			seen[it.ID] = true
			if i > 0 {
				prev := items[i-1]
				require.True(t, it.CreatedAt.Before(prev.CreatedAt) || (it.CreatedAt.Equal(prev.CreatedAt) && it.ID < prev.ID),
					"walk %d: newest first", walks)
			}
		}
		for _, id := range before {
			require.True(t, seen[id], "walk %d missed %s, created before it", walks, id)
		}
	}
	t.Logf("%d walks while 24 refunds were created", walks)

	final := walk(7)
	var ids []string
	for _, it := range final {
		ids = append(ids, it.ID)
	}
	require.ElementsMatch(t, append(before, during...), ids, "the last walk has every refund once")
	require.Equal(t, 34, s.simRefunds(""))
	require.Equal(t, refundState{Refunded: 3400, Balance: 6600, Refunds: 34, Settled: 34, Postings: 34, Succeeded: 34},
		readRefundState(t, env.DatabaseURL, paymentID))
	requireVerified(t)
}

// The worker is SIGKILLed while a refund is at the bank, for every capability, in two places:
// the request held at the bank before any money moved ("held"), or the bank paid back and the
// answer never reached the worker ("lost"). The bank never refunds twice; idempotent and
// inquiry finish the refund; none leaves it unknown with its holds until the bank's settlement
// file settles it. All cases run side by side, so the refund timeout is waited for once.
func TestCrashWorkerKilledDuringRefund(t *testing.T) {
	t.Parallel()
	type crashCase struct {
		capability, mode string
		s                *crashStack
		m                merchant
		paymentID, id    string
		killed           time.Time
	}
	var cases []*crashCase
	for _, capability := range []string{"idempotent", "inquiry", "none"} {
		for _, mode := range []string{"held", "lost"} {
			cases = append(cases, &crashCase{capability: capability, mode: mode})
		}
	}
	// The stack's reconciliation may settle an unlisted refund soon after it was sent.
	booking := []string{"KASA_PROVIDER_BOOKING_WINDOW", "1s"}

	// Phase 1, one case after the other: pay, refund, SIGKILL the worker in the middle of the
	// bank's refund, start a new one.
	for _, c := range cases {
		s := newCrashStack(t, crashConfig{capability: c.capability, providerTimeout: "8s", syncWait: "500ms"})
		c.s = s
		s.startBanksim()
		var proxy *chargeProxy
		if c.mode == "lost" {
			// Not for "held": the proxy would wait for the hung refund and never close.
			proxy = newChargeProxy(t, s.simURL())
			proxy.path = "/v1/refunds"
			s.providerURL = proxy.srv.URL
		}
		s.worker = startProc(t, s.dir, s.bin, "worker", s.env(booking...), "worker")
		s.startAPI(booking...)
		c.m = s.merchant()
		acct := s.account(c.m, "TRY", "100.00")
		r, err := s.pay(c.m, "pay", payBody("inv-pay", "50.00", "TRY", acct))
		require.NoError(t, err)
		require.Contains(t, []int{http.StatusCreated, http.StatusAccepted}, r.Status, "%s", r.Body)
		c.paymentID = r.json(t)["id"].(string)
		require.Equal(t, "succeeded", s.waitPayment(c.m, c.paymentID, time.Now().Add(30*time.Second))["status"])

		if c.mode == "lost" {
			proxy.swallow.Store(1)
		} else {
			s.setFaults(`{"rules":[{"on":"refund","action":"hang","count":1}]}`)
		}
		r, err = httpCall("POST", s.apiURL()+"/v1/payments/"+c.paymentID+"/refunds", c.m.APIKey, `{"amount":"20.00"}`, "Idempotency-Key", "refund")
		require.NoError(t, err)
		require.Equal(t, http.StatusAccepted, r.Status, "%s/%s: %s", c.capability, c.mode, r.Body)
		c.id = r.json(t)["id"].(string)
		want := 0
		if c.mode == "lost" {
			select {
			case <-proxy.charged:
			case <-time.After(15 * time.Second):
				t.Fatalf("%s/%s: the refund never reached the bank\n%s", c.capability, c.mode, testkit.Tail(s.worker.log, 30))
			}
			want = 1
		} else {
			s.waitFaultsUsed()
		}
		s.worker.kill()
		c.killed = time.Now()
		require.Equal(t, want, s.simRefundCount(c.id), "%s/%s: money moved by the killed worker's refund", c.capability, c.mode)
		require.Equal(t, "processing", s.refundOf(c.m, c.id)["status"])
		require.Equal(t, refundState{Held: 2000, Balance: 5000, Reserved: 2000, Refunds: 1, ActiveHolds: 1, Other: 1},
			readRefundState(t, s.dbURL, c.paymentID), "%s/%s: held while at the bank", c.capability, c.mode)
		s.worker = startProc(t, s.dir, s.bin, "worker", s.env(booking...), "worker")
	}

	// Phase 2: every outcome, once Temporal has timed the killed attempts out.
	deadline := time.Now().Add(100 * time.Second)
	for _, c := range cases {
		t.Run(c.capability+"/"+c.mode, func(t *testing.T) {
			s := c.s
			s.t = t
			rf := s.waitRefund(c.m, c.id, deadline)
			t.Logf("refund %s %v after the crash", rf["status"], time.Since(c.killed).Round(time.Second))
			n := s.simRefundCount(c.id)
			require.LessOrEqual(t, n, 1, "never two refunds at the bank")
			wantFile := reconcile.Counts{Matched: 1, RefundMatched: 1}
			if c.capability == "none" {
				// No inquiry and no idempotency: the crashed attempt is never re-sent and whether
				// money moved cannot be known: unknown, the holds kept.
				require.Equal(t, "unknown", rf["status"], "%v", rf)
				require.Equal(t, refundState{Held: 2000, Balance: 5000, Reserved: 2000, Refunds: 1, ActiveHolds: 1, Other: 1},
					readRefundState(t, s.dbURL, c.paymentID))
				require.Equal(t, map[string]int{"held": 0, "lost": 1}[c.mode], n)
				wantFile = reconcile.Counts{Matched: 1, RefundResolvedCharged: n, RefundResolvedNotCharged: 1 - n}
				time.Sleep(time.Second) // past the booking window: the bank's file is final for it
			} else {
				require.Equal(t, "succeeded", rf["status"], "%v", rf)
				require.Equal(t, 1, n, "exactly one refund at the bank")
			}
			s.verify()

			// The bank's own file for today settles what is unknown and agrees with the rest.
			file := s.mustCall("GET", s.simURL()+"/v1/settlements/"+today()+".csv", "", "")
			require.Equal(t, http.StatusOK, file.Status)
			imp := s.mustCall("POST", s.apiURL()+"/admin/v1/settlements?merchant_id="+c.m.ID, adminToken, string(file.Body), "Content-Type", "text/csv")
			rep, ok := decodeReport(t, imp)
			require.True(t, ok, "%+v %+v", rep.Mismatches, rep.RefundMismatches)
			require.Equal(t, wantFile, rep.Counts, "%+v", rep.RefundPending)

			rf = s.refundOf(c.m, c.id)
			require.Equal(t, n, s.simRefundCount(c.id), "settling never refunds")
			if n == 1 {
				require.Equal(t, "succeeded", rf["status"], "%v", rf)
				require.Equal(t, refundState{Refunded: 2000, Balance: 3000, Refunds: 1, Settled: 1, Postings: 1, Succeeded: 1},
					readRefundState(t, s.dbURL, c.paymentID))
				require.Equal(t, "20.00", s.payment(c.m, c.paymentID)["amount_refunded"])
			} else {
				require.Equal(t, "failed", rf["status"], "%v", rf)
				require.Equal(t, refundState{Balance: 5000, Refunds: 1, Failed: 1}, readRefundState(t, s.dbURL, c.paymentID))
			}
			s.verify()
		})
	}
}

// simRefundCount is how many times the stack's simulator moved money back for a reference.
func (s *crashStack) simRefundCount(reference string) int {
	s.t.Helper()
	return bankRefunds(s.t, s.simURL(), reference)
}

func (s *crashStack) refundOf(m merchant, id string) map[string]any {
	s.t.Helper()
	r := s.mustCall("GET", s.apiURL()+"/v1/refunds/"+id, m.APIKey, "")
	require.Equal(s.t, http.StatusOK, r.Status, "%s", r.Body)
	return r.json(s.t)
}

// waitRefund polls GET /v1/refunds/{id} until the refund leaves processing or the deadline.
func (s *crashStack) waitRefund(m merchant, id string, deadline time.Time) map[string]any {
	s.t.Helper()
	for {
		rf := s.refundOf(m, id)
		if rf["status"] != string(payment.StatusProcessing) || time.Now().After(deadline) {
			return rf
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// The steps of a refund run again after its post (the worker died before its workflow task
// completed): the send answers with the refund's record, not as an unanswered send, and the bank
// refunds once.
func TestRefundStepsRunAgainAfterThePost(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	paymentID, _ := s.paidFor(m, "again-pay", "50.00", "100.00")
	ctx := context.Background()
	req, err := payment.ParseRefundRequest([]byte(`{"amount":"20.00"}`))
	require.NoError(t, err)
	_, rf, began, err := db.BeginRefund(ctx, store.BeginRefundInput{MerchantID: mustUUID(t, m.ID), PaymentID: mustUUID(t, paymentID),
		Key: "again-ref", Request: req, OperationID: payment.NewID(), Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, store.BeganNew, began)
	a := &activities.Activities{Store: db, Provider: provider.New(s.sim.URL, 5*time.Second),
		Policy: workflows.ChargePolicy{Capability: workflows.CapabilityNone}}
	in := workflows.SendRefundInput{OperationID: rf.ID, PaymentID: rf.PaymentID, AmountMinor: rf.AmountMinor, Currency: rf.Currency,
		Capability: workflows.CapabilityNone, Send: 1}
	require.NoError(t, db.HoldRefundRun(ctx, rf.ID, "run-1"))
	first, err := a.SendRefund(ctx, in)
	require.NoError(t, err)
	require.NoError(t, a.PostRefund(ctx, workflows.PostRefundInput{OperationID: rf.ID, ProviderReference: first.ProviderReference}))
	require.NoError(t, db.HoldRefundRun(ctx, rf.ID, "run-1")) // the same steps again
	again, err := a.SendRefund(ctx, in)
	require.NoError(t, err, "the refund succeeded with %s", first.ProviderReference)
	require.Equal(t, first, again)
	require.Equal(t, 1, s.simRefunds(rf.ID.String()))
}
