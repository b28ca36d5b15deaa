package tests

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/workflows"
)

// Keys at the edge of what docs/api.md allows: 255 printable ASCII characters, every punctuation
// character, slashes and percent signs that look like paths and escapes. Each names one payment,
// one refund and one capture end to end; two long keys alike in their first 250 characters are
// two operations; one character more is refused before anything is written.
func TestKeyEdgesLengthAndBytes(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	punct := `!"#$%&'()*+,-./:;<=>?@[\]^_` + "`" + `{|}~`
	long := strings.Repeat("k", 250)
	keys := []struct{ name, key string }{
		{"255 characters", strings.Repeat("x", 255)},
		{"255 of every punctuation", strings.Repeat(punct, 255/len(punct)+1)[:255]},
		{"alike but the last", long + "aaaaa"},
		{"alike but the last, again", long + "aaaab"},
		{"a path", "../payment/" + m.ID + "/x"},
		{"escapes", "%2F%00%FF+%20"},
		{"one character", "~"},
	}
	for i, k := range keys {
		require.True(t, payment.ValidKey(k.key), k.name)
		payer := s.newAccount(m, "TRY", "100.00")
		invoice := fmt.Sprintf("inv-edge-%d", i)
		first := s.pay(m, k.key, payBody(invoice, "10.00", "TRY", payer))
		require.Equal(t, http.StatusCreated, first.Status, "%s: %s", k.name, first.Body)
		id := first.json(t)["id"].(string)
		again := s.pay(m, k.key, payBody(invoice, "10.00", "TRY", payer))
		require.Equal(t, http.StatusCreated, again.Status, "%s: %s", k.name, again.Body)
		require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"), k.name)
		require.Equal(t, string(first.Body), string(again.Body), k.name)
		byKey := s.do("GET", "/v1/payments?idempotency_key="+url.QueryEscape(k.key), m.APIKey, "")
		require.Equal(t, http.StatusOK, byKey.Status, "%s: %s", k.name, byKey.Body)
		require.Equal(t, id, byKey.json(t)["id"], k.name)
		require.Equal(t, 1, s.simCount(id), k.name)

		rf := s.refund(m, id, k.key, `{"amount":"4.00"}`)
		require.Equal(t, http.StatusCreated, rf.Status, "%s: %s", k.name, rf.Body)
		rfAgain := s.refund(m, id, k.key, `{"amount":"4.00"}`)
		require.Equal(t, "true", rfAgain.Header.Get("Idempotent-Replayed"), "%s: %s", k.name, rfAgain.Body)
		require.Equal(t, string(rf.Body), string(rfAgain.Body), k.name)
		require.Equal(t, 1, s.simRefunds(rf.json(t)["id"].(string)), k.name)
		require.Equal(t, "94.00", s.account(m, payer)["balance"], k.name)

		// A manual payment under the key with a suffix that fits, captured under the key.
		mk := fmt.Sprintf("m%d-%s", i, k.key)
		mk = mk[:min(len(mk), 255)]
		auth := s.pay(m, mk, manualBody(invoice+"-m", "20.00", payer))
		require.Equal(t, http.StatusCreated, auth.Status, "%s: %s", k.name, auth.Body)
		mid := auth.json(t)["id"].(string)
		cap1 := s.command(m, mid, "capture", k.key, `{"amount":"5.00"}`)
		require.Equal(t, http.StatusCreated, cap1.Status, "%s: %s", k.name, cap1.Body)
		cap2 := s.command(m, mid, "capture", k.key, `{"amount":"5.00"}`)
		require.Equal(t, "true", cap2.Header.Get("Idempotent-Replayed"), "%s: %s", k.name, cap2.Body)
		require.Equal(t, int64(500), s.held(mid).CapturedMinor, k.name)
		require.Equal(t, "89.00", s.account(m, payer)["balance"], k.name)
	}
	require.Equal(t, len(keys), countRows(t, `SELECT count(*) FROM payments WHERE merchant_id = $1 AND NOT capture_manual`, m.ID))

	tooLong := strings.Repeat("x", 256)
	payer := s.newAccount(m, "TRY", "100.00")
	requireProblem(t, s.pay(m, tooLong, payBody("inv-too-long", "1.00", "TRY", payer)), http.StatusBadRequest, "idempotency_key_invalid")
	requireProblem(t, s.do("GET", "/v1/payments?idempotency_key="+tooLong, m.APIKey, ""), http.StatusBadRequest, "idempotency_key_invalid")
	require.Zero(t, countRows(t, `SELECT count(*) FROM payments WHERE account_id = $1`, payer))
	requireVerified(t)
}

// A refund key names one refund of one payment: sent for another payment of the merchant, before
// and after its record expired, it answers 422 and that payment is refunded nothing, held nothing.
func TestKeyEdgesRefundKeyOnAnotherPayment(t *testing.T) {
	t.Parallel()
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: tc, retention: 2 * time.Second})
	m := s.newMerchant()
	payer := s.newAccount(m, "TRY", "100.00")
	p1 := s.pay(m, "other-p1", payBody("inv-o1", "30.00", "TRY", payer))
	require.Equal(t, http.StatusCreated, p1.Status, "%s", p1.Body)
	p2 := s.pay(m, "other-p2", payBody("inv-o2", "30.00", "TRY", payer))
	require.Equal(t, http.StatusCreated, p2.Status, "%s", p2.Body)
	id1, id2 := p1.json(t)["id"].(string), p2.json(t)["id"].(string)

	first := s.refund(m, id1, "other-refund", `{"amount":"10.00"}`)
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
	refundsOf2 := func() int { return countRows(t, `SELECT count(*) FROM refunds WHERE payment_id = $1`, id2) }
	for _, body := range []string{`{"amount":"10.00"}`, `{}`} {
		requireProblem(t, s.refund(m, id2, "other-refund", body), http.StatusUnprocessableEntity, "idempotency_key_reused")
	}
	require.Zero(t, refundsOf2())

	time.Sleep(2100 * time.Millisecond)
	expireScope(t, m.ID, "refund", "other-refund")
	for _, body := range []string{`{"amount":"10.00"}`, `{}`} {
		requireProblem(t, s.refund(m, id2, "other-refund", body), http.StatusUnprocessableEntity, "idempotency_key_reused")
	}
	require.Zero(t, refundsOf2())
	require.Equal(t, 1, countRows(t, `SELECT count(*) FROM payments WHERE id = $1 AND refunded_minor = 0 AND refund_held_minor = 0`, id2),
		"nothing refunded or held on the other payment")
	require.Equal(t, "50.00", s.account(m, payer)["balance"], "paid 60, refunded 10 once")
	requireVerified(t)
}

// The same key sent at once with different bodies: one request makes the key's one operation,
// every other one answers 409 (in use) or 422 (reused); one charge at the bank, one set of
// postings, and for refunds one refund, whichever body won.
func TestKeyEdgesSameKeyConcurrentDifferentBodies(t *testing.T) {
	t.Parallel()
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: tc, apis: 2})
	m := s.newMerchant()
	payer := s.newAccount(m, "TRY", "1000.00")
	const n = 8
	answers := make([]response, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			answers[i] = s.doAt(i%2, "POST", "/v1/payments", m.APIKey,
				payBody(fmt.Sprintf("inv-race-%d", i), fmt.Sprintf("%d.00", 10+i), "TRY", payer), "Idempotency-Key", "race-key")
		})
	}
	wg.Wait()
	won := -1
	for i, a := range answers {
		switch a.Status {
		case http.StatusCreated:
			require.Equal(t, -1, won, "two requests made a payment: %s", a.Body)
			won = i
		case http.StatusConflict:
			require.Equal(t, "idempotency_key_in_use", a.json(t)["code"], "%s", a.Body)
		default:
			requireProblem(t, a, http.StatusUnprocessableEntity, "idempotency_key_reused")
		}
	}
	require.Equal(t, 1, countRows(t, `SELECT count(*) FROM payments WHERE merchant_id = $1 AND idempotency_key = 'race-key'`, m.ID))
	p := paymentByKey(t, m, "race-key")
	require.Eventually(t, func() bool { return paymentByKey(t, m, "race-key").Status == payment.StatusSucceeded }, 20*time.Second, 50*time.Millisecond)
	require.Equal(t, 1, s.simCount(p.ID.String()))
	require.Equal(t, 1, countRows(t, `SELECT count(*) FROM ledger_postings WHERE reference = $1`, p.ID.String()))
	require.Equal(t, fmt.Sprintf("%d.00", 1000-p.AmountMinor/100), s.account(m, payer)["balance"])
	if won >= 0 {
		require.Equal(t, p.ID.String(), answers[won].json(t)["id"])
	}

	// Refunds of the one payment, with one key and different amounts.
	for i := range n {
		wg.Go(func() {
			answers[i] = s.refundAt(i%2, m, p.ID.String(), "race-refund", fmt.Sprintf(`{"amount":"%d.00"}`, 1+i))
		})
	}
	wg.Wait()
	for _, a := range answers {
		switch a.Status {
		case http.StatusCreated:
		case http.StatusConflict:
			require.Equal(t, "idempotency_key_in_use", a.json(t)["code"], "%s", a.Body)
		default:
			requireProblem(t, a, http.StatusUnprocessableEntity, "idempotency_key_reused")
		}
	}
	require.Equal(t, 1, countRows(t, `SELECT count(*) FROM refunds WHERE payment_id = $1`, p.ID))
	requireVerified(t)
}

// A manual payment's key, once its capture finished and its record expired, is a new request that
// the business key refuses; the capture's key, kept for good, still replays the capture.
func TestKeyEdgesCapturedPaymentPastRetention(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	id, payer, _ := s.authorize(m, "wait-key", "20.00", "50.00")
	captured := s.command(m, id, "capture", "wait-capture", `{"amount":"20.00"}`)
	require.Equal(t, http.StatusCreated, captured.Status, "%s", captured.Body)
	expire(t, m.ID, "wait-key")
	dup := s.pay(m, "wait-key", manualBody("inv-wait-key", "20.00", payer))
	requireProblem(t, dup, http.StatusConflict, "duplicate_payment")
	require.Equal(t, id, dup.json(t)["payment_id"])
	replayed := s.command(m, id, "capture", "wait-capture", `{"amount":"20.00"}`)
	require.Equal(t, "true", replayed.Header.Get("Idempotent-Replayed"), "%s", replayed.Body)
	require.Equal(t, string(captured.Body), string(replayed.Body))
	require.Equal(t, int64(2000), s.held(id).CapturedMinor)
	require.Equal(t, "30.00", s.account(m, payer)["balance"])
	requireVerified(t)
}

// A key retried over and over on two APIs while retention deletes its record: every answer is the
// old payment's (a replay of its 402) or the one new payment's (its 201, replays of it, or 409
// while it runs), never an error; the expired key makes exactly one new payment, charged once.
func TestKeyEdgesRetriedWhileRetentionDeletesIt(t *testing.T) {
	t.Parallel()
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: tc, retention: time.Hour, apis: 2})
	m := s.newMerchant()
	payer := s.newAccount(m, "TRY", "10.00")
	body := payBody("inv-deleting", "20.00", "TRY", payer)
	first := s.pay(m, "deleting", body)
	require.Equal(t, http.StatusPaymentRequired, first.Status, "%s", first.Body)
	firstID := first.json(t)["id"].(string)
	r := s.do("POST", "/admin/v1/accounts/"+payer+"/deposits", adminToken, `{"amount":"20.00"}`, "Idempotency-Key", "more-"+payer)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	age(t, m.ID, "payment", "deleting")

	var mu sync.Mutex
	var answers []response
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				a := s.doAt(i%2, "POST", "/v1/payments", m.APIKey, body, "Idempotency-Key", "deleting")
				mu.Lock()
				answers = append(answers, a)
				mu.Unlock()
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	n, err := db.DeleteExpiredRecords(t.Context(), time.Hour, 100)
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, int64(1))
	require.Eventually(t, func() bool {
		p := paymentByKey(t, m, "deleting")
		return p.ID.String() != firstID && p.Status.Final()
	}, 30*time.Second, 50*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()

	secondID := paymentByKey(t, m, "deleting").ID.String()
	news := 0
	for _, a := range answers {
		switch {
		case a.Status == http.StatusPaymentRequired:
			require.Equal(t, string(first.Body), string(a.Body), "only the first payment failed")
		case a.Status == http.StatusCreated:
			require.Equal(t, secondID, a.json(t)["id"], "%s", a.Body)
			if a.Header.Get("Idempotent-Replayed") == "" {
				news++
			}
		case a.Status == http.StatusConflict:
			require.Equal(t, "idempotency_key_in_use", a.json(t)["code"], "%s", a.Body)
		case a.Status == http.StatusAccepted:
			require.Equal(t, secondID, a.json(t)["id"], "%s", a.Body)
		default:
			t.Fatalf("unexpected answer %d: %s", a.Status, a.Body)
		}
	}
	require.LessOrEqual(t, news, 1, "one request made the new payment")
	require.Equal(t, 2, countRows(t, `SELECT count(*) FROM payments WHERE merchant_id = $1 AND idempotency_key = 'deleting'`, m.ID))
	require.Equal(t, 1, s.simCount(secondID))
	require.Zero(t, s.simCount(firstID))
	require.Equal(t, "10.00", s.account(m, payer)["balance"])
	requireVerified(t)
}

// A key whose payment waits in the start backlog is in use: the same request answers 409 with a
// Retry-After, another request under it 422, a look-up by the key finds the queued payment, and
// nothing is charged or started twice for it.
func TestKeyEdgesQueuedPaymentsKey(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	payer := s.newAccount(m, "TRY", "100.00")
	p := beginPayment(t, m, payer, "queued-key", "25.00", 0, true)
	same := s.pay(m, "queued-key", payBody("inv-queued-key", "25.00", "TRY", payer))
	requireProblem(t, same, http.StatusConflict, "idempotency_key_in_use")
	require.NotEmpty(t, same.Header.Get("Retry-After"))
	requireProblem(t, s.pay(m, "queued-key", payBody("inv-queued-key", "26.00", "TRY", payer)), http.StatusUnprocessableEntity, "idempotency_key_reused")
	byKey := s.do("GET", "/v1/payments?idempotency_key=queued-key", m.APIKey, "")
	require.Equal(t, http.StatusOK, byKey.Status, "%s", byKey.Body)
	require.Equal(t, p.ID.String(), byKey.json(t)["id"])
	require.Equal(t, "processing", byKey.json(t)["status"])
	require.Zero(t, s.simCount(p.ID.String()))
	require.Equal(t, 1, countRows(t, `SELECT count(*) FROM payments WHERE merchant_id = $1`, m.ID))
}
