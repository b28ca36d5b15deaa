package store_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", for goose
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// shardRows are a settlement account's shards: balance and reserved by shard number.
func shardRows(t *testing.T, s *store.Store, account uuid.UUID) map[int16][2]int64 {
	t.Helper()
	var shards []int16
	var balances, reserved []int64
	require.NoError(t, s.QueryRow(context.Background(), `SELECT coalesce(array_agg(shard ORDER BY shard), '{}'),
		coalesce(array_agg(balance ORDER BY shard), '{}'), coalesce(array_agg(reserved ORDER BY shard), '{}')
		FROM settlement_shards WHERE account_id = $1`, []any{account}, &shards, &balances, &reserved))
	out := map[int16][2]int64{}
	for i, n := range shards {
		out[n] = [2]int64{balances[i], reserved[i]}
	}
	return out
}

// payout takes amount off a merchant's settlement account with a balanced posting to the payer
// (standing in for money leaving), from the shards in shard order.
func payout(t *testing.T, settlement, payer uuid.UUID, amount int64) {
	t.Helper()
	require.NoError(t, db.Exec(context.Background(), `WITH p AS (INSERT INTO ledger_postings (id, kind, reference) VALUES (gen_random_uuid(), 'reversal', 'payout-' || gen_random_uuid()) RETURNING id),
e AS (INSERT INTO ledger_entries (id, posting_id, account_id, currency, amount_minor)
      SELECT gen_random_uuid(), p.id, x.acc, 'TRY', x.amt FROM p, (VALUES ($1::uuid, -$3::bigint), ($2::uuid, $3::bigint)) x(acc, amt)),
c AS (UPDATE accounts SET balance = balance + $3 WHERE id = $2),
s AS (SELECT shard, balance - reserved AS avail, sum(balance - reserved) OVER (ORDER BY shard) - (balance - reserved) AS before
      FROM settlement_shards WHERE account_id = $1)
UPDATE settlement_shards x SET balance = x.balance - least(s.avail, greatest(0, $3 - s.before))
FROM s WHERE x.account_id = $1 AND x.shard = s.shard`, settlement, payer, amount))
}

// A merchant's payments credit several shards of its settlement account, never its own row; the
// account's balance is their sum.
func TestSettlementCreditsSpreadOverShards(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 1_000_000)
	var total int64
	for i := range 40 {
		paid(t, mID, aID, int64(100+i))
		total += int64(100 + i)
	}
	settlement := settlementAccount(t, mID)
	require.Equal(t, [2]int64{total, 0}, [2]int64{settlement.Balance, settlement.Reserved})
	shards := shardRows(t, db, settlement.ID)
	require.Greater(t, len(shards), 4, "40 payments over 16 shards: %v", shards)
	var sum int64
	for n, s := range shards {
		require.Less(t, n, int16(16))
		sum += s[0]
	}
	require.Equal(t, total, sum)
	var own [2]int64
	require.NoError(t, db.QueryRow(ctx, `SELECT balance, reserved FROM accounts WHERE id = $1`, []any{settlement.ID}, &own[0], &own[1]))
	require.Equal(t, [2]int64{0, 0}, own, "the account's own row holds nothing")
	requireVerified(t)
}

// A refund's hold may span shards: it succeeds when their sum covers it though no shard does,
// and is refused when the sum does not, even by one minor unit. Posting and releasing take the
// held amount back from whichever shards hold it; no shard is ever below its reserved amount.
func TestRefundHoldSpansShards(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 1_000_000)
	big := paid(t, mID, aID, 16_000)
	second := paid(t, mID, aID, 16_000)
	settlement := settlementAccount(t, mID)
	// The 32,000 spread evenly over the 16 shards (the sum, and so the ledger, unchanged).
	require.NoError(t, db.Exec(ctx, `INSERT INTO settlement_shards (account_id, shard, balance)
		SELECT $1, g, 2000 FROM generate_series(0, 15) g
		ON CONFLICT (account_id, shard) DO UPDATE SET balance = excluded.balance`, settlement.ID))
	requireVerified(t)

	_, r1, _, err := beginRefund(t, mID, big, "r1", `{}`)
	require.NoError(t, err)
	require.NoError(t, db.HoldRefund(ctx, r1.ID), "16,000 over shards of 2,000 each")
	require.NoError(t, db.HoldRefund(ctx, r1.ID), "a repeat holds nothing more")
	b, res := balance(t, settlement.ID)
	require.Equal(t, [2]int64{32_000, 16_000}, [2]int64{b, res})
	requireVerified(t)

	// 16,000 is available; a payout leaves 15,999: the second refund's 16,000 is refused.
	payout(t, settlement.ID, aID, 1)
	_, r2, _, err := beginRefund(t, mID, second, "r2", `{}`)
	require.NoError(t, err)
	require.ErrorIs(t, db.HoldRefund(ctx, r2.ID), payment.ErrInsufficientFunds)
	b, res = balance(t, settlement.ID)
	require.Equal(t, [2]int64{31_999, 16_000}, [2]int64{b, res}, "nothing held")
	_, err = db.ReleaseRefund(ctx, r2.ID, payment.FailureInsufficientFunds)
	require.NoError(t, err)

	// A refund of 15,999 of the second payment fits exactly, leaving no shard anything available.
	_, r3, _, err := beginRefund(t, mID, second, "r3", `{"amount":"159.99"}`)
	require.NoError(t, err)
	require.NoError(t, db.HoldRefund(ctx, r3.ID))
	for n, s := range shardRows(t, db, settlement.ID) {
		require.Equal(t, s[0], s[1], "shard %d: all of it held", n)
	}
	requireVerified(t)

	// The first is posted, the third released: each takes its amount back from the shards.
	_, err = db.PostRefund(ctx, r1.ID, "rf_1")
	require.NoError(t, err)
	b, res = balance(t, settlement.ID)
	require.Equal(t, [2]int64{15_999, 15_999}, [2]int64{b, res})
	_, err = db.ReleaseRefund(ctx, r3.ID, "declined")
	require.NoError(t, err)
	b, res = balance(t, settlement.ID)
	require.Equal(t, [2]int64{15_999, 0}, [2]int64{b, res})
	for n, s := range shardRows(t, db, settlement.ID) {
		require.GreaterOrEqual(t, s[0], int64(0), "shard %d", n)
		require.Zero(t, s[1], "shard %d", n)
	}
	requireVerified(t)
}

// The database refuses a shard below its reserved amount and a balance on a settlement
// account's own row, whatever the code does.
func TestSettlementShardsAreChecked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 100_000)
	paid(t, mID, aID, 1_000)
	settlement := settlementAccount(t, mID)
	for _, stmt := range []string{
		`UPDATE settlement_shards SET reserved = balance + 1 WHERE account_id = $1`,
		`UPDATE settlement_shards SET balance = -1 WHERE account_id = $1`,
		`UPDATE accounts SET balance = balance + 1 WHERE id = $1`,
	} {
		require.Error(t, db.Exec(ctx, stmt, settlement.ID), stmt)
	}
	requireVerified(t)
}

// One merchant's settlement account under 200 payments and 50 refunds at once: the balance is
// exact (deposits less refunds), never less than what it holds, and verify stays clean.
func TestConcurrentCreditsAndRefundsOnOneMerchant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 100_000_000)
	settlement := settlementAccount(t, mID)
	// 50 payments to refund, then a payout leaving the account 20,000 of their 50,000: whether a
	// refund finds enough depends on the payments that arrive meanwhile.
	refundable := make([]uuid.UUID, 50)
	for i := range refundable {
		refundable[i] = paid(t, mID, aID, 1_000)
	}
	settlement = settlementAccount(t, mID)
	payout(t, settlement.ID, aID, 30_000)
	refunds := make([]payment.Refund, len(refundable))
	for i, p := range refundable {
		var err error
		_, refunds[i], _, err = beginRefund(t, mID, p, "r"+p.String(), `{}`)
		require.NoError(t, err)
	}
	pending := make([]uuid.UUID, 200)
	for i := range pending {
		key := uuid.NewString()
		_, p, ok, err := begin(t, mID, aID, key, key, int64(100+i))
		require.NoError(t, err)
		require.True(t, ok)
		require.NoError(t, db.Reserve(ctx, p.ID))
		pending[i] = p.ID
	}

	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, len(pending)+len(refunds)+1)
	var posted, released atomic.Int64
	for _, id := range pending {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := db.Finalize(ctx, id, "ch"); err != nil {
				errs <- err
			}
		}()
	}
	for _, r := range refunds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := db.HoldRefund(ctx, r.ID)
			switch {
			case errors.Is(err, payment.ErrInsufficientFunds):
				if _, err := db.ReleaseRefund(ctx, r.ID, payment.FailureInsufficientFunds); err != nil {
					errs <- err
				}
				released.Add(1)
			case err != nil:
				errs <- err
			default:
				if _, err := db.PostRefund(ctx, r.ID, "rf"); err != nil {
					errs <- err
				}
				posted.Add(1)
			}
		}()
	}
	// Meanwhile the balance API never shows more held than there is.
	sampled := make(chan int)
	go func() {
		n := 0
		for !stop.Load() {
			a, err := db.Account(ctx, settlement.ID)
			if err != nil || a.Balance < a.Reserved || a.Reserved < 0 {
				errs <- errors.Join(err, errors.New("settlement account read with less than it holds"))
				break
			}
			n++
		}
		sampled <- n
	}()
	wg.Wait()
	stop.Store(true)
	require.Positive(t, <-sampled)
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int64(len(refunds)), posted.Load()+released.Load())
	require.Positive(t, posted.Load())

	var credited int64
	for i := range pending {
		credited += int64(100 + i)
	}
	b, res := balance(t, settlement.ID)
	require.Equal(t, 20_000+credited-1_000*posted.Load(), b)
	require.Zero(t, res)
	var ledger int64
	require.NoError(t, db.QueryRow(ctx, `SELECT coalesce(sum(amount_minor), 0)::bigint FROM ledger_entries WHERE account_id = $1`, []any{settlement.ID}, &ledger))
	require.Equal(t, ledger, b)
	requireVerified(t)
}

// The migration moves what settlement accounts held into their first shard: a database at the
// schema before it, with a balance and a hold on a settlement account, keeps both.
func TestSettlementShardsMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := env.OwnDatabase(t)
	sqldb, err := sql.Open("pgx", url)
	require.NoError(t, err)
	defer sqldb.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, sqldb, os.DirFS("../schema/migrations"))
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 9)
	require.NoError(t, err)

	m, settlement, customer := uuid.New(), uuid.New(), uuid.New()
	_, err = sqldb.ExecContext(ctx, `INSERT INTO merchants (id, name, webhook_secret_enc) VALUES ($1, 'm', '\\x00')`, m)
	require.NoError(t, err)
	_, err = sqldb.ExecContext(ctx, `INSERT INTO accounts (id, merchant_id, kind, currency, balance, reserved) VALUES
		($2, $1, 'settlement', 'TRY', 7000, 2500), ($3, $1, 'customer', 'TRY', 500, 0)`, m, settlement, customer)
	require.NoError(t, err)

	own, err := store.Open(ctx, store.Options{URL: url, SecretKey: testkit.SecretKey, Migrate: true})
	require.NoError(t, err)
	defer own.Close()
	a, err := own.Account(ctx, settlement)
	require.NoError(t, err)
	require.Equal(t, [2]int64{7000, 2500}, [2]int64{a.Balance, a.Reserved})
	require.Equal(t, map[int16][2]int64{0: {7000, 2500}}, shardRows(t, own, settlement))
	var row [2]int64
	require.NoError(t, own.QueryRow(ctx, `SELECT balance, reserved FROM accounts WHERE id = $1`, []any{settlement}, &row[0], &row[1]))
	require.Equal(t, [2]int64{0, 0}, row)
	c, err := own.Account(ctx, customer)
	require.NoError(t, err)
	require.Equal(t, [2]int64{500, 0}, [2]int64{c.Balance, c.Reserved}, "customer accounts stay as they were")
	require.Empty(t, shardRows(t, own, customer))

	// Down and up again: the balance goes back to the row, and into the shard once more.
	_, err = p.DownTo(ctx, 10)
	require.NoError(t, err)
	require.NoError(t, sqldb.QueryRowContext(ctx, `SELECT balance, reserved FROM accounts WHERE id = $1`, settlement).Scan(&row[0], &row[1]))
	require.Equal(t, [2]int64{7000, 2500}, row)
	_, err = p.Up(ctx)
	require.NoError(t, err)
	a, err = own.Account(ctx, settlement)
	require.NoError(t, err)
	require.Equal(t, [2]int64{7000, 2500}, [2]int64{a.Balance, a.Reserved})
}

// kasa verify checks the shards too: a shard changed outside the ledger, one holding more than
// its balance, and a settlement account's own row holding money are each reported (the CHECKs
// that refuse the last two are dropped here to make them).
func TestVerifyReportsShardViolations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own := ownStore(t)
	m := testkit.NewMerchant(t, own, testkit.MerchantOptions{Deposit: 100_000})
	for range 3 {
		_, err := testkit.Settle(ctx, own, m, false)
		require.NoError(t, err)
	}
	var settlement uuid.UUID
	require.NoError(t, own.QueryRow(ctx, `SELECT id FROM accounts WHERE merchant_id = $1 AND kind = 'settlement'`, []any{m.ID}, &settlement))
	problems, err := own.Verify(ctx)
	require.NoError(t, err)
	require.Empty(t, problems)

	require.NoError(t, own.Exec(ctx, `ALTER TABLE settlement_shards DROP CONSTRAINT settlement_shards_funds`))
	require.NoError(t, own.Exec(ctx, `ALTER TABLE accounts DROP CONSTRAINT accounts_settlement_in_shards`))
	require.NoError(t, own.Exec(ctx, `UPDATE settlement_shards SET balance = balance + 1
		WHERE account_id = $1 AND shard = (SELECT min(shard) FROM settlement_shards WHERE account_id = $1)`, settlement))
	problems, err = own.Verify(ctx)
	require.NoError(t, err)
	require.Len(t, problems, 1, "%v", problems)
	require.Contains(t, problems[0], "balance equals the ledger sum")

	// The shard gives back its extra minor unit and one more, which goes to the account's own row
	// (the sum is right again), and the shard holds more than it has.
	require.NoError(t, own.Exec(ctx, `WITH s AS (SELECT min(shard) AS n FROM settlement_shards WHERE account_id = $1)
		UPDATE settlement_shards SET balance = balance - 2, reserved = balance + 5 FROM s WHERE account_id = $1 AND shard = s.n`, settlement))
	require.NoError(t, own.Exec(ctx, `UPDATE accounts SET balance = 1 WHERE id = $1`, settlement))
	problems, err = own.Verify(ctx)
	require.NoError(t, err)
	require.Len(t, problems, 3, "%v", problems)
	require.Contains(t, problems[0], "reserved equals active reservations")
	require.Contains(t, problems[1], "settlement balances are in their shards, none negative: shard")
	require.Contains(t, problems[2], "settlement balances are in their shards, none negative: settlement account")
}

// Every money path at once on one payer's account and one merchant's settlement account:
// payments (one parked unknown, then released), manual captures and cancels, refunds, deposits,
// retention and kasa verify while they run, each step executed twice at once (a local activity
// run again by a second worker). No path waits for another in a cycle or fails but by the
// documented race of two holds of one payment (the activity's retry finds the hold), and the
// balances are exactly what the operations moved.
func TestEveryMoneyPathAtOnceOnOneAccount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const seed = 1_000_000
	mID, aID := fixture(t, seed)
	settlement := settlementAccount(t, mID)
	var payer, merchant atomic.Int64 // what the operations moved, from the payer and to the merchant
	payer.Store(seed)
	var mu sync.Mutex
	var paidIDs []uuid.UUID

	// step runs a step twice at once, and again (as the activity's retry policy does) after a
	// retryable error: a deadlock, or two holds of one payment meeting at its reservation.
	step := func(fn func() error) error {
		for try := 0; ; try++ {
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for i := range errs {
				wg.Go(func() { errs[i] = fn() })
			}
			wg.Wait()
			err := errors.Join(errs...)
			var pgErr *pgconn.PgError
			if err == nil || try == 3 || !errors.As(err, &pgErr) || pgErr.ConstraintName != "balance_reservations_operation_id_key" {
				return err
			}
		}
	}
	begin := func(i int, amount int64, manual bool) (uuid.UUID, error) {
		key := fmt.Sprintf("every-%d", i)
		req := payment.Request{InvoiceID: key, AmountMinor: amount, Currency: "TRY", AccountID: aID, PaymentType: "purchase", CaptureManual: manual}
		_, p, _, err := db.Begin(ctx, store.BeginInput{MerchantID: mID, Key: key, Request: req, OperationID: payment.NewID(),
			Lease: time.Minute, CaptureWindow: time.Hour})
		if err != nil {
			return uuid.Nil, err
		}
		return p.ID, step(func() error { return db.Reserve(ctx, p.ID) })
	}
	op := func(i int) error {
		amount := int64(100 + i%900)
		switch i % 6 {
		case 0:
			_, _, err := db.Deposit(ctx, aID, fmt.Sprint("every-deposit-", i), 500)
			if err == nil {
				payer.Add(500)
			}
			return err
		case 1:
			id, err := begin(i, amount, false)
			if err != nil {
				return err
			}
			if err := step(func() error { _, err := db.Finalize(ctx, id, "ch"); return err }); err != nil {
				return err
			}
			payer.Add(-amount)
			merchant.Add(amount)
			mu.Lock()
			paidIDs = append(paidIDs, id)
			mu.Unlock()
			return nil
		case 2:
			id, err := begin(i, amount, false)
			if err != nil {
				return err
			}
			if err := step(func() error { _, err := db.MarkUnknown(ctx, id); return err }); err != nil {
				return err
			}
			return step(func() error { _, err := db.Release(ctx, id, payment.FailureDeclined); return err })
		case 3, 4:
			id, err := begin(i, amount, true)
			if err != nil {
				return err
			}
			if err := step(func() error { _, err := db.Authorized(ctx, id, "au"); return err }); err != nil {
				return err
			}
			if i%6 == 4 {
				return step(func() error { _, err := db.Canceled(ctx, id, payment.FailureCanceled, uuid.Nil); return err })
			}
			captured := amount - 50
			if err := step(func() error { _, err := db.Captured(ctx, id, captured, "cap", uuid.Nil); return err }); err != nil {
				return err
			}
			payer.Add(-captured)
			merchant.Add(captured)
			return nil
		default:
			mu.Lock()
			if len(paidIDs) == 0 {
				mu.Unlock()
				return nil
			}
			paid := paidIDs[len(paidIDs)-1]
			mu.Unlock()
			req, err := payment.ParseRefundRequest([]byte(`{"amount":"1.00"}`))
			if err != nil {
				return err
			}
			_, r, _, err := db.BeginRefund(ctx, store.BeginRefundInput{MerchantID: mID, PaymentID: paid, Key: fmt.Sprint("every-refund-", i),
				Request: req, OperationID: payment.NewID(), Lease: time.Minute})
			if errors.As(err, new(*payment.RefundExceedsError)) {
				return nil // that payment is refunded whole already
			}
			if err != nil {
				return err
			}
			if err := step(func() error { return db.HoldRefund(ctx, r.ID) }); err != nil {
				return err
			}
			if err := step(func() error { _, err := db.PostRefund(ctx, r.ID, "rf"); return err }); err != nil {
				return err
			}
			payer.Add(100)
			merchant.Add(-100)
			return nil
		}
	}

	var stop atomic.Bool
	var background sync.WaitGroup
	bgErrs := make(chan error, 2)
	background.Go(func() {
		for !stop.Load() {
			if _, err := db.DeleteExpiredRecords(ctx, 0, 100); err != nil {
				bgErrs <- fmt.Errorf("retention: %w", err)
				return
			}
		}
	})
	background.Go(func() {
		for !stop.Load() {
			problems, err := db.Verify(ctx)
			if err != nil || len(problems) > 0 {
				bgErrs <- fmt.Errorf("verify during load: %v %v", err, problems)
				return
			}
		}
	})
	parallel(t, 12, 600, op)
	stop.Store(true)
	background.Wait()
	close(bgErrs)
	for err := range bgErrs {
		require.NoError(t, err)
	}

	b, res := balance(t, aID)
	require.Equal(t, [2]int64{payer.Load(), 0}, [2]int64{b, res}, "the payer's balance and holds")
	b, res = balance(t, settlement.ID)
	require.Equal(t, [2]int64{merchant.Load(), 0}, [2]int64{b, res}, "the merchant's balance and holds")
	requireVerified(t)
}
