package store_test

// States the money invariants forbid, made by hand the way a bug, an operator or a restore could
// leave them, that kasa verify must report; and legal states in flight it must call clean.

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
)

func verifyStore(t *testing.T) (*store.Store, context.Context) {
	t.Helper()
	ctx := context.Background()
	own, err := store.Open(ctx, store.Options{URL: env.OwnDatabase(t), SecretKey: testkit.SecretKey, Migrate: true})
	require.NoError(t, err)
	t.Cleanup(own.Close)
	return own, ctx
}

func verifyBegin(t *testing.T, st *store.Store, m testkit.Merchant, amount int64, manual bool) payment.Payment {
	t.Helper()
	key := uuid.NewString()
	req := payment.Request{InvoiceID: key, AmountMinor: amount, Currency: "TRY", AccountID: m.Account, PaymentType: "purchase", CaptureManual: manual}
	_, p, began, err := st.Begin(context.Background(), store.BeginInput{MerchantID: m.ID, Key: key, Request: req,
		OperationID: payment.NewID(), Lease: time.Minute, CaptureWindow: time.Hour})
	require.NoError(t, err)
	require.Equal(t, store.BeganNew, began)
	return p
}

func problemsOf(t *testing.T, st *store.Store) []string {
	t.Helper()
	problems, err := st.Verify(context.Background())
	require.NoError(t, err)
	return problems
}

// An open payment's hold is checked against the payment: a hold shrunk to 1, a hold deleted, a
// hold released while the charge is in flight, a hold moved to another payer. Each keeps reserved
// equal to the active reservations, so only the payment-by-payment check sees it.
func TestVerifyReportsAnOpenPaymentsHold(t *testing.T) {
	t.Parallel()
	st, ctx := verifyStore(t)
	m := testkit.NewMerchant(t, st, testkit.MerchantOptions{Deposit: 100_000})
	other, err := st.CreateAccount(ctx, m.ID, "TRY")
	require.NoError(t, err)
	_, _, err = st.Deposit(ctx, other.ID, "seed", 10_000)
	require.NoError(t, err)

	unknown := func() payment.Payment {
		p := verifyBegin(t, st, m, 1_000, false)
		require.NoError(t, st.Reserve(ctx, p.ID))
		_, err := st.MarkUnknown(ctx, p.ID)
		require.NoError(t, err)
		return p
	}
	shrunk, deleted, moved := unknown(), unknown(), unknown()
	inFlight := verifyBegin(t, st, m, 1_000, false)
	require.NoError(t, st.Reserve(ctx, inFlight.ID))
	require.Empty(t, problemsOf(t, st))

	// (a) unknown payment of 1000 holding 1.
	require.NoError(t, st.Exec(ctx, `UPDATE balance_reservations SET amount_minor = 1 WHERE operation_id = $1`, shrunk.ID))
	require.NoError(t, st.Exec(ctx, `UPDATE accounts SET reserved = reserved - 999 WHERE id = $1`, m.Account))
	// (b) unknown payment holding nothing at all (§4: it keeps its reservation until reconciled).
	require.NoError(t, st.Exec(ctx, `DELETE FROM balance_reservations WHERE operation_id = $1`, deleted.ID))
	require.NoError(t, st.Exec(ctx, `UPDATE accounts SET reserved = reserved - 1000 WHERE id = $1`, m.Account))
	// (c) processing payment (charge in flight) whose hold was released.
	require.NoError(t, st.Exec(ctx, `UPDATE balance_reservations SET status = 'released' WHERE operation_id = $1`, inFlight.ID))
	require.NoError(t, st.Exec(ctx, `UPDATE accounts SET reserved = reserved - 1000 WHERE id = $1`, m.Account))
	// (d) unknown payment whose hold is on another payer's account.
	require.NoError(t, st.Exec(ctx, `UPDATE balance_reservations SET account_id = $2 WHERE operation_id = $1`, moved.ID, other.ID))
	require.NoError(t, st.Exec(ctx, `UPDATE accounts SET reserved = reserved - 1000 WHERE id = $1`, m.Account))
	require.NoError(t, st.Exec(ctx, `UPDATE accounts SET reserved = reserved + 1000 WHERE id = $1`, other.ID))

	problems := problemsOf(t, st)
	require.Len(t, problems, 4, "%v", problems)
	for _, p := range []payment.Payment{shrunk, deleted, inFlight, moved} {
		require.Contains(t, strings.Join(problems, "\n"), "an open payment holds its whole amount on its payer's account: "+
			string(map[bool]payment.Status{true: payment.StatusProcessing, false: payment.StatusUnknown}[p.ID == inFlight.ID])+" payment "+p.ID.String())
	}
}

// A payment posting moves money from its payer to its own merchant's settlement account: one of
// merchant A's payer that credited merchant B is reported.
func TestVerifyReportsAPaymentPostedToAnotherMerchant(t *testing.T) {
	t.Parallel()
	st, ctx := verifyStore(t)
	a := testkit.NewMerchant(t, st, testkit.MerchantOptions{Deposit: 10_000})
	b := testkit.NewMerchant(t, st, testkit.MerchantOptions{})
	p := verifyBegin(t, st, a, 1_000, false)
	require.NoError(t, st.Reserve(ctx, p.ID))
	// Finalize credits the settlement account of payments.merchant_id: point it at B for the posting.
	require.NoError(t, st.Exec(ctx, `UPDATE payments SET merchant_id = $2 WHERE id = $1`, p.ID, b.ID))
	_, err := st.Finalize(ctx, p.ID, "ch")
	require.NoError(t, err)
	require.NoError(t, st.Exec(ctx, `UPDATE payments SET merchant_id = $2 WHERE id = $1`, p.ID, a.ID))

	var bSettled int64
	require.NoError(t, st.QueryRow(ctx, `SELECT coalesce(sum(e.amount_minor), 0) FROM ledger_entries e JOIN accounts s ON s.id = e.account_id
		WHERE s.kind = 'settlement' AND s.merchant_id = $1`, []any{b.ID}, &bSettled))
	require.Equal(t, int64(1_000), bSettled, "merchant A's payment paid merchant B")
	problems := problemsOf(t, st)
	require.Len(t, problems, 1, "%v", problems)
	require.Contains(t, problems[0], "a succeeded payment moved its amount from its payer to its merchant: payment "+p.ID.String())
}

// A posting of kind payment whose reference is no payment is reported, as a refund posting
// without its refund is.
func TestVerifyReportsAPaymentPostingOfNoPayment(t *testing.T) {
	t.Parallel()
	st, ctx := verifyStore(t)
	m := testkit.NewMerchant(t, st, testkit.MerchantOptions{Deposit: 10_000})
	_, err := testkit.Settle(ctx, st, m, false) // the settlement account gets its shard
	require.NoError(t, err)
	require.Empty(t, problemsOf(t, st))
	require.NoError(t, st.Exec(ctx, `WITH p AS (INSERT INTO ledger_postings (id, kind, reference) VALUES (gen_random_uuid(), 'payment', gen_random_uuid()::text) RETURNING id),
e AS (INSERT INTO ledger_entries (id, posting_id, account_id, currency, amount_minor)
      SELECT gen_random_uuid(), p.id, x.acc, 'TRY', x.amt FROM p,
        (VALUES ((SELECT id FROM accounts WHERE merchant_id = $1 AND kind = 'settlement'), 5000::bigint), ($2::uuid, -5000::bigint)) x(acc, amt)
      RETURNING account_id, amount_minor),
c AS (UPDATE accounts a SET balance = a.balance + e.amount_minor FROM e WHERE a.id = e.account_id AND a.kind = 'customer')
UPDATE settlement_shards s SET balance = s.balance + e.amount_minor FROM e
WHERE s.account_id = e.account_id AND s.shard = (SELECT min(shard) FROM settlement_shards WHERE account_id = e.account_id)`, m.ID, m.Account))
	a, err := st.Account(ctx, m.Account)
	require.NoError(t, err)
	require.Equal(t, int64(10_000-100-5_000), a.Balance)
	problems := problemsOf(t, st)
	require.Len(t, problems, 1, "5000 taken from the payer by no payment: %v", problems)
	require.Contains(t, problems[0], "no other payment has a posting: payment posting")
	require.Contains(t, problems[0], "whose payment is missing")
}

// A refund is checked against its payment: a succeeded refund of a payment that failed (never
// charged; the table's CHECK allows it), and a refund crediting an account that is not the
// payer's, are reported.
func TestVerifyReportsARefundItsPaymentDoesNotAllow(t *testing.T) {
	t.Parallel()
	st, ctx := verifyStore(t)
	m := testkit.NewMerchant(t, st, testkit.MerchantOptions{Deposit: 10_000})
	paid := verifyBegin(t, st, m, 2_000, false)
	require.NoError(t, st.Reserve(ctx, paid.ID))
	_, err := st.Finalize(ctx, paid.ID, "ch")
	require.NoError(t, err)
	failed := verifyBegin(t, st, m, 1_000, false)
	require.NoError(t, st.Reserve(ctx, failed.ID))
	_, err = st.Release(ctx, failed.ID, payment.FailureDeclined)
	require.NoError(t, err)
	require.Empty(t, problemsOf(t, st))

	// A succeeded refund, its finalized hold and its posting (settlement -> to), as PostRefund writes them.
	refund := func(paymentID, to uuid.UUID, amount int64) {
		require.NoError(t, st.Exec(ctx, `WITH r AS (
  INSERT INTO refunds (id, payment_id, merchant_id, idempotency_key, account_id, amount_minor, currency, status, provider_reference)
  VALUES (gen_random_uuid(), $1, $2, gen_random_uuid()::text, $3, $4, 'TRY', 'succeeded', 'rf') RETURNING id),
s AS (SELECT id FROM accounts WHERE merchant_id = $2 AND kind = 'settlement'),
b AS (INSERT INTO balance_reservations (id, operation_id, account_id, amount_minor, status) SELECT gen_random_uuid(), r.id, s.id, $4, 'finalized' FROM r, s),
lp AS (INSERT INTO ledger_postings (id, kind, reference) SELECT gen_random_uuid(), 'refund', r.id::text FROM r RETURNING id),
e AS (INSERT INTO ledger_entries (id, posting_id, account_id, currency, amount_minor)
  SELECT gen_random_uuid(), lp.id, x.acc, 'TRY', x.amt FROM lp, (VALUES ((SELECT id FROM s), -$4::bigint), ($3::uuid, $4::bigint)) x(acc, amt)),
c AS (UPDATE accounts SET balance = balance + $4 WHERE id = $3),
sh AS (UPDATE settlement_shards SET balance = balance - $4 WHERE account_id = (SELECT id FROM s)
  AND shard = (SELECT min(shard) FROM settlement_shards WHERE account_id = (SELECT id FROM s)))
UPDATE payments SET refunded_minor = refunded_minor + $4 WHERE id = $1`, paymentID, m.ID, to, amount))
	}
	refund(failed.ID, m.Account, 1_000) // the payer gets back 1000 it was never charged
	other, err := st.CreateAccount(ctx, m.ID, "TRY")
	require.NoError(t, err)
	refund(paid.ID, other.ID, 500) // a refund of m.Account's payment paid to another account

	var p payment.Payment
	p, err = st.Payment(ctx, failed.ID)
	require.NoError(t, err)
	require.Equal(t, payment.StatusFailed, p.Status)
	require.Equal(t, int64(1_000), p.AmountRefunded)
	problems := problemsOf(t, st)
	joined := strings.Join(problems, "\n")
	require.Contains(t, joined, "a refund pays back its succeeded payment's payer: succeeded refund")
	require.Contains(t, joined, "of failed payment "+failed.ID.String())
	require.Contains(t, joined, "of succeeded payment "+paid.ID.String()+" paid to account "+other.ID.String())
}

// An open payment (processing or unknown) keeps its idempotency record: the records of open
// payments are never deleted, and are how they are found. One without its record is reported.
func TestVerifyReportsAnOpenPaymentWithoutItsRecord(t *testing.T) {
	t.Parallel()
	st, ctx := verifyStore(t)
	m := testkit.NewMerchant(t, st, testkit.MerchantOptions{Deposit: 10_000})
	p := verifyBegin(t, st, m, 1_000, false)
	require.NoError(t, st.Reserve(ctx, p.ID))
	_, err := st.MarkUnknown(ctx, p.ID)
	require.NoError(t, err)
	q := verifyBegin(t, st, m, 1_000, false) // processing, never started
	require.NoError(t, st.Exec(ctx, `DELETE FROM idempotency_records WHERE operation_id IN ($1, $2)`, p.ID, q.ID))
	problems := problemsOf(t, st)
	require.Len(t, problems, 2, "%v", problems)
	for _, id := range []uuid.UUID{p.ID, q.ID} {
		require.Contains(t, strings.Join(problems, "\n"), "an open payment keeps its idempotency record: ")
		require.Contains(t, strings.Join(problems, "\n"), "payment "+id.String()+" has no idempotency record")
	}
}

// Refunded <= captured is checked, not left to the table's CHECK alone: with the CHECK gone (the
// owner's power, which the periodic verify is there to catch: docs/security.md) a manual payment
// that captured 300 and refunded 800 is reported.
func TestVerifyReportsARefundAboveTheCapture(t *testing.T) {
	t.Parallel()
	st, ctx := verifyStore(t)
	m := testkit.NewMerchant(t, st, testkit.MerchantOptions{Deposit: 10_000})
	_, err := testkit.Settle(ctx, st, m, false)
	require.NoError(t, err)
	// Another payment funds the settlement account enough for the refunds.
	big := verifyBegin(t, st, m, 5_000, false)
	require.NoError(t, st.Reserve(ctx, big.ID))
	_, err = st.Finalize(ctx, big.ID, "ch")
	require.NoError(t, err)
	p := verifyBegin(t, st, m, 1_000, true)
	require.NoError(t, st.Reserve(ctx, p.ID))
	_, err = st.Authorized(ctx, p.ID, "au")
	require.NoError(t, err)
	_, err = st.Captured(ctx, p.ID, 300, "au", uuid.Nil)
	require.NoError(t, err)
	require.NoError(t, st.Exec(ctx, `ALTER TABLE payments DROP CONSTRAINT payments_refundable`))
	require.NoError(t, st.Exec(ctx, `WITH r AS (
  INSERT INTO refunds (id, payment_id, merchant_id, idempotency_key, account_id, amount_minor, currency, status, provider_reference)
  VALUES (gen_random_uuid(), $1, $2, gen_random_uuid()::text, $3, 800, 'TRY', 'succeeded', 'rf') RETURNING id),
s AS (SELECT id FROM accounts WHERE merchant_id = $2 AND kind = 'settlement'),
b AS (INSERT INTO balance_reservations (id, operation_id, account_id, amount_minor, status) SELECT gen_random_uuid(), r.id, s.id, 800, 'finalized' FROM r, s),
lp AS (INSERT INTO ledger_postings (id, kind, reference) SELECT gen_random_uuid(), 'refund', r.id::text FROM r RETURNING id),
e AS (INSERT INTO ledger_entries (id, posting_id, account_id, currency, amount_minor)
  SELECT gen_random_uuid(), lp.id, x.acc, 'TRY', x.amt FROM lp, (VALUES ((SELECT id FROM s), -800::bigint), ($3::uuid, 800::bigint)) x(acc, amt)),
c AS (UPDATE accounts SET balance = balance + 800 WHERE id = $3),
sh AS (UPDATE settlement_shards SET balance = balance - 800 WHERE account_id = (SELECT id FROM s)
  AND shard = (SELECT shard FROM settlement_shards WHERE account_id = (SELECT id FROM s) AND balance >= 800 LIMIT 1))
UPDATE payments SET refunded_minor = 800 WHERE id = $1`, p.ID, m.ID, m.Account))
	got, err := st.Payment(ctx, p.ID)
	require.NoError(t, err)
	require.Equal(t, int64(300), got.CapturedMinor)
	require.Equal(t, int64(800), got.AmountRefunded)
	problems := problemsOf(t, st)
	require.Len(t, problems, 1, "%v", problems)
	require.Contains(t, problems[0], "a payment refunds no more than it took: payment "+p.ID.String()+" refunded 800 and holds 0 of the 300 it took")
}

// Legal states in flight are clean: a queued payment, processing and unknown ones with their
// holds, manual payments waiting, unknown or partly captured, refunds in flight, an expired record.
func TestVerifyCallsStatesInFlightClean(t *testing.T) {
	t.Parallel()
	st, ctx := verifyStore(t)
	m := testkit.NewMerchant(t, st, testkit.MerchantOptions{Deposit: 100_000})
	// queued in the start backlog
	key := uuid.NewString()
	_, _, _, err := st.Begin(ctx, store.BeginInput{MerchantID: m.ID, Key: key, Queue: true, OperationID: payment.NewID(), Lease: time.Minute,
		Request: payment.Request{InvoiceID: key, AmountMinor: 100, Currency: "TRY", AccountID: m.Account, PaymentType: "purchase"}})
	require.NoError(t, err)
	// processing with its hold; unknown
	p1 := verifyBegin(t, st, m, 100, false)
	require.NoError(t, st.Reserve(ctx, p1.ID))
	p2 := verifyBegin(t, st, m, 100, false)
	require.NoError(t, st.Reserve(ctx, p2.ID))
	_, err = st.MarkUnknown(ctx, p2.ID)
	require.NoError(t, err)
	// manual: waiting; unknown capture; partial capture
	auth := func() payment.Payment {
		p := verifyBegin(t, st, m, 1_000, true)
		require.NoError(t, st.Reserve(ctx, p.ID))
		_, err := st.Authorized(ctx, p.ID, "au")
		require.NoError(t, err)
		return p
	}
	auth()
	u := auth()
	_, err = st.MarkUnknown(ctx, u.ID)
	require.NoError(t, err)
	c := auth()
	_, err = st.Captured(ctx, c.ID, 400, "au", uuid.Nil)
	require.NoError(t, err)
	// manual whose authorization is unknown
	au := verifyBegin(t, st, m, 1_000, true)
	require.NoError(t, st.Reserve(ctx, au.ID))
	_, err = st.MarkUnknown(ctx, au.ID)
	require.NoError(t, err)
	// refunds: in flight before and after the hold, unknown
	req, err := payment.ParseRefundRequest([]byte(`{"amount":"1"}`))
	require.NoError(t, err)
	for i, step := range []string{"begun", "held", "unknown"} {
		_, r, _, err := st.BeginRefund(ctx, store.BeginRefundInput{MerchantID: m.ID, PaymentID: c.ID, Key: step, Request: req, OperationID: payment.NewID(), Lease: time.Minute})
		require.NoError(t, err, "%d", i)
		if step != "begun" {
			require.NoError(t, st.HoldRefund(ctx, r.ID))
		}
		if step == "unknown" {
			_, err = st.MarkRefundUnknown(ctx, r.ID)
			require.NoError(t, err)
		}
	}
	// an expired record of a finished payment
	_, err = testkit.Settle(ctx, st, m, true)
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond)
	n, err := st.DeleteExpiredRecords(ctx, time.Millisecond, 100)
	require.NoError(t, err)
	require.Positive(t, n)
	problems := problemsOf(t, st)
	require.Empty(t, problems, "%v", problems)
}

// A manual payment's hold is on its payer's account: one moved to another account, with each
// account's reserved kept equal to its reservations, is a violation.
func TestVerifyFindsAnAuthorizationHoldOnAnotherAccount(t *testing.T) {
	t.Parallel()
	st, ctx := verifyStore(t)
	m := testkit.NewMerchant(t, st, testkit.MerchantOptions{Deposit: 100_000})
	other, err := st.CreateAccount(ctx, m.ID, "TRY")
	require.NoError(t, err)
	_, _, err = st.Deposit(ctx, other.ID, "seed", 10_000)
	require.NoError(t, err)
	p := verifyBegin(t, st, m, 1_000, true)
	require.NoError(t, st.Reserve(ctx, p.ID))
	_, err = st.Authorized(ctx, p.ID, "au")
	require.NoError(t, err)
	require.Empty(t, problemsOf(t, st))
	require.NoError(t, st.Exec(ctx, `UPDATE balance_reservations SET account_id = $2 WHERE operation_id = $1`, p.ID, other.ID))
	require.NoError(t, st.Exec(ctx, `UPDATE accounts SET reserved = reserved - 1000 WHERE id = $1`, m.Account))
	require.NoError(t, st.Exec(ctx, `UPDATE accounts SET reserved = reserved + 1000 WHERE id = $1`, other.ID))
	require.NotEmpty(t, problemsOf(t, st), "the authorization's hold is not on its payer's account")
}

// A deposit posting is its deposit's: one whose reference is no deposit, and a deposit whose
// posting credited more than the deposit's amount, are money that came from outside unasked,
// and are reported though every balance equals its ledger sum.
func TestVerifyReportsADepositPostingItsDepositDoesNotMatch(t *testing.T) {
	t.Parallel()
	st, ctx := verifyStore(t)
	m := testkit.NewMerchant(t, st, testkit.MerchantOptions{Deposit: 10_000})
	other, err := st.CreateAccount(ctx, m.ID, "TRY")
	require.NoError(t, err)
	require.Empty(t, problemsOf(t, st))

	// post writes a deposit posting of amount from the external account to the payer, with the
	// payer's balance, as Deposit does, and returns the posting's id.
	post := func(reference string, amount int64) uuid.UUID {
		id := uuid.New()
		require.NoError(t, st.Exec(ctx, `WITH p AS (INSERT INTO ledger_postings (id, kind, reference) VALUES ($1, 'deposit', $2) RETURNING id),
e AS (INSERT INTO ledger_entries (id, posting_id, account_id, currency, amount_minor)
      SELECT gen_random_uuid(), p.id, x.acc, 'TRY', x.amt FROM p,
        (VALUES ($3::uuid, $4::bigint), ((SELECT id FROM accounts WHERE kind = 'external' AND currency = 'TRY'), -$4::bigint)) x(acc, amt)
      RETURNING account_id, amount_minor)
UPDATE accounts a SET balance = a.balance + e.amount_minor FROM e WHERE a.id = e.account_id`, id, reference, m.Account, amount))
		return id
	}
	// (a) 5000 from outside by no deposit.
	noDeposit := uuid.New()
	post(noDeposit.String(), 5_000)
	// (b) a deposit of 100 whose posting credited 7000.
	more := uuid.New()
	require.NoError(t, st.Exec(ctx, `INSERT INTO deposits (id, account_id, idempotency_key, amount_minor, posting_id) VALUES ($1, $2, 'more', 100, $3)`,
		more, m.Account, post(more.String(), 7_000)))
	// (c) a deposit to one account whose posting credited another.
	elsewhere := uuid.New()
	require.NoError(t, st.Exec(ctx, `INSERT INTO deposits (id, account_id, idempotency_key, amount_minor, posting_id) VALUES ($1, $2, 'elsewhere', 300, $3)`,
		elsewhere, other.ID, post(elsewhere.String(), 300)))

	problems := problemsOf(t, st)
	require.Len(t, problems, 3, "%v", problems)
	all := strings.Join(problems, "\n")
	for _, id := range []uuid.UUID{noDeposit, more, elsewhere} {
		require.Contains(t, all, "a deposit posting credits its deposit's amount to its account from outside: deposit posting for "+id.String())
	}
}

// Money that moved in the ledger's own records but not in its entries: a succeeded payment, a
// succeeded refund or a deposit whose posting lost its entries (a backup whose ledger_entries lag
// ledger_postings, or the owner's hand), and a deposit with no posting of its own, each with the
// balances put back to their ledger sums, so that only the operation-by-operation checks see it.
func TestVerifyReportsOperationsWithoutTheirEntries(t *testing.T) {
	t.Parallel()
	// dropEntries deletes a posting's entries, as the owner can with the ledger's trigger off, and
	// gives each account back what they moved (a settlement account's from its first shard).
	dropEntries := func(t *testing.T, st *store.Store, posting string) {
		ctx := context.Background()
		require.NoError(t, st.Exec(ctx, `ALTER TABLE ledger_entries DISABLE TRIGGER ledger_entries_immutable`))
		require.NoError(t, st.Exec(ctx, `WITH e AS (DELETE FROM ledger_entries WHERE posting_id = $1::uuid RETURNING account_id, amount_minor),
a AS (UPDATE accounts a SET balance = a.balance - e.amount_minor FROM e WHERE a.id = e.account_id AND a.kind <> 'settlement')
UPDATE settlement_shards s SET balance = s.balance - e.amount_minor FROM e
WHERE s.account_id = e.account_id AND s.shard = (SELECT min(shard) FROM settlement_shards WHERE account_id = e.account_id)`, posting))
		require.NoError(t, st.Exec(ctx, `ALTER TABLE ledger_entries ENABLE TRIGGER ledger_entries_immutable`))
	}
	postingOf := func(t *testing.T, st *store.Store, kind, reference string) string {
		var id string
		require.NoError(t, st.QueryRow(context.Background(), `SELECT id::text FROM ledger_postings WHERE kind = $1 AND reference = $2`,
			[]any{kind, reference}, &id))
		return id
	}
	for _, tc := range []struct {
		name    string
		corrupt func(t *testing.T, st *store.Store, m testkit.Merchant) string // the operation's id, which the report names
		want    string
	}{
		{"a succeeded payment whose posting has no entries", func(t *testing.T, st *store.Store, m testkit.Merchant) string {
			id, err := testkit.Settle(context.Background(), st, m, false)
			require.NoError(t, err)
			dropEntries(t, st, postingOf(t, st, "payment", id.String()))
			return id.String()
		}, "a succeeded payment moved its amount from its payer to its merchant: payment "},
		{"a succeeded refund whose posting has no entries", func(t *testing.T, st *store.Store, m testkit.Merchant) string {
			ctx := context.Background()
			paid, err := testkit.Settle(ctx, st, m, false)
			require.NoError(t, err)
			req, err := payment.ParseRefundRequest([]byte(`{"amount":"0.40"}`))
			require.NoError(t, err)
			_, r, _, err := st.BeginRefund(ctx, store.BeginRefundInput{MerchantID: m.ID, PaymentID: paid, Key: "rf", Request: req,
				OperationID: payment.NewID(), Lease: time.Minute})
			require.NoError(t, err)
			require.NoError(t, st.HoldRefund(ctx, r.ID))
			_, err = st.PostRefund(ctx, r.ID, "rf")
			require.NoError(t, err)
			dropEntries(t, st, postingOf(t, st, "refund", r.ID.String()))
			return r.ID.String()
		}, "a succeeded refund moved its amount from settlement to payer: refund "},
		{"a deposit whose posting has no entries", func(t *testing.T, st *store.Store, m testkit.Merchant) string {
			d, _, err := st.Deposit(context.Background(), m.Account, "more", 700)
			require.NoError(t, err)
			dropEntries(t, st, postingOf(t, st, "deposit", d.ID.String()))
			return d.ID.String()
		}, "a deposit posting credits its deposit's amount to its account from outside: deposit "},
		{"a deposit whose posting is another deposit's", func(t *testing.T, st *store.Store, m testkit.Merchant) string {
			ctx := context.Background()
			first, _, err := st.Deposit(ctx, m.Account, "first", 300)
			require.NoError(t, err)
			d, _, err := st.Deposit(ctx, m.Account, "second", 700)
			require.NoError(t, err)
			own := postingOf(t, st, "deposit", d.ID.String())
			dropEntries(t, st, own)
			require.NoError(t, st.Exec(ctx, `UPDATE deposits SET posting_id = $2::uuid WHERE id = $1`, d.ID, postingOf(t, st, "deposit", first.ID.String())))
			require.NoError(t, st.Exec(ctx, `ALTER TABLE ledger_postings DISABLE TRIGGER ledger_postings_immutable`))
			require.NoError(t, st.Exec(ctx, `DELETE FROM ledger_postings WHERE id = $1::uuid`, own))
			require.NoError(t, st.Exec(ctx, `ALTER TABLE ledger_postings ENABLE TRIGGER ledger_postings_immutable`))
			return d.ID.String()
		}, "a deposit posting credits its deposit's amount to its account from outside: deposit "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st, ctx := verifyStore(t)
			m := testkit.NewMerchant(t, st, testkit.MerchantOptions{Deposit: 10_000})
			id := tc.corrupt(t, st, m)
			a, err := st.Account(ctx, m.Account)
			require.NoError(t, err)
			require.Positive(t, a.Balance)
			problems := problemsOf(t, st)
			require.Len(t, problems, 1, "%v", problems)
			require.Contains(t, problems[0], tc.want)
			require.Contains(t, problems[0], id)
		})
	}
}
