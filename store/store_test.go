package store_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
)

var (
	env *testkit.Env
	db  *store.Store
)

func TestMain(m *testing.M) {
	testkit.Main(m, testkit.Options{}, func(e *testkit.Env) { env, db = e, e.Store })
}

// fixture makes a merchant with one funded TRY account.
func fixture(t *testing.T, deposit int64) (merchantID, accountID uuid.UUID) {
	t.Helper()
	m := testkit.NewMerchant(t, db, testkit.MerchantOptions{WebhookSecret: "whsec", Deposit: deposit})
	return m.ID, m.Account
}

// settle runs a payment to succeeded, through unknown first when viaUnknown.
func settle(t *testing.T, mID, aID uuid.UUID, viaUnknown bool) uuid.UUID {
	t.Helper()
	id, err := testkit.Settle(context.Background(), db, testkit.Merchant{ID: mID, Account: aID}, viaUnknown)
	require.NoError(t, err)
	return id
}

func begin(t *testing.T, merchantID, accountID uuid.UUID, key, invoice string, amount int64) (store.Record, payment.Payment, bool, error) {
	t.Helper()
	t.Helper()
	req := payment.Request{InvoiceID: invoice, AmountMinor: amount, Currency: "TRY", AccountID: accountID, PaymentType: "purchase"}
	rec, p, began, err := db.Begin(context.Background(), store.BeginInput{MerchantID: merchantID, Key: key, Request: req, OperationID: payment.NewID(), Lease: time.Minute})
	return rec, p, began == store.BeganNew, err
}

func requireVerified(t *testing.T) {
	t.Helper()
	problems, err := db.Verify(context.Background())
	require.NoError(t, err)
	require.Empty(t, problems)
}

func TestBeginIsAtomicUnderConcurrency(t *testing.T) {
	t.Parallel()
	mID, aID := fixture(t, 10_000)
	var wg sync.WaitGroup
	var mu sync.Mutex
	created := 0
	ops := map[uuid.UUID]bool{}
	for range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec, _, ok, err := begin(t, mID, aID, "same-key", "inv", 100)
			require.NoError(t, err)
			mu.Lock()
			defer mu.Unlock()
			ops[rec.OperationID] = true
			if ok {
				created++
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 1, created, "exactly one concurrent request owns the key")
	require.Len(t, ops, 1, "every request sees the same operation")
}

func TestBusinessKeyBlocksLivePaymentsOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	_, p1, ok, err := begin(t, mID, aID, "k1", "inv-9", 100)
	require.NoError(t, err)
	require.True(t, ok)

	_, _, _, err = begin(t, mID, aID, "k2", "inv-9", 100)
	var dup *payment.DuplicatePaymentError
	require.ErrorAs(t, err, &dup)
	require.Equal(t, p1.ID.String(), dup.PaymentID)
	_, err = db.Record(ctx, mID, "k2")
	require.ErrorIs(t, err, payment.ErrNotFound, "a rejected duplicate writes nothing")

	_, err = db.Release(ctx, p1.ID, payment.FailureDeclined)
	require.NoError(t, err)
	_, _, ok, err = begin(t, mID, aID, "k3", "inv-9", 100)
	require.NoError(t, err)
	require.True(t, ok, "a failed payment does not block a new attempt")
}

// A second request for an invoice meets the first payment at the unique index, and the first
// is declined before the second looks it up: the invoice is free again, so the second is a new
// payment (or, had it looked sooner, a duplicate), never "not found" (a 404 to a POST).
func TestBeginOnAnInvoiceDeclinedMeanwhile(t *testing.T) {
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	_, first, ok, err := begin(t, mID, aID, "k1", "inv-race", 100)
	require.NoError(t, err)
	require.True(t, ok)
	connect := func() *pgx.Conn {
		c, err := pgx.Connect(ctx, env.DatabaseURL)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close(ctx) })
		return c
	}

	// x writes the first payment's row, so that the second's insert waits for x at the index;
	// y declines the first payment the moment x commits, holding every reader of payments off.
	lock := time.Now().UnixNano()
	tx, err := connect().Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lock)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE payments SET updated_at = now() WHERE id = $1`, first.ID)
	require.NoError(t, err)
	declined := make(chan error, 1)
	y := connect()
	go func() {
		_, err := y.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN PERFORM pg_advisory_xact_lock(%d);
			LOCK TABLE payments IN ACCESS EXCLUSIVE MODE;
			UPDATE payments SET status = 'failed', failure_code = 'declined' WHERE id = '%[2]s';
			UPDATE idempotency_records SET status = 'completed', outcome = 'failed', response_body = '{}' WHERE operation_id = '%[2]s'; END $$`, lock, first.ID))
		declined <- err
	}()
	second := make(chan error, 1)
	go func() { _, _, _, err := begin(t, mID, aID, "k2", "inv-race", 100); second <- err }()
	time.Sleep(300 * time.Millisecond) // the second's insert now waits for x
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-declined)
	var dup *payment.DuplicatePaymentError
	if err := <-second; err != nil && !errors.As(err, &dup) {
		t.Fatalf("Begin: %v; want a new payment or a duplicate", err)
	}
}

// A local activity can run twice at once (its worker seemed dead, another took over): the
// payment is still held once.
func TestConcurrentReservesOfOnePaymentHoldOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// 30k: the balance covers the amount twice (the racers both hold, one is undone); 60k: it
	// does not (a racer finds the balance taken by the other's hold), and that is no decline.
	for _, amount := range []int64{30_000, 60_000} {
		mID, aID := fixture(t, 100_000)
		_, p, _, err := begin(t, mID, aID, "k", "inv", amount)
		require.NoError(t, err)
		for round := range 5 {
			var wg sync.WaitGroup
			errs := make([]error, 8)
			for i := range errs {
				wg.Go(func() { errs[i] = db.Reserve(ctx, p.ID) })
			}
			wg.Wait()
			for _, err := range errs {
				require.NotErrorIs(t, err, payment.ErrInsufficientFunds, "amount %d, round %d", amount, round)
			}
		}
		require.NoError(t, db.Reserve(ctx, p.ID), "a retry after the race finds the hold")
		a, err := db.Account(ctx, aID)
		require.NoError(t, err)
		require.Equal(t, amount, a.Reserved)
		require.Equal(t, int64(100_000), a.Balance)
		_, err = db.Finalize(ctx, p.ID, "ch_1")
		require.NoError(t, err)
		a, err = db.Account(ctx, aID)
		require.NoError(t, err)
		require.Equal(t, int64(0), a.Reserved)
		require.Equal(t, 100_000-amount, a.Balance)
	}
	requireVerified(t)

	require.ErrorIs(t, db.Reserve(ctx, payment.NewID()), payment.ErrNotFound)
}

func TestReserveNeverOverdraws(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 200_000) // 2,000.00 TRY
	var ids []uuid.UUID
	for i := range 4 {
		_, p, ok, err := begin(t, mID, aID, fmt.Sprint("k", i), fmt.Sprint("inv", i), 100_000)
		require.NoError(t, err)
		require.True(t, ok)
		ids = append(ids, p.ID)
	}
	var wg sync.WaitGroup
	results := make([]error, len(ids))
	for i, id := range ids {
		wg.Add(1)
		go func() { defer wg.Done(); results[i] = db.Reserve(ctx, id) }()
	}
	wg.Wait()
	ok := 0
	for _, err := range results {
		if err == nil {
			ok++
		} else {
			require.ErrorIs(t, err, payment.ErrInsufficientFunds)
		}
	}
	require.Equal(t, 2, ok)
	a, err := db.Account(ctx, aID)
	require.NoError(t, err)
	require.Equal(t, int64(200_000), a.Reserved)

	// A retried reserve changes nothing.
	for i, id := range ids {
		if results[i] == nil {
			require.NoError(t, db.Reserve(ctx, id))
		}
	}
	a, _ = db.Account(ctx, aID)
	require.Equal(t, int64(200_000), a.Reserved)
	for i, id := range ids {
		if results[i] != nil {
			_, err := db.Release(ctx, id, payment.FailureInsufficientFunds)
			require.NoError(t, err)
		}
	}
	requireVerified(t)
}

func TestFinalizeAndReleaseAreIdempotent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	_, p, _, err := begin(t, mID, aID, "k", "inv", 2_500)
	require.NoError(t, err)
	rec, err := db.Record(ctx, mID, "k")
	require.NoError(t, err)
	require.False(t, rec.WorkflowStarted)
	require.NoError(t, db.Reserve(ctx, p.ID))
	rec, err = db.Record(ctx, mID, "k")
	require.NoError(t, err)
	require.True(t, rec.WorkflowStarted, "the workflow's first step records that it runs")
	var first payment.Payment
	for i := range 3 {
		got, err := db.Finalize(ctx, p.ID, "ch_1")
		require.NoError(t, err)
		require.Equal(t, payment.StatusSucceeded, got.Status)
		if i == 0 {
			first = got
		}
	}
	// The answer is stored with the payment, once: a repeated finalize keeps the first one.
	rec, err = db.Record(ctx, mID, "k")
	require.NoError(t, err)
	require.Equal(t, store.RecordCompleted, rec.Status)
	body, err := first.AnswerBody()
	require.NoError(t, err)
	require.Equal(t, payment.StatusSucceeded, rec.Outcome)
	require.Equal(t, string(body), string(rec.ResponseBody))
	stored, err := db.Payment(ctx, p.ID)
	require.NoError(t, err)
	again, err := stored.AnswerBody()
	require.NoError(t, err)
	require.Equal(t, string(body), string(again), "the stored answer is what the payment row renders")
	entries, err := db.LedgerEntries(ctx, p.ID.String())
	require.NoError(t, err)
	require.Len(t, entries, 2, "one posting however often finalize runs")
	a, _ := db.Account(ctx, aID)
	require.Equal(t, int64(7_500), a.Balance)
	require.Equal(t, int64(0), a.Reserved)

	_, err = db.Release(ctx, p.ID, payment.FailureDeclined)
	require.ErrorIs(t, err, payment.ErrInconsistent, "a succeeded payment cannot be failed")
	a, _ = db.Account(ctx, aID)
	require.Equal(t, int64(7_500), a.Balance)
	requireVerified(t)
}

func TestUnknownKeepsReservationUntilResolved(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	_, p, _, err := begin(t, mID, aID, "k", "inv", 4_000)
	require.NoError(t, err)
	require.NoError(t, db.Reserve(ctx, p.ID))
	got, err := db.MarkUnknown(ctx, p.ID)
	require.NoError(t, err)
	require.Equal(t, payment.StatusUnknown, got.Status)
	rec, err := db.Record(ctx, mID, "k")
	require.NoError(t, err)
	require.Equal(t, store.RecordUnknown, rec.Status)
	require.Nil(t, rec.ResponseBody, "an unknown payment has no final answer")
	a, _ := db.Account(ctx, aID)
	require.Equal(t, int64(4_000), a.Reserved)
	requireVerified(t)

	_, err = db.Release(ctx, p.ID, payment.FailureDeclined)
	require.NoError(t, err)
	rec, err = db.Record(ctx, mID, "k")
	require.NoError(t, err)
	require.Equal(t, store.RecordCompleted, rec.Status)
	require.Equal(t, payment.StatusFailed, rec.Outcome)
	require.Contains(t, string(rec.ResponseBody), `"failure_code":"declined"`)
	a, _ = db.Account(ctx, aID)
	require.Equal(t, int64(0), a.Reserved)
	require.Equal(t, int64(10_000), a.Balance)
	requireVerified(t)
}

func TestLedgerIsImmutableAndBalanced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, aID := fixture(t, 10_000)
	err := db.Exec(ctx, `UPDATE ledger_entries SET amount_minor = amount_minor + 1 WHERE account_id = $1`, aID)
	require.ErrorContains(t, err, "immutable")
	err = db.Exec(ctx, `DELETE FROM ledger_entries WHERE account_id = $1`, aID)
	require.ErrorContains(t, err, "immutable")
	err = db.Exec(ctx, `DELETE FROM ledger_postings`)
	require.ErrorContains(t, err, "immutable")

	// An unbalanced posting cannot commit.
	err = db.Exec(ctx, `WITH p AS (INSERT INTO ledger_postings (id, kind, reference) VALUES (gen_random_uuid(), 'deposit', 'bad') RETURNING id)
INSERT INTO ledger_entries (id, posting_id, account_id, currency, amount_minor) SELECT gen_random_uuid(), p.id, $1, 'TRY', 5 FROM p`, aID)
	require.ErrorContains(t, err, "does not balance")
	// It is checked when the statement that writes the entries ends, not at commit: a posting's
	// entries are written in one statement, and an entry added later to a balanced posting is
	// refused as well.
	err = db.Exec(ctx, fmt.Sprintf(`BEGIN;
INSERT INTO ledger_postings (id, kind, reference) VALUES ('%[2]s', 'deposit', 'split');
INSERT INTO ledger_entries (id, posting_id, account_id, currency, amount_minor) VALUES (gen_random_uuid(), '%[2]s', '%[1]s', 'TRY', 5);
INSERT INTO ledger_entries (id, posting_id, account_id, currency, amount_minor) VALUES (gen_random_uuid(), '%[2]s', '%[1]s', 'TRY', -5);
COMMIT`, aID, payment.NewID()))
	require.ErrorContains(t, err, "does not balance")
	err = db.Exec(ctx, `INSERT INTO ledger_entries (id, posting_id, account_id, currency, amount_minor)
SELECT gen_random_uuid(), posting_id, account_id, currency, 1 FROM ledger_entries WHERE account_id = $1 LIMIT 1`, aID)
	require.ErrorContains(t, err, "does not balance")

	// The database refuses an overdraft even if the application forgot to check.
	err = db.Exec(ctx, `UPDATE accounts SET reserved = balance + 1 WHERE id = $1`, aID)
	require.True(t, errors.Is(err, payment.ErrInsufficientFunds), "got %v", err)
	requireVerified(t)
}

func TestDepositIdempotency(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, aID := fixture(t, 0)
	d1, replayed, err := db.Deposit(ctx, aID, "dep-1", 5_000)
	require.NoError(t, err)
	require.False(t, replayed)
	d2, replayed, err := db.Deposit(ctx, aID, "dep-1", 5_000)
	require.NoError(t, err)
	require.True(t, replayed)
	require.Equal(t, d1.ID, d2.ID)
	_, _, err = db.Deposit(ctx, aID, "dep-1", 6_000)
	require.ErrorIs(t, err, payment.ErrIdempotencyReused)
	a, _ := db.Account(ctx, aID)
	require.Equal(t, int64(5_000), a.Balance)
	requireVerified(t)
}

func TestLeaseTakeOverHasOneWinner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	req := payment.Request{InvoiceID: "inv", AmountMinor: 100, Currency: "TRY", AccountID: aID, PaymentType: "purchase"}
	_, _, began, err := db.Begin(ctx, store.BeginInput{MerchantID: mID, Key: "k", Request: req, OperationID: payment.NewID(), Lease: time.Millisecond})
	require.NoError(t, err)
	require.Equal(t, store.BeganNew, began)
	time.Sleep(20 * time.Millisecond)
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins := 0
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			won, err := db.TakeOver(ctx, mID, "k", time.Minute)
			require.NoError(t, err)
			if won {
				mu.Lock()
				wins++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 1, wins)
	rec, err := db.Record(ctx, mID, "k")
	require.NoError(t, err)
	require.NoError(t, db.WorkflowStarted(ctx, rec.OperationID))
	won, err := db.TakeOver(ctx, mID, "k", time.Minute)
	require.NoError(t, err)
	require.False(t, won, "a started workflow owns the operation")
}

// Verify must find what it promises to find: each corruption below is one violation it reports.
func TestVerifyReportsViolations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own := ownStore(t)

	m := payment.Merchant{ID: payment.NewID(), Name: "m"}
	require.NoError(t, own.CreateMerchant(ctx, m, "sk_x", "whsec"))
	a, err := own.CreateAccount(ctx, m.ID, "TRY")
	require.NoError(t, err)
	_, _, err = own.Deposit(ctx, a.ID, "seed", 1_000)
	require.NoError(t, err)
	problems, err := own.Verify(ctx)
	require.NoError(t, err)
	require.Empty(t, problems)

	// A balance changed outside the ledger, and a reservation that does not exist.
	require.NoError(t, own.Exec(ctx, `UPDATE accounts SET balance = balance + 1, reserved = 1 WHERE id = $1`, a.ID))
	problems, err = own.Verify(ctx)
	require.NoError(t, err)
	require.Len(t, problems, 2, "%v", problems)
	require.Contains(t, problems[0], "balance equals the ledger sum")
	require.Contains(t, problems[1], "reserved equals active reservations")
}

// Begin's statements run as one batch: an account that is not the merchant's, or not in the
// request's currency, is refused and nothing is written. A key that exists is answered with its
// record first, whatever the request says (the API then compares it), and is left untouched.
func TestBeginRefusesOtherAccountsAndWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	_, otherAccount := fixture(t, 10_000)
	existing, _, ok, err := begin(t, mID, aID, "taken", "inv-taken", 100)
	require.NoError(t, err)
	require.True(t, ok)

	for _, tc := range []struct {
		name, key, currency string
		account             uuid.UUID
		field               string
	}{
		{name: "another merchant's account", key: "k-other", currency: "TRY", account: otherAccount, field: "account_id"},
		{name: "no such account", key: "k-none", currency: "TRY", account: payment.NewID(), field: "account_id"},
		{name: "other currency", key: "k-usd", currency: "USD", account: aID, field: "currency"},
		{name: "taken key, another merchant's account", key: "taken", currency: "TRY", account: otherAccount},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := payment.Request{InvoiceID: "inv-" + tc.key, AmountMinor: 100, Currency: tc.currency, AccountID: tc.account, PaymentType: "purchase"}
			got, _, began, err := db.Begin(ctx, store.BeginInput{MerchantID: mID, Key: tc.key, Request: req, OperationID: payment.NewID(), Lease: time.Minute})
			if tc.key == "taken" {
				require.NoError(t, err)
				require.Equal(t, store.BeganExisting, began)
				require.Equal(t, existing.OperationID, got.OperationID, "the existing record is the answer")
				require.NotEqual(t, req.Hash(), got.RequestHash, "the caller sees the key was used for another request")
				rec, err := db.Record(ctx, mID, tc.key)
				require.NoError(t, err)
				require.Equal(t, existing.OperationID, rec.OperationID, "the key's record is untouched")
				require.Equal(t, existing.RequestHash, rec.RequestHash, "the key's record is untouched")
				_, err = db.PaymentByKey(ctx, mID, tc.key)
				require.NoError(t, err, "the key's payment is the first request's")
				return
			}
			var ve *payment.ValidationError
			require.ErrorAs(t, err, &ve)
			require.Equal(t, tc.field, ve.Fields[0].Field)
			require.Zero(t, began)
			_, err = db.Record(ctx, mID, tc.key)
			require.ErrorIs(t, err, payment.ErrNotFound, "no idempotency record")
			_, err = db.PaymentByKey(ctx, mID, tc.key)
			require.ErrorIs(t, err, payment.ErrNotFound, "no payment")
		})
	}
}

// The outcome of an operation is announced in-process once Finalize, Release or MarkUnknown
// commits it, to every watcher of that operation and no other, with the answer the commit
// stored when it completed the payment.
func TestWatchOutcomeAnnouncesCommittedOutcomes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	// announced is nil while ch is open and empty, else what it gave before closing.
	announced := func(ch <-chan store.Answer) *[]store.Answer {
		got := []store.Answer{}
		for {
			select {
			case a, ok := <-ch:
				if !ok {
					return &got
				}
				got = append(got, a)
			default:
				return nil
			}
		}
	}
	for _, step := range []struct {
		name    string
		run     func(id uuid.UUID) error
		answers bool
	}{
		{"finalize", func(id uuid.UUID) error { _, err := db.Finalize(ctx, id, "ref-1"); return err }, true},
		{"release", func(id uuid.UUID) error { _, err := db.Release(ctx, id, payment.FailureDeclined); return err }, true},
		{"mark unknown", func(id uuid.UUID) error { _, err := db.MarkUnknown(ctx, id); return err }, false},
	} {
		t.Run(step.name, func(t *testing.T) {
			key := "watch-" + step.name
			_, p, ok, err := begin(t, mID, aID, key, "inv-watch-"+step.name, 100)
			require.NoError(t, err)
			require.True(t, ok)
			first, stop1 := db.WatchOutcome(p.ID)
			defer stop1()
			second, stop2 := db.WatchOutcome(p.ID)
			defer stop2()
			other, stopOther := db.WatchOutcome(payment.NewID())
			defer stopOther()
			gone, stopGone := db.WatchOutcome(p.ID)
			stopGone()

			require.NoError(t, db.Reserve(ctx, p.ID))
			require.Nil(t, announced(first), "reserving is no outcome")
			require.NoError(t, step.run(p.ID))
			want := []store.Answer{}
			if step.answers {
				rec, err := db.Record(ctx, mID, key)
				require.NoError(t, err)
				require.NotNil(t, rec.ResponseBody)
				want = append(want, store.Answer{Outcome: rec.Outcome, Body: rec.ResponseBody})
			}
			require.Equal(t, &want, announced(first), "the stored answer, byte for byte, then closed")
			require.Equal(t, &want, announced(second))
			require.Nil(t, announced(other), "another operation's watcher")
			require.Nil(t, announced(gone), "a stopped watch")

			// A step run again finds its work done: announced, with no answer to hand over.
			again, stopAgain := db.WatchOutcome(p.ID)
			defer stopAgain()
			require.NoError(t, step.run(p.ID))
			require.Equal(t, &[]store.Answer{}, announced(again))
		})
	}
}

// A run's steps refuse an operation already final: a second run of a failed or succeeded payment
// (started by hand, or late) holds nothing, while the run that decided it may execute its first
// step again (its worker died before the run recorded it); capturing a failed payment is a
// contradiction for an operator, not a step to retry.
func TestStepsRefuseAFinalPayment(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	_, failed, _, err := begin(t, mID, aID, "final-f", "inv-f", 2_500)
	require.NoError(t, err)
	require.NoError(t, db.ReserveRun(ctx, failed.ID, "run-f"))
	_, err = db.Release(ctx, failed.ID, payment.FailureDeclined)
	require.NoError(t, err)
	_, paid, _, err := begin(t, mID, aID, "final-s", "inv-s", 1_000)
	require.NoError(t, err)
	require.NoError(t, db.ReserveRun(ctx, paid.ID, "run-s"))
	_, err = db.Finalize(ctx, paid.ID, "ch_s")
	require.NoError(t, err)
	_, poor, _, err := begin(t, mID, aID, "final-p", "inv-p", 1_000_000)
	require.NoError(t, err)
	require.ErrorIs(t, db.ReserveRun(ctx, poor.ID, "run-p"), payment.ErrInsufficientFunds)
	_, err = db.Release(ctx, poor.ID, payment.FailureInsufficientFunds)
	require.NoError(t, err)

	for id, status := range map[uuid.UUID]payment.Status{failed.ID: payment.StatusFailed, paid.ID: payment.StatusSucceeded, poor.ID: payment.StatusFailed} {
		var decided *payment.DecidedError
		require.ErrorAs(t, db.ReserveRun(ctx, id, "another-run"), &decided, "a decided payment is never held again")
		require.Equal(t, status, decided.Status)
	}
	require.NoError(t, db.ReserveRun(ctx, failed.ID, "run-f"), "the deciding run's step, executed again")
	require.NoError(t, db.ReserveRun(ctx, paid.ID, "run-s"))
	require.ErrorIs(t, db.ReserveRun(ctx, poor.ID, "run-p"), payment.ErrInsufficientFunds, "answered as the first time")
	_, err = db.Finalize(ctx, failed.ID, "ch_f")
	require.ErrorIs(t, err, payment.ErrInconsistent)
	a, err := db.Account(ctx, aID)
	require.NoError(t, err)
	require.Equal(t, [2]int64{9_000, 0}, [2]int64{a.Balance, a.Reserved}, "nothing held, nothing captured")
	requireVerified(t)
}

// A statement the database gave up on (statement_timeout, lock_timeout: an operator may set
// either on kasa's role) is the database being unavailable for now, which the API answers 503
// and a step retries, not an internal error.
func TestTimedOutStatementsAreUnavailable(t *testing.T) {
	ctx := context.Background()
	_, aID := fixture(t, 100)
	release, err := db.HoldRowLock(ctx, aID)
	require.NoError(t, err)
	defer release()
	for name, sql := range map[string]string{
		"statement_timeout": `SET LOCAL statement_timeout = '20ms'; SELECT pg_sleep(5)`,
		"lock_timeout":      fmt.Sprintf(`SET LOCAL lock_timeout = '20ms'; SELECT 1 FROM accounts WHERE id = '%s' FOR UPDATE`, aID),
	} {
		t.Run(name, func(t *testing.T) {
			require.ErrorIs(t, db.Exec(ctx, sql), store.ErrUnavailable)
		})
	}
}

// A deposit that would take a balance past what a bigint holds is refused as a bad amount, not an
// internal error, and moves nothing.
func TestDepositPastTheLargestBalanceIsRefused(t *testing.T) {
	ctx := context.Background()
	mID, _ := fixture(t, 0)
	acct, err := db.CreateAccount(ctx, mID, "ISK") // a currency of its own: its external account too
	require.NoError(t, err)
	const most = 999_999_999_999_999_999 // the largest amount a request can name
	var n int
	for ; n < 10; n++ {
		if _, _, err = db.Deposit(ctx, acct.ID, fmt.Sprintf("d-%d", n), most); err != nil {
			break
		}
	}
	var ve *payment.ValidationError
	require.ErrorAs(t, err, &ve, "deposit %d", n)
	a, err := db.Account(ctx, acct.ID)
	require.NoError(t, err)
	require.Equal(t, int64(n)*most, a.Balance, "the refused deposit moved nothing")
	requireVerified(t)
}

// A currency never holds more than a bigint: deposits spread over two accounts, each short of
// the limit, are refused once their sum would pass it, for a payment posting all of it to one
// merchant, or a read of its settlement account, would overflow after.
func TestCurrencyHoldsNoMoreThanTheLargestBalance(t *testing.T) {
	ctx := context.Background()
	mID, _ := fixture(t, 0)
	a, err := db.CreateAccount(ctx, mID, "MNT") // a currency of its own: its external account too
	require.NoError(t, err)
	b, err := db.CreateAccount(ctx, mID, "MNT")
	require.NoError(t, err)
	const most = 999_999_999_999_999_999 // the largest amount a request can name
	for total, n := int64(math.MaxInt64), 0; total > 0; n++ {
		amt := min(total, most)
		_, _, err := db.Deposit(ctx, a.ID, fmt.Sprintf("d-%d", n), amt)
		require.NoError(t, err, "deposit %d of %d", n, amt)
		total -= amt
	}
	_, _, err = db.Deposit(ctx, b.ID, "one-more", 1)
	var ve *payment.ValidationError
	require.ErrorAs(t, err, &ve, "the currency would hold one more than a bigint")
	got, err := db.Account(ctx, b.ID)
	require.NoError(t, err)
	require.Zero(t, got.Balance, "the refused deposit moved nothing")
	requireVerified(t)
}

// Migration 00029 gives up, rather than queue every write to accounts behind it, while a long
// transaction reads the table; run again once it ended, it completes.
func TestCurrencyBoundMigrationGivesUpOnABusyTable(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the migration's lock, tried for 3 s")
	}
	t.Parallel()
	ctx := context.Background()
	url := env.OwnDatabase(t)
	open := func() (*store.Store, error) {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		st, err := store.Open(ctx, store.Options{URL: url, SecretKey: testkit.SecretKey, Migrate: true, MigrateLockWait: 3 * time.Second})
		if err == nil {
			t.Cleanup(st.Close)
		}
		return st, err
	}
	st, err := open()
	require.NoError(t, err)
	// As a deploy whose migration 29 failed: neither it nor what follows is recorded.
	require.NoError(t, st.Exec(ctx, `ALTER TABLE accounts DROP CONSTRAINT accounts_currency_bound`))
	require.NoError(t, st.Exec(ctx, `DELETE FROM goose_db_version WHERE version_id >= 29`))
	reader, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer reader.Close(ctx)
	tx, err := reader.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT count(*) FROM accounts`)
	require.NoError(t, err)
	start := time.Now()
	_, err = open()
	require.ErrorContains(t, err, "lock timeout", "after %s", time.Since(start))
	require.NoError(t, tx.Rollback(ctx))
	_, err = open()
	require.NoError(t, err, "run again, it completes")
}

// A payment flagged stuck waits for an operator, not for the cluster: the backlog's drainer does
// not count it among the payments it keeps running, so stuck ones never hold the drain up.
func TestStillProcessingLeavesStuckPaymentsOut(t *testing.T) {
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	_, running, _, err := begin(t, mID, aID, "k-run", "inv-run", 100)
	require.NoError(t, err)
	_, stuck, _, err := begin(t, mID, aID, "k-stuck", "inv-stuck", 100)
	require.NoError(t, err)
	require.NoError(t, db.FlagStuck(ctx, stuck.ID, "the data contradicts the step"))
	ids, err := db.StillProcessing(ctx, []uuid.UUID{running.ID, stuck.ID})
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{running.ID}, ids)
}

// Refusal says, without writing anything, what Begin refuses a new key's request for: the API
// answers it past the start backlog's bound as Begin's answer below it.
func TestRefusalIsWhatBeginRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	_, otherAccount := fixture(t, 10_000)
	_, live, _, err := begin(t, mID, aID, "live", "inv-live", 100)
	require.NoError(t, err)
	_, failed, _, err := begin(t, mID, aID, "failed", "inv-failed", 100)
	require.NoError(t, err)
	_, err = db.Release(ctx, failed.ID, payment.FailureDeclined)
	require.NoError(t, err)

	for _, tc := range []struct {
		name, invoice, currency string
		account                 uuid.UUID
		field, duplicateOf      string // the refusal: a field's validation error, or a duplicate of a payment
	}{
		{name: "another key's live payment for the invoice", invoice: "inv-live", currency: "TRY", account: aID, duplicateOf: live.ID.String()},
		{name: "an invoice whose payment failed", invoice: "inv-failed", currency: "TRY", account: aID},
		{name: "a new invoice", invoice: "inv-new", currency: "TRY", account: aID},
		{name: "another merchant's account", invoice: "inv-live", currency: "TRY", account: otherAccount, field: "account_id"},
		{name: "other currency", invoice: "inv-new", currency: "USD", account: aID, field: "currency"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "k-" + tc.name
			req := payment.Request{InvoiceID: tc.invoice, AmountMinor: 100, Currency: tc.currency, AccountID: tc.account, PaymentType: "purchase"}
			refusal := db.Refusal(ctx, mID, req)
			_, err := db.Record(ctx, mID, key)
			require.ErrorIs(t, err, payment.ErrNotFound, "Refusal writes nothing")
			_, _, began, err := db.Begin(ctx, store.BeginInput{MerchantID: mID, Key: key, Request: req, OperationID: payment.NewID(), Lease: time.Minute})
			require.Equal(t, err, refusal, "Begin refuses the request for what Refusal said")
			var ve *payment.ValidationError
			var dup *payment.DuplicatePaymentError
			switch {
			case tc.field != "":
				require.ErrorAs(t, refusal, &ve)
				require.Equal(t, tc.field, ve.Fields[0].Field)
			case tc.duplicateOf != "":
				require.ErrorAs(t, refusal, &dup)
				require.Equal(t, tc.duplicateOf, dup.PaymentID)
			default:
				require.NoError(t, refusal)
				require.Equal(t, store.BeganNew, began)
			}
		})
	}
}

// A request that found its key taken by a concurrent one, whose record retention then deleted
// before the request could read it, is a request under an expired key: a new one, which the
// business key answers (409 for the invoice's live payment), never "not found".
func TestRacedKeyExpiredBeforeItsReadBeginsAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own, url := ownStoreAt(t)
	var err error
	m := testkit.NewMerchant(t, own, testkit.MerchantOptions{Deposit: 100_000})
	pay := func() (payment.Payment, store.Began, error) {
		req := payment.Request{InvoiceID: "inv", AmountMinor: 10_000, Currency: "TRY", AccountID: m.Account, PaymentType: "purchase"}
		_, p, began, err := own.Begin(ctx, store.BeginInput{MerchantID: m.ID, Key: "k", Request: req, OperationID: payment.NewID(), Lease: time.Minute})
		return p, began, err
	}
	type result struct {
		p     payment.Payment
		began store.Began
		err   error
	}
	// The first request holds its new record while its payment row waits for the payer's
	// account (its foreign key); the second waits for the first's record; retention's lock is
	// queued behind both.
	payer := lockSession(t, url)
	_, err = payer.Exec(ctx, `SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE`, m.Account)
	require.NoError(t, err)
	first, second := make(chan result, 1), make(chan result, 1)
	go func() { p, b, err := pay(); first <- result{p, b, err} }()
	require.Eventually(t, waitingOn(t, own, "%INSERT INTO payments%"), 10*time.Second, 10*time.Millisecond)
	go func() { p, b, err := pay(); second <- result{p, b, err} }()
	require.Eventually(t, waitingOn(t, own, "%INSERT INTO idempotency_records%"), 10*time.Second, 10*time.Millisecond)
	retention, locked := queueRetention(t, own, url)

	require.NoError(t, payer.Rollback(ctx))
	a := <-first
	require.NoError(t, a.err)
	require.Equal(t, store.BeganNew, a.began)
	require.NoError(t, <-locked)
	_, err = retention.Exec(ctx, `DELETE FROM idempotency_records WHERE scope = 'payment' AND idempotency_key = 'k'`)
	require.NoError(t, err)
	require.NoError(t, retention.Commit(ctx))

	b := <-second
	var dup *payment.DuplicatePaymentError
	require.ErrorAs(t, b.err, &dup, "began %v", b.began)
	require.Equal(t, a.p.ID.String(), dup.PaymentID)
	var n int
	require.NoError(t, own.QueryRow(ctx, `SELECT count(*) FROM payments WHERE merchant_id = $1`, []any{m.ID}, &n))
	require.Equal(t, 1, n, "no second payment")
}

// Each process's sessions carry its name, so an operator tells the api, the worker and the relay
// apart in pg_stat_activity; a name the URL gives is kept.
func TestSessionsCarryTheProcessName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := env.OwnDatabase(t)
	for _, tc := range []struct{ url, name, want string }{
		{url, "kasa worker", "kasa worker"},
		{url + map[bool]string{true: "&", false: "?"}[strings.Contains(url, "?")] + "application_name=billing", "kasa api", "billing"},
		{url, "", ""},
	} {
		st, err := store.Open(ctx, store.Options{URL: tc.url, SecretKey: testkit.SecretKey, Migrate: true, AppName: tc.name})
		require.NoError(t, err)
		var got string
		require.NoError(t, st.QueryRow(ctx, `SELECT current_setting('application_name')`, nil, &got))
		st.Close()
		require.Equal(t, tc.want, got, "%+v", tc)
	}
}
