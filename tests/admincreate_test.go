package tests

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/workflows"
)

// countRows runs a count(*) query on the package's database.
func countRows(t *testing.T, query string, args ...any) int {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, env.DatabaseURL)
	require.NoError(t, err)
	defer c.Close(ctx)
	var n int
	require.NoError(t, c.QueryRow(ctx, query, args...).Scan(&n))
	return n
}

// concurrently sends n copies of one request at once and returns their answers.
func (s *stack) concurrently(n int, method, path, body string, headers ...string) []response {
	s.t.Helper()
	out := make([]response, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r, err := httpCall(method, s.api.URL+path, adminToken, body, headers...)
			if err == nil {
				out[i] = r
			}
		})
	}
	wg.Wait()
	return out
}

// An operator's script retries an account's creation with its Idempotency-Key after losing the
// answer: one account, the replay byte-identical; the key with another body changes nothing;
// concurrent requests with one key make one account; without a key every request is new.
func TestAccountCreationRetriedWithKey(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	customers := func() int {
		return countRows(t, `SELECT count(*) FROM accounts WHERE merchant_id = $1 AND kind = 'customer'`, m.ID)
	}
	body := fmt.Sprintf(`{"merchant_id":%q,"currency":"TRY"}`, m.ID)
	key := "acct-" + uuid.NewString()

	first := s.do("POST", "/admin/v1/accounts", adminToken, body, "Idempotency-Key", key)
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
	require.Empty(t, first.Header.Get("Idempotent-Replayed"))
	again := s.do("POST", "/admin/v1/accounts", adminToken, body, "Idempotency-Key", key)
	require.Equal(t, http.StatusCreated, again.Status, "%s", again.Body)
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	require.Equal(t, string(first.Body), string(again.Body))
	require.Equal(t, 1, customers(), "a retried creation makes one account")

	requireProblem(t, s.do("POST", "/admin/v1/accounts", adminToken, fmt.Sprintf(`{"merchant_id":%q,"currency":"USD"}`, m.ID),
		"Idempotency-Key", key), http.StatusUnprocessableEntity, "idempotency_key_reused")
	require.Equal(t, 1, customers())
	// Keys are each merchant's own: another merchant's creation with the same key is its own.
	other := s.newMerchant()
	r := s.do("POST", "/admin/v1/accounts", adminToken, fmt.Sprintf(`{"merchant_id":%q,"currency":"TRY"}`, other.ID), "Idempotency-Key", key)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Empty(t, r.Header.Get("Idempotent-Replayed"))
	require.Equal(t, other.ID, r.json(t)["merchant_id"])
	require.Equal(t, 1, customers())
	requireProblem(t, s.do("POST", "/admin/v1/accounts", adminToken, body, "Idempotency-Key", "has space"), http.StatusBadRequest, "idempotency_key_invalid")

	concurrent := "acct-" + uuid.NewString()
	ids := map[string]bool{}
	for _, r := range s.concurrently(8, "POST", "/admin/v1/accounts", body, "Idempotency-Key", concurrent) {
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		ids[r.json(t)["id"].(string)] = true
	}
	require.Len(t, ids, 1, "concurrent requests with one key answer one account")
	require.Equal(t, 2, customers())

	for range 2 { // no key: a new account each time, as before
		r := s.do("POST", "/admin/v1/accounts", adminToken, body)
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		require.Empty(t, r.Header.Get("Idempotent-Replayed"))
	}
	require.Equal(t, 4, customers())
	require.Equal(t, 1, countRows(t, `SELECT count(*) FROM accounts WHERE merchant_id = $1 AND kind = 'settlement'`, m.ID))
}

// The same for a merchant: a retried creation with its key makes one merchant with one API key
// and answers the first creation's secrets (they work); the stored answer is sealed, never in
// clear; once retention has wiped it, a replay makes nothing and says how to get new secrets.
func TestMerchantCreationRetriedWithKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStack(t, workflows.CapabilityIdempotent)
	name := "Retried " + uuid.NewString()
	named := func() int { return countRows(t, `SELECT count(*) FROM merchants WHERE name = $1`, name) }
	body := fmt.Sprintf(`{"name":%q,"webhook_url":"http://127.0.0.1:9/hook"}`, name)
	key := "merchant-" + uuid.NewString()

	first := s.do("POST", "/admin/v1/merchants", adminToken, body, "Idempotency-Key", key)
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
	require.Empty(t, first.Header.Get("Idempotent-Replayed"))
	m := first.json(t)
	again := s.do("POST", "/admin/v1/merchants", adminToken, fmt.Sprintf(`{"webhook_url":"http://127.0.0.1:9/hook","name":"  %s "}`, name), "Idempotency-Key", key)
	require.Equal(t, http.StatusCreated, again.Status, "%s", again.Body)
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	require.Equal(t, string(first.Body), string(again.Body))
	require.Equal(t, 1, named(), "a retried creation makes one merchant")
	require.Equal(t, 1, countRows(t, `SELECT count(*) FROM api_keys WHERE merchant_id = $1`, m["id"]))

	// The replayed key is the merchant's: it authenticates.
	acct := s.newAccount(merchant{ID: m["id"].(string)}, "TRY", "")
	r := s.do("GET", "/v1/accounts/"+acct, again.json(t)["api_key"].(string), "")
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)

	// Kept sealed: neither secret is in the database in clear.
	for _, secret := range []string{m["api_key"].(string), m["webhook_secret"].(string)} {
		require.Zero(t, countRows(t, `SELECT count(*) FROM merchant_creations WHERE position(convert_to($1, 'UTF8') IN answer_enc) > 0`, secret))
	}
	require.Equal(t, 1, countRows(t, `SELECT count(*) FROM merchant_creations WHERE idempotency_key = $1 AND answer_enc IS NOT NULL`, key))

	requireProblem(t, s.do("POST", "/admin/v1/merchants", adminToken, `{"name":"Another"}`, "Idempotency-Key", key), http.StatusUnprocessableEntity, "idempotency_key_reused")
	requireProblem(t, s.do("POST", "/admin/v1/merchants", adminToken, fmt.Sprintf(`{"name":%q}`, name), "Idempotency-Key", key), http.StatusUnprocessableEntity, "idempotency_key_reused")
	require.Equal(t, 1, named())

	concurrentName := "Concurrent " + uuid.NewString()
	ids := map[string]bool{}
	for _, r := range s.concurrently(8, "POST", "/admin/v1/merchants", fmt.Sprintf(`{"name":%q}`, concurrentName), "Idempotency-Key", "merchant-"+uuid.NewString()) {
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		ids[r.json(t)["id"].(string)+r.json(t)["api_key"].(string)] = true
	}
	require.Len(t, ids, 1, "concurrent requests with one key answer one merchant")
	require.Equal(t, 1, countRows(t, `SELECT count(*) FROM merchants WHERE name = $1`, concurrentName))

	// Retention wipes the sealed answer (here: made two hours old, deleted by a one-hour retention).
	c, err := pgx.Connect(ctx, env.DatabaseURL)
	require.NoError(t, err)
	defer c.Close(ctx)
	_, err = c.Exec(ctx, `UPDATE merchant_creations SET created_at = now() - interval '2 hours' WHERE idempotency_key = $1`, key)
	require.NoError(t, err)
	_, err = db.DeleteExpiredRecords(ctx, time.Hour, 100)
	require.NoError(t, err)
	require.Equal(t, 1, countRows(t, `SELECT count(*) FROM merchant_creations WHERE idempotency_key = $1 AND answer_enc IS NULL`, key))
	late := s.do("POST", "/admin/v1/merchants", adminToken, body, "Idempotency-Key", key)
	requireProblem(t, late, http.StatusConflict, "idempotency_answer_expired")
	require.Contains(t, late.json(t)["detail"], m["id"].(string))
	require.Equal(t, 1, named(), "a late retry makes no second merchant")

	for range 2 { // no key: a new merchant each time, as before
		s.createMerchant(fmt.Sprintf(`{"name":%q}`, name))
	}
	require.Equal(t, 3, named())
}
