package store_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
)

// pairCounts counts the merchants' payments and idempotency records (other tests share the database).
func pairCounts(t *testing.T, merchants ...uuid.UUID) (payments, records int64) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.NoError(t, conn.QueryRow(ctx, `SELECT
  (SELECT count(*) FROM payments WHERE merchant_id = ANY($1)),
  (SELECT count(*) FROM idempotency_records WHERE merchant_id = ANY($1))`, merchants).Scan(&payments, &records))
	return payments, records
}

func TestPreloadLoadsFinishedPairsThatKeepInvariants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m1, a1 := fixture(t, 10_000)
	m2, _ := fixture(t, 0)
	a1Before, err := db.Account(ctx, a1)
	require.NoError(t, err)
	p0, r0 := pairCounts(t, m1, m2)

	var progress []int
	res, err := db.Preload(ctx, store.PreloadOptions{Merchants: []uuid.UUID{m1, m2}, N: 20_000, Chunk: 3_000,
		Progress: func(done, total int) {
			require.Equal(t, 20_000, total)
			progress = append(progress, done)
		}})
	require.NoError(t, err)
	require.Equal(t, 20_000, res.Rows)
	require.Positive(t, res.Elapsed)
	require.Equal(t, []int{3_000, 6_000, 9_000, 12_000, 15_000, 18_000, 20_000}, progress)

	p1, r1 := pairCounts(t, m1, m2)
	require.Equal(t, int64(20_000), p1-p0)
	require.Equal(t, int64(20_000), r1-r0)
	p2, r2 := pairCounts(t, m2)
	require.Equal(t, int64(10_000), p2, "round-robin over the merchants")
	require.Equal(t, int64(10_000), r2)

	// Row 12,345 is m2's (odd rows); its payment is failed and found by its key.
	key := res.KeyPrefix + strconv.Itoa(12_345)
	p, err := db.PaymentByKey(ctx, m2, key)
	require.NoError(t, err)
	require.Equal(t, payment.StatusFailed, p.Status)
	require.Equal(t, payment.FailureDeclined, p.FailureCode)
	require.Equal(t, "inv-"+key, p.InvoiceID)
	_, err = db.PaymentByKey(ctx, m1, key)
	require.ErrorIs(t, err, payment.ErrNotFound, "each row belongs to one merchant")

	// Its record is completed with the response the API would have stored.
	rec, err := db.Record(ctx, m2, key)
	require.NoError(t, err)
	require.Equal(t, store.RecordCompleted, rec.Status)
	require.Equal(t, p.ID, rec.OperationID)
	require.True(t, rec.WorkflowStarted)
	require.Equal(t, payment.StatusFailed, rec.Outcome)
	var body payment.Resource
	require.NoError(t, json.Unmarshal(rec.ResponseBody, &body))
	require.Equal(t, p.Resource(), body)
	require.Greater(t, len(rec.ResponseBody), 300)

	// The same request again is a replay of exactly the stored bytes: the idempotency path works on preloaded rows.
	req := payment.Request{InvoiceID: p.InvoiceID, AmountMinor: p.AmountMinor, Currency: p.Currency, AccountID: p.AccountID, PaymentType: p.PaymentType}
	require.Equal(t, req.Hash(), rec.RequestHash)
	again, _, began, err := db.Begin(ctx, store.BeginInput{MerchantID: m2, Key: key, Request: req, OperationID: payment.NewID(), Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, store.BeganExisting, began)
	require.Equal(t, rec, again)
	status, replayed, err := db.SaveResponse(ctx, m2, key, payment.StatusSucceeded, []byte(`{}`))
	require.NoError(t, err)
	require.Equal(t, payment.StatusFailed, status, "a stored response is never overwritten")
	require.Equal(t, rec.ResponseBody, replayed)

	// Failed payments move no money: balances are untouched and every invariant holds.
	a1After, err := db.Account(ctx, a1)
	require.NoError(t, err)
	require.Equal(t, a1Before, a1After)
	requireVerified(t)

	sizes, err := db.Sizes(ctx)
	require.NoError(t, err)
	byName := map[string]store.TableSize{}
	for _, s := range sizes {
		byName[s.Table] = s
	}
	for _, name := range []string{"payments", "idempotency_records"} {
		s, ok := byName[name]
		require.True(t, ok, "%s is listed: %v", name, sizes)
		require.Positive(t, s.TableBytes, name)
		require.Positive(t, s.IndexBytes, name)
		require.GreaterOrEqual(t, s.Rows, int64(20_000), "%s was analyzed after the preload", name)
	}
	require.NotContains(t, byName, "goose_db_version")
}

func TestPreloadNeedsCustomerAccounts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := payment.Merchant{ID: payment.NewID(), Name: "m"}
	require.NoError(t, db.CreateMerchant(ctx, m, payment.NewSecret("sk_"), "whsec"))
	_, err := db.Preload(ctx, store.PreloadOptions{Merchants: []uuid.UUID{m.ID}, N: 10})
	require.ErrorIs(t, err, payment.ErrNotFound)
	_, err = db.Preload(ctx, store.PreloadOptions{N: 10})
	require.Error(t, err)
	res, err := db.Preload(ctx, store.PreloadOptions{Merchants: []uuid.UUID{m.ID}})
	require.NoError(t, err)
	require.Zero(t, res.Rows)
}
