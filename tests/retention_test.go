package tests

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/workflows"
)

// expire makes the key's record look finished two hours ago, as one minted then would be, and
// runs retention with a one-hour retention: only records aged on purpose are old enough, so
// the package's other tests keep theirs.
func expire(t *testing.T, merchantID, key string) { expireScope(t, merchantID, "payment", key) }

// expireScope is expire for a key of scope "payment" or "refund".
func expireScope(t *testing.T, merchantID, scope, key string) {
	t.Helper()
	ctx := context.Background()
	age(t, merchantID, scope, key)
	n, err := db.DeleteExpiredRecords(ctx, time.Hour, 100)
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, int64(1))
	read := db.Record
	if scope == "refund" {
		read = db.RefundRecord
	}
	_, err = read(ctx, uuid.MustParse(merchantID), key)
	require.ErrorIs(t, err, payment.ErrNotFound, "the record is gone")
}

// age makes the key's record look finished two hours ago, as one minted then would be.
func age(t *testing.T, merchantID, scope, key string) {
	t.Helper()
	then := time.Now().Add(-2 * time.Hour)
	id := payment.NewID()
	ms := uint64(then.UnixMilli())
	for i := 0; i < 6; i++ {
		id[i] = byte(ms >> (40 - 8*i))
	}
	conn := connect(t, env.DatabaseURL)
	tag, err := conn.Exec(context.Background(), `UPDATE idempotency_records SET operation_id = $3, updated_at = $4
		WHERE merchant_id = $1 AND scope = $5 AND idempotency_key = $2 AND status = 'completed'`,
		uuid.MustParse(merchantID), key, id, then, scope)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
}

// A refund's key names its refund for good: once its record expired, a retry of the same
// refund, or another request under the key, answers 422 and the bank refunds nothing more.
func TestExpiredRefundKeyRefundsNothingMore(t *testing.T) {
	t.Parallel()
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: tc, retention: 2 * time.Second})
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	paid := s.pay(m, "exp-refund-pay", payBody("inv-r", "40.00", "TRY", acct))
	require.Equal(t, http.StatusCreated, paid.Status, "%s", paid.Body)
	paymentID := paid.json(t)["id"].(string)

	first := s.refund(m, paymentID, "exp-refund", `{"amount":"10.00"}`)
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
	refundID := first.json(t)["id"].(string)
	time.Sleep(2100 * time.Millisecond) // older than the API's retention: not answered from memory
	expireScope(t, m.ID, "refund", "exp-refund")

	for _, body := range []string{`{"amount":"10.00"}`, `{"amount":"5.00"}`, `{}`} {
		again := s.refund(m, paymentID, "exp-refund", body)
		require.Equal(t, http.StatusUnprocessableEntity, again.Status, "%s: %s", body, again.Body)
		require.Equal(t, "idempotency_key_reused", again.json(t)["code"])
	}
	require.Equal(t, 1, s.simRefunds(refundID))
	list := s.do("GET", "/v1/payments/"+paymentID+"/refunds", m.APIKey, "")
	require.Equal(t, http.StatusOK, list.Status, "%s", list.Body)
	require.Len(t, list.json(t)["data"], 1, "no second refund")
	require.Equal(t, "70.00", s.account(m, acct)["balance"], "paid 40, refunded 10 once")
	requireVerified(t)
}

// An expired key is a new request: the same key with another invoice makes a new payment, whose
// workflow (same workflow id as the first, now closed) runs and charges; the old payment stays.
// The same key with the first invoice meets the business key: 409 duplicate_payment.
func TestExpiredKeyIsANewRequest(t *testing.T) {
	t.Parallel()
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: tc, retention: 2 * time.Second})
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")

	first := s.pay(m, "exp-key", payBody("inv-1", "10.00", "TRY", acct))
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
	firstID := first.json(t)["id"].(string)
	replay := s.pay(m, "exp-key", payBody("inv-1", "10.00", "TRY", acct))
	require.Equal(t, "true", replay.Header.Get("Idempotent-Replayed"), "replayed, and now in the API's memory")

	time.Sleep(2100 * time.Millisecond) // older than the API's retention: not answered from memory
	expire(t, m.ID, "exp-key")

	dup := s.pay(m, "exp-key", payBody("inv-1", "10.00", "TRY", acct))
	require.Equal(t, http.StatusConflict, dup.Status, "%s", dup.Body)
	require.Equal(t, "duplicate_payment", dup.json(t)["code"])
	require.Equal(t, firstID, dup.json(t)["payment_id"])

	second := s.pay(m, "exp-key", payBody("inv-2", "15.00", "TRY", acct))
	require.Equal(t, http.StatusCreated, second.Status, "%s", second.Body)
	secondID := second.json(t)["id"].(string)
	require.NotEqual(t, firstID, secondID)
	require.Equal(t, "succeeded", second.json(t)["status"])
	require.Empty(t, second.Header.Get("Idempotent-Replayed"))
	require.Equal(t, 1, s.simCount(firstID))
	require.Equal(t, 1, s.simCount(secondID), "the new payment's workflow ran and charged once")
	require.Equal(t, "75.00", s.account(m, acct)["balance"], "both payments kept")

	again := s.pay(m, "exp-key", payBody("inv-2", "15.00", "TRY", acct))
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"), "the key now names the new payment")
	require.Equal(t, string(second.Body), string(again.Body))
	byKey := s.do("GET", "/v1/payments?idempotency_key=exp-key", m.APIKey, "")
	require.Equal(t, http.StatusOK, byKey.Status, "%s", byKey.Body)
	require.Equal(t, secondID, byKey.json(t)["id"], "the newest payment of the key")
	old := s.do("GET", "/v1/payments/"+firstID, m.APIKey, "")
	require.Equal(t, http.StatusOK, old.Status)
	require.Equal(t, "succeeded", old.json(t)["status"])
	requireVerified(t)
}

// A failed payment does not hold its invoice: once its key expired, the same request is a new
// payment, which runs.
func TestExpiredKeyOfAFailedPaymentPaysAgain(t *testing.T) {
	t.Parallel()
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: tc, retention: time.Hour})
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "10.00")
	body := payBody("inv-f", "20.00", "TRY", acct)
	first := s.pay(m, "exp-failed", body)
	require.Equal(t, http.StatusPaymentRequired, first.Status, "%s", first.Body)
	r := s.do("POST", "/admin/v1/accounts/"+acct+"/deposits", adminToken, `{"amount":"20.00"}`, "Idempotency-Key", "more-"+acct)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	expire(t, m.ID, "exp-failed")

	second := s.pay(m, "exp-failed", body)
	require.Equal(t, http.StatusCreated, second.Status, "%s", second.Body)
	require.NotEqual(t, first.json(t)["id"], second.json(t)["id"])
	require.Equal(t, 1, s.simCount(second.json(t)["id"].(string)))
	requireVerified(t)
}

// An API answers from its replay cache only records younger than the shortest retention the
// workers, which delete them, announced: with its own longer one it would replay the old answer of
// a key whose record the workers deleted and which has since named a new payment.
func TestNoReplayOfARecordTheWorkersDeleted(t *testing.T) {
	t.Parallel()
	a := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: tc, retention: 72 * time.Hour})
	b := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: tc, retention: time.Hour})
	require.NoError(t, db.SeeRetention(context.Background(), time.Hour)) // as the workers' record retention does
	time.Sleep(3 * stackRetentionFollow)
	m := a.newMerchant()
	acct := a.newAccount(m, "TRY", "10.00")
	body := payBody("inv-cache", "20.00", "TRY", acct)
	first := a.pay(m, "cache-key", body)
	require.Equal(t, http.StatusPaymentRequired, first.Status, "%s", first.Body)
	age(t, m.ID, "payment", "cache-key") // finished two hours ago: past the workers' retention
	replay := a.pay(m, "cache-key", body)
	require.Equal(t, "true", replay.Header.Get("Idempotent-Replayed"), "%s", replay.Body)

	r := a.do("POST", "/admin/v1/accounts/"+acct+"/deposits", adminToken, `{"amount":"20.00"}`, "Idempotency-Key", "more-"+acct)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	expire(t, m.ID, "cache-key")
	second := b.pay(m, "cache-key", body)
	require.Equal(t, http.StatusCreated, second.Status, "%s", second.Body)
	onA := a.pay(m, "cache-key", body)
	require.Equal(t, http.StatusCreated, onA.Status, "the key's answer now, not the deleted one A read before: %s", onA.Body)
	require.Equal(t, string(second.Body), string(onA.Body))
}
