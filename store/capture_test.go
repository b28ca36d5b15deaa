package store_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// authorized begins a manual payment of amount and runs it to requires_capture.
func authorized(t *testing.T, mID, aID uuid.UUID, key string, amount int64) payment.Payment {
	t.Helper()
	return authorizedAs(t, mID, aID, key, amount, payment.NewID())
}

// authorizedAs is authorized with the operation id given.
func authorizedAs(t *testing.T, mID, aID uuid.UUID, key string, amount int64, id uuid.UUID) payment.Payment {
	t.Helper()
	ctx := context.Background()
	req := payment.Request{InvoiceID: key, AmountMinor: amount, Currency: "TRY", AccountID: aID, PaymentType: "purchase", CaptureManual: true}
	_, p, began, err := db.Begin(ctx, store.BeginInput{MerchantID: mID, Key: key, Request: req, OperationID: id,
		Lease: time.Minute, CaptureWindow: time.Hour})
	require.NoError(t, err)
	require.Equal(t, store.BeganNew, began)
	require.WithinDuration(t, p.CreatedAt.Add(time.Hour), p.CaptureBefore, time.Millisecond)
	require.NoError(t, db.Reserve(ctx, p.ID))
	for range 2 { // a repeated step changes nothing
		p, err = db.Authorized(ctx, p.ID, "au_1")
		require.NoError(t, err)
	}
	require.Equal(t, payment.StatusRequiresCapture, p.Status)
	rec, err := db.Record(ctx, mID, key)
	require.NoError(t, err)
	require.Equal(t, store.RecordCompleted, rec.Status, "the create is answered once authorized")
	require.Equal(t, payment.StatusRequiresCapture, rec.Outcome)
	return p
}

func TestCapturedPostsWhatWasCapturedAndReleasesTheRest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	p := authorized(t, mID, aID, "auth", 6_000)
	a, _ := db.Account(ctx, aID)
	require.Equal(t, int64(6_000), a.Reserved, "the authorization holds its whole amount")
	requireVerified(t)

	_, err := db.Captured(ctx, p.ID, 6_001, "au_1", uuid.Nil)
	require.ErrorIs(t, err, store.ErrInconsistent, "never more than the hold")
	for range 2 {
		p, err = db.Captured(ctx, p.ID, 2_500, "au_1", uuid.Nil)
		require.NoError(t, err)
	}
	require.Equal(t, payment.StatusSucceeded, p.Status)
	require.Equal(t, int64(2_500), p.CapturedMinor)
	a, _ = db.Account(ctx, aID)
	require.Equal(t, int64(7_500), a.Balance)
	require.Zero(t, a.Reserved, "the rest of the hold is released")
	entries, err := db.LedgerEntries(ctx, p.ID.String())
	require.NoError(t, err)
	require.Len(t, entries, 2, "one posting however often the step runs")
	_, err = db.Canceled(ctx, p.ID, payment.FailureCanceled, uuid.Nil)
	require.ErrorIs(t, err, store.ErrInconsistent, "a captured payment is never canceled")
	requireVerified(t)
}

func TestCanceledReleasesTheHold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	p := authorized(t, mID, aID, "auth", 4_000)
	for range 2 {
		got, err := db.Canceled(ctx, p.ID, payment.FailureAuthorizationExpired, uuid.Nil)
		require.NoError(t, err)
		require.Equal(t, payment.StatusCanceled, got.Status)
		require.Equal(t, payment.FailureAuthorizationExpired, got.FailureCode)
	}
	a, _ := db.Account(ctx, aID)
	require.Equal(t, int64(10_000), a.Balance)
	require.Zero(t, a.Reserved)
	_, err := db.Captured(ctx, p.ID, 4_000, "au_1", uuid.Nil)
	require.ErrorIs(t, err, store.ErrInconsistent, "a canceled payment is never captured")
	// Its invoice is free again, as a failed payment's is.
	_, _, began, err := begin(t, mID, aID, "again", "auth", 1_000)
	require.NoError(t, err)
	require.True(t, began)
	requireVerified(t)
}

// A payment whose authorization is open is never failed: the bank holds that authorization, which
// only a void lets go (canceled). A release of it is a contradiction for an operator, and changes
// nothing.
func TestReleaseOfAnAuthorizedPaymentIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	p := authorized(t, mID, aID, "release-authorized", 4_000)
	_, err := db.MarkUnknown(ctx, p.ID) // as a step run again for the authorization would leave it
	require.NoError(t, err)
	_, err = db.Release(ctx, p.ID, payment.FailureDeclined)
	require.ErrorIs(t, err, store.ErrInconsistent)
	got, err := db.Payment(ctx, p.ID)
	require.NoError(t, err)
	require.Equal(t, payment.StatusUnknown, got.Status)
	a, _ := db.Account(ctx, aID)
	require.Equal(t, int64(4_000), a.Reserved, "the hold is kept")
	requireVerified(t)
}

// A payment whose capture or void is unknown already had its authorization recorded: the
// authorization recorded again (a run repeating its first phase) would reopen it as waiting for a
// capture, a second capture of a hold already being let go. It is refused, and changes nothing.
func TestAuthorizedAgainWhileTheCaptureIsUnknownIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	p := authorized(t, mID, aID, "authorized-again", 4_000)
	_, err := db.MarkUnknown(ctx, p.ID) // the capture's answer was lost
	require.NoError(t, err)
	_, err = db.Authorized(ctx, p.ID, "au_1")
	require.ErrorIs(t, err, store.ErrInconsistent)
	got, err := db.Payment(ctx, p.ID)
	require.NoError(t, err)
	require.Equal(t, payment.StatusUnknown, got.Status)
	requireVerified(t)
}

// The database itself refuses a refund of more than was captured.
func TestRefundsOfAManualPaymentAreBoundedByTheCapture(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	p := authorized(t, mID, aID, "auth", 5_000)
	_, err := db.Captured(ctx, p.ID, 2_000, "au_1", uuid.Nil)
	require.NoError(t, err)
	_, _, _, err = db.BeginRefund(ctx, store.BeginRefundInput{MerchantID: mID, PaymentID: p.ID, Key: "r1",
		Request: payment.RefundRequest{Amount: "20.01"}, OperationID: payment.NewID(), Lease: time.Minute})
	var exceeds *payment.RefundExceedsError
	require.ErrorAs(t, err, &exceeds)
	require.Equal(t, int64(2_000), exceeds.Refundable)
}

func TestCommandKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	p := authorized(t, mID, aID, "auth", 5_000)
	c := store.Command{MerchantID: mID, Key: "c1", ID: payment.NewID(), PaymentID: p.ID, Kind: payment.CommandCapture, RequestHash: "h", AmountMinor: 100}
	got, began, err := db.BeginCommand(ctx, c, time.Minute)
	require.NoError(t, err)
	require.True(t, began)
	second := c
	second.ID, second.RequestHash = payment.NewID(), "other"
	got2, began, err := db.BeginCommand(ctx, second, time.Minute)
	require.NoError(t, err)
	require.False(t, began, "a key names one command")
	require.Equal(t, got.ID, got2.ID)
	won, err := db.LeaseCommand(ctx, mID, "c1", time.Minute)
	require.NoError(t, err)
	require.False(t, won, "leased by its first request")
	require.NoError(t, db.UnleaseCommand(ctx, mID, "c1"))
	won, err = db.LeaseCommand(ctx, mID, "c1", time.Minute)
	require.NoError(t, err)
	require.True(t, won)
	require.NoError(t, db.AnswerCommand(ctx, mID, "c1", 201, []byte(`{"a":1}`)))
	require.NoError(t, db.AnswerCommand(ctx, mID, "c1", 202, []byte(`{"b":2}`)))
	require.NoError(t, db.DeleteCommand(ctx, mID, "c1"), "an answered command is never forgotten")
	got, err = db.Command(ctx, mID, "c1")
	require.NoError(t, err)
	require.Equal(t, 201, got.ResponseStatus, "the first answer stays")
	require.Equal(t, `{"a":1}`, string(got.ResponseBody))

	refused := c
	refused.Key, refused.ID = "c2", payment.NewID()
	_, _, err = db.BeginCommand(ctx, refused, time.Minute)
	require.NoError(t, err)
	require.NoError(t, db.DeleteCommand(ctx, mID, "c2"))
	_, err = db.Command(ctx, mID, "c2")
	require.ErrorIs(t, err, payment.ErrNotFound, "a refused command frees its key")

	// A command the workflow took moved the money: its key is never freed, even unanswered.
	taken := c
	taken.Key, taken.ID = "c3", payment.NewID()
	_, _, err = db.BeginCommand(ctx, taken, time.Minute)
	require.NoError(t, err)
	_, err = db.Captured(ctx, p.ID, 100, "au_1", taken.ID)
	require.NoError(t, err)
	require.NoError(t, db.DeleteCommand(ctx, mID, "c3"))
	_, err = db.Command(ctx, mID, "c3")
	require.NoError(t, err, "a taken command keeps its key")
}

// The capture or cancel that moved the money is marked with it, in the same transaction; the
// other commands of the payment are not.
func TestTheCommandTakenIsMarkedWithItsMoney(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	command := func(p payment.Payment, key string, kind payment.Command) store.Command {
		c, began, err := db.BeginCommand(ctx, store.Command{MerchantID: mID, Key: key, ID: payment.NewID(), PaymentID: p.ID,
			Kind: kind, RequestHash: key}, time.Minute)
		require.NoError(t, err)
		require.True(t, began)
		return c
	}
	for _, kind := range []payment.Command{payment.CommandCapture, payment.CommandCancel} {
		p := authorized(t, mID, aID, "taken-"+string(kind), 1_000)
		lost, took := command(p, "lost-"+string(kind), kind), command(p, "took-"+string(kind), kind)
		taken, err := db.TakenCommand(ctx, p.ID)
		require.NoError(t, err)
		require.Equal(t, uuid.Nil, taken, "none taken while the payment waits")
		if kind == payment.CommandCapture {
			_, err = db.Captured(ctx, p.ID, 600, "au_1", took.ID)
		} else {
			_, err = db.Canceled(ctx, p.ID, payment.FailureCanceled, took.ID)
		}
		require.NoError(t, err)
		taken, err = db.TakenCommand(ctx, p.ID)
		require.NoError(t, err)
		require.Equal(t, took.ID, taken)
		require.NotEqual(t, lost.ID, taken)
	}
	requireVerified(t)
}

// A capture sent and not finished is in flight; a cancel is not a capture, and the capture the
// workflow took is finished.
func TestCaptureInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	p := authorized(t, mID, aID, "in-flight", 1_000)
	inFlight := func() bool {
		got, err := db.CaptureInFlight(ctx, p.ID)
		require.NoError(t, err)
		return got
	}
	require.False(t, inFlight(), "nothing sent")
	_, _, err := db.BeginCommand(ctx, store.Command{MerchantID: mID, Key: "if-cancel", ID: payment.NewID(), PaymentID: p.ID,
		Kind: payment.CommandCancel, RequestHash: "x"}, time.Minute)
	require.NoError(t, err)
	require.False(t, inFlight(), "a cancel")
	c, _, err := db.BeginCommand(ctx, store.Command{MerchantID: mID, Key: "if-capture", ID: payment.NewID(), PaymentID: p.ID,
		Kind: payment.CommandCapture, RequestHash: "y", AmountMinor: 400}, time.Minute)
	require.NoError(t, err)
	require.True(t, inFlight())
	_, err = db.Captured(ctx, p.ID, 400, "au", c.ID)
	require.NoError(t, err)
	require.False(t, inFlight(), "taken: it moved the money")
}

// A waiting authorization takes no capture while a capture or a cancel is under way, nor once its
// window is over by the database's clock; an automatic payment is never among them.
func TestCaptureClosed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	open := authorized(t, mID, aID, "closed-open", 1_000)
	capturing := authorized(t, mID, aID, "closed-capturing", 1_000)
	canceling := authorized(t, mID, aID, "closed-canceling", 1_000)
	expired := authorized(t, mID, aID, "closed-expired", 1_000)
	for _, c := range []struct {
		p    payment.Payment
		kind payment.Command
	}{{capturing, payment.CommandCapture}, {canceling, payment.CommandCancel}} {
		_, _, err := db.BeginCommand(ctx, store.Command{MerchantID: mID, Key: "closed-" + string(c.kind), ID: payment.NewID(),
			PaymentID: c.p.ID, Kind: c.kind, RequestHash: "h"}, time.Minute)
		require.NoError(t, err)
	}
	require.NoError(t, db.Exec(ctx, `UPDATE payments SET capture_before = now() - interval '1 second' WHERE id = $1`, expired.ID))
	closed, err := db.CaptureClosed(ctx, []uuid.UUID{open.ID, capturing.ID, canceling.ID, expired.ID, payment.NewID()})
	require.NoError(t, err)
	require.ElementsMatch(t, []uuid.UUID{capturing.ID, canceling.ID, expired.ID}, closed)
}

// A manual payment authorized days ago whose capture became unknown today is found by today's
// reconciliation, with when its capture was first asked for; one authorized today is not (its
// creation day finds it), nor one whose authorization itself is unknown.
func TestEachUnknownCaptureDecided(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	old := authorized(t, mID, aID, "later-capture", 1_000)
	asked := time.Now()
	_, _, err := db.BeginCommand(ctx, store.Command{MerchantID: mID, Key: "later-cap", ID: payment.NewID(), PaymentID: old.ID,
		Kind: payment.CommandCapture, RequestHash: "h", AmountMinor: 400}, time.Minute)
	require.NoError(t, err)
	_, err = db.MarkUnknown(ctx, old.ID)
	require.NoError(t, err)
	require.NoError(t, db.Exec(ctx, `UPDATE payments SET created_at = created_at - interval '2 days' WHERE id = $1`, old.ID))
	fresh := authorized(t, mID, aID, "same-day-capture", 1_000)
	_, err = db.MarkUnknown(ctx, fresh.ID)
	require.NoError(t, err)

	from := time.Now().UTC().Truncate(24 * time.Hour)
	var got []uuid.UUID
	var sent time.Time
	require.NoError(t, db.EachCaptureDecided(ctx, from, from.Add(24*time.Hour), []payment.Status{payment.StatusUnknown}, []uuid.UUID{mID},
		func(p payment.Payment, decided, sentFrom time.Time) error {
			got, sent = append(got, p.ID), sentFrom
			require.Equal(t, payment.StatusUnknown, p.Status)
			require.False(t, decided.Before(from))
			return nil
		}))
	require.Equal(t, []uuid.UUID{old.ID}, got)
	require.WithinDuration(t, asked, sent, time.Second, "its window starts at the capture's arrival")
}

// A manual payment authorized days ago and captured today is found by today's reconciliation,
// decided when its capture was posted, its window from the capture's arrival; its creation day's
// read gives the same decision time, which a later change of the row (a refund's) does not move.
func TestEachCaptureDecidedSucceeded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	p := authorized(t, mID, aID, "captured-later", 1_000)
	asked := time.Now()
	c, _, err := db.BeginCommand(ctx, store.Command{MerchantID: mID, Key: "captured-later-cap", ID: payment.NewID(), PaymentID: p.ID,
		Kind: payment.CommandCapture, RequestHash: "h", AmountMinor: 400}, time.Minute)
	require.NoError(t, err)
	_, err = db.Captured(ctx, p.ID, 400, "au_1", c.ID)
	require.NoError(t, err)
	captured := time.Now()
	require.NoError(t, db.Exec(ctx, `UPDATE payments SET updated_at = updated_at + interval '1 hour' WHERE id = $1`, p.ID))
	from := time.Now().UTC().Truncate(24 * time.Hour)
	n := 0
	require.NoError(t, db.EachPaymentCreated(ctx, from, from.Add(24*time.Hour), []payment.Status{payment.StatusSucceeded}, []uuid.UUID{mID},
		func(q payment.Payment, decided time.Time) error {
			n++
			require.WithinDuration(t, captured, decided, time.Second, "not its updated_at")
			return nil
		}))
	require.Equal(t, 1, n)

	require.NoError(t, db.Exec(ctx, `UPDATE payments SET created_at = created_at - interval '2 days' WHERE id = $1`, p.ID))
	var got []uuid.UUID
	require.NoError(t, db.EachCaptureDecided(ctx, from, from.Add(24*time.Hour), []payment.Status{payment.StatusUnknown, payment.StatusSucceeded}, []uuid.UUID{mID},
		func(q payment.Payment, decided, sentFrom time.Time) error {
			got = append(got, q.ID)
			require.WithinDuration(t, captured, decided, time.Second, "decided when the capture was posted")
			require.WithinDuration(t, asked, sentFrom, time.Second, "its window starts at the capture's arrival")
			return nil
		}))
	require.Equal(t, []uuid.UUID{p.ID}, got)
	require.NoError(t, db.EachCaptureDecided(ctx, from, from.Add(24*time.Hour), []payment.Status{payment.StatusUnknown}, []uuid.UUID{mID},
		func(q payment.Payment, _, _ time.Time) error { return fmt.Errorf("%s is not unknown", q.ID) }))
}

// Migration 00028 run again (its index left invalid by a build that failed, so neither it nor a
// later migration was recorded) builds the index again: an invalid index is never used, and
// payment_commands is kept for good.
func TestCommandsByPaymentIndexRebuilt(t *testing.T) {
	t.Parallel()
	requireIndexRebuilt(t, "payment_commands_payment", 28)
}

// Undoing migration 22 would drop what each manual payment captured, which bounds its refunds:
// a database that made one cannot go back, as one that made a refund cannot undo migration 9.
func TestManualCaptureMigrationIsNotUndoneOverManualPayments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own, url := ownStoreAt(t)
	var err error
	m := testkit.NewMerchant(t, own, testkit.MerchantOptions{Deposit: 10_000})
	req := payment.Request{InvoiceID: "inv", AmountMinor: 100, Currency: "TRY", AccountID: m.Account, PaymentType: "purchase", CaptureManual: true}
	_, _, _, err = own.Begin(ctx, store.BeginInput{MerchantID: m.ID, Key: "k", Request: req, OperationID: payment.NewID(), Lease: time.Minute, CaptureWindow: time.Hour})
	require.NoError(t, err)

	sqldb, err := sql.Open("pgx", url)
	require.NoError(t, err)
	defer sqldb.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, sqldb, os.DirFS("../schema/migrations"))
	require.NoError(t, err)
	_, err = p.DownTo(ctx, 22)
	require.NoError(t, err)
	_, err = p.DownTo(ctx, 21)
	require.ErrorContains(t, err, "manual payments exist")
	var captured bool
	require.NoError(t, sqldb.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns
		WHERE table_name = 'payments' AND column_name = 'captured_minor')`).Scan(&captured))
	require.True(t, captured, "nothing of migration 22 was undone")
}

// Migration 27's unique index, run again after a concurrent build that left it invalid (a
// canceled run: it then enforces nothing), is built again rather than taken as done.
func TestCommandTakenIndexRebuilt(t *testing.T) {
	t.Parallel()
	requireIndexRebuilt(t, "payment_commands_taken", 27)
}

// A database whose migration 27 took an invalid build as done (before it dropped such a build
// first) has the index rebuilt by migration 31.
func TestCommandTakenIndexLeftInvalidIsRebuilt(t *testing.T) {
	t.Parallel()
	requireIndexRebuilt(t, "payment_commands_taken", 31)
}

// requireIndexRebuilt leaves index invalid, as a canceled concurrent build does, forgets the
// migrations from version from on, and migrates again: the index must be valid.
func requireIndexRebuilt(t *testing.T, index string, from int) {
	t.Helper()
	ctx := context.Background()
	url := env.OwnDatabase(t)
	open := func() *store.Store {
		st, err := store.Open(ctx, store.Options{URL: url, SecretKey: testkit.SecretKey, Migrate: true})
		require.NoError(t, err)
		t.Cleanup(st.Close)
		return st
	}
	st := open()
	require.NoError(t, st.Exec(ctx, `UPDATE pg_index SET indisvalid = false WHERE indexrelid = $1::regclass`, index))
	require.NoError(t, st.Exec(ctx, `DELETE FROM goose_db_version WHERE version_id >= $1`, from))
	st = open()
	var valid bool
	require.NoError(t, st.QueryRow(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = $1::regclass`, []any{index}, &valid))
	require.True(t, valid, index)
}

// A mark of an authorization as unknown never reopens one already recorded (another run's, as
// this one's answer was lost): it is refused and changes nothing. A processing one is marked.
func TestMarkAuthorizationUnknownNeverReopensARecordedOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	p := authorized(t, mID, aID, "mark-recorded", 4_000)
	_, err := db.MarkAuthorizationUnknown(ctx, p.ID)
	require.ErrorIs(t, err, store.ErrInconsistent)
	got, err := db.Payment(ctx, p.ID)
	require.NoError(t, err)
	require.Equal(t, payment.StatusRequiresCapture, got.Status)
	require.Equal(t, "au_1", got.ProviderReference)

	req := payment.Request{InvoiceID: "mark-processing", AmountMinor: 1_000, Currency: "TRY", AccountID: aID, PaymentType: "purchase", CaptureManual: true}
	_, q, _, err := db.Begin(ctx, store.BeginInput{MerchantID: mID, Key: "mark-processing", Request: req, OperationID: payment.NewID(),
		Lease: time.Minute, CaptureWindow: time.Hour})
	require.NoError(t, err)
	require.NoError(t, db.Reserve(ctx, q.ID))
	for range 2 { // a repeated step changes nothing
		q, err = db.MarkAuthorizationUnknown(ctx, q.ID)
		require.NoError(t, err)
		require.Equal(t, payment.StatusUnknown, q.Status)
	}
	requireVerified(t)
}
