package harness

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/bench"
	"github.com/kasa-pay/kasa/tools/devenv"
	"github.com/kasa-pay/kasa/tools/testkit"
)

var (
	testURL string
	db      *store.Store
)

func TestMain(m *testing.M) {
	code := run(m)
	testkit.RemoveKasaBinary()
	os.Exit(code)
}

func run(m *testing.M) int {
	ctx := context.Background()
	env, err := devenv.StartTestEnv(ctx, devenv.TestNeeds{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "harness tests:", err)
		return 1
	}
	defer env.Stop()
	testURL = env.DatabaseURL
	db, err = store.Open(ctx, store.Options{URL: env.DatabaseURL, SecretKey: bytes.Repeat([]byte{1}, 32), Migrate: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "harness tests:", err)
		return 1
	}
	defer db.Close()
	return m.Run()
}

// fixture makes a merchant with one funded TRY account.
func fixture(t *testing.T, deposit int64) (merchantID, accountID uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	m := payment.Merchant{ID: payment.NewID(), Name: "m"}
	require.NoError(t, db.CreateMerchant(ctx, m, payment.NewSecret("sk_"), "whsec"))
	a, err := db.CreateAccount(ctx, m.ID, "TRY")
	require.NoError(t, err)
	if deposit > 0 {
		_, _, err = db.Deposit(ctx, a.ID, "seed", deposit)
		require.NoError(t, err)
	}
	return m.ID, a.ID
}

// pairCounts counts the merchants' payments and idempotency records (other tests share the database).
func pairCounts(t *testing.T, merchants ...uuid.UUID) (payments, records int64) {
	t.Helper()
	ids := make([]string, len(merchants))
	for i, m := range merchants {
		ids[i] = m.String()
	}
	sql, err := os.ReadFile("testdata/pair_counts.sql")
	require.NoError(t, err)
	out, err := bench.PSQL(context.Background(), testURL, sql, "-A", "-t", "-F", " ",
		"-v", "merchants={"+strings.Join(ids, ",")+"}")
	require.NoError(t, err)
	_, err = fmt.Sscan(out, &payments, &records)
	require.NoError(t, err)
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
	prefix, err := preload(ctx, testURL, []string{m1.String(), m2.String()}, 20_000, 3_000, func(done, total int) {
		require.Equal(t, 20_000, total)
		progress = append(progress, done)
	})
	require.NoError(t, err)
	require.Equal(t, []int{3_000, 6_000, 9_000, 12_000, 15_000, 18_000, 20_000}, progress)

	p1, r1 := pairCounts(t, m1, m2)
	require.Equal(t, int64(20_000), p1-p0)
	require.Equal(t, int64(20_000), r1-r0)
	p2, r2 := pairCounts(t, m2)
	require.Equal(t, int64(10_000), p2, "round-robin over the merchants")
	require.Equal(t, int64(10_000), r2)

	// Row 12,345 is m2's (odd rows); its payment is failed and found by its key.
	key := prefix + strconv.Itoa(12_345)
	p, err := db.PaymentByKey(ctx, m2, key)
	require.NoError(t, err)
	require.Equal(t, payment.StatusFailed, p.Status)
	require.Equal(t, payment.FailureDeclined, p.FailureCode)
	require.Equal(t, "inv-"+key, p.InvoiceID)
	require.Equal(t, int64(100+12_345*7919%1_000_000), p.AmountMinor)
	require.Equal(t, byte(7), p.ID[6]>>4, "a UUIDv7, as payment.NewID mints")
	_, err = db.PaymentByKey(ctx, m1, key)
	require.ErrorIs(t, err, payment.ErrNotFound, "each row belongs to one merchant")

	// Its record is completed with the answer the API would have stored, byte for byte.
	rec, err := db.Record(ctx, m2, key)
	require.NoError(t, err)
	require.Equal(t, store.RecordCompleted, rec.Status)
	require.Equal(t, p.ID, rec.OperationID)
	require.True(t, rec.WorkflowStarted)
	require.Equal(t, payment.StatusFailed, rec.Outcome)
	body, err := p.AnswerBody()
	require.NoError(t, err)
	require.Equal(t, string(body), string(rec.ResponseBody))
	require.Greater(t, len(rec.ResponseBody), 300)

	// The same request again is a replay of exactly the stored bytes: the idempotency path works on preloaded rows.
	req := payment.Request{InvoiceID: p.InvoiceID, AmountMinor: p.AmountMinor, Currency: p.Currency, AccountID: p.AccountID, PaymentType: p.PaymentType}
	require.Equal(t, req.Hash(), rec.RequestHash)
	again, _, began, err := db.Begin(ctx, store.BeginInput{MerchantID: m2, Key: key, Request: req, OperationID: payment.NewID(), Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, store.BeganExisting, began)
	require.Equal(t, rec, again)
	stored, replayed, err := db.SaveResponse(ctx, m2, key, payment.StatusSucceeded, []byte(`{}`))
	require.NoError(t, err)
	require.Equal(t, payment.StatusFailed, stored, "a stored response is never overwritten")
	require.Equal(t, rec.ResponseBody, replayed)

	// Failed payments move no money: balances are untouched and every invariant holds.
	a1After, err := db.Account(ctx, a1)
	require.NoError(t, err)
	require.Equal(t, a1Before, a1After)
	problems, err := db.Verify(ctx)
	require.NoError(t, err)
	require.Empty(t, problems)

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
	none := func(int, int) { t.Error("no chunk may commit") }
	_, err := preload(ctx, testURL, []string{m.ID.String()}, 10, preloadChunk, none)
	require.ErrorContains(t, err, "merchant "+m.ID.String()+" has no customer account")
	_, err = preload(ctx, testURL, nil, 10, preloadChunk, none)
	require.Error(t, err)
	_, err = preload(ctx, testURL, []string{m.ID.String()}, 0, preloadChunk, none)
	require.NoError(t, err)
	p, r := pairCounts(t, m.ID)
	require.Zero(t, p+r)
}
