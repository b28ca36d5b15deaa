-- The money invariants Verify checks: each query returns one readable line per violation;
-- none may return a row.

-- name: UnbalancedPostings :many
-- Ledger postings balance per currency.
SELECT 'posting ' || posting_id || ' ' || currency || ' sums to ' || sum(amount_minor)
FROM ledger_entries GROUP BY posting_id, currency HAVING sum(amount_minor) <> 0;

-- name: UnbalancedLedger :many
-- The whole ledger sums to zero per currency.
SELECT 'ledger ' || currency || ' sums to ' || sum(amount_minor) FROM ledger_entries GROUP BY currency HAVING sum(amount_minor) <> 0;

-- name: EntryCurrencyMismatch :many
-- Every entry's currency is its account's.
SELECT 'entry ' || e.id || ' in ' || e.currency || ' on ' || a.currency || ' account ' || a.id
FROM ledger_entries e JOIN accounts a ON a.id = e.account_id WHERE e.currency <> a.currency;

-- name: BalanceNotLedgerSum :many
-- Balance equals the ledger sum.
SELECT 'account ' || a.id || ' balance ' || a.balance || ' but ledger ' || coalesce(l.total, 0)
FROM accounts a LEFT JOIN (SELECT account_id, sum(amount_minor) AS total FROM ledger_entries GROUP BY account_id) l
  ON l.account_id = a.id
WHERE a.balance <> coalesce(l.total, 0);

-- name: ReservedNotReservations :many
-- Reserved equals active reservations.
SELECT 'account ' || a.id || ' reserved ' || a.reserved || ' but active reservations ' || coalesce(r.total, 0)
FROM accounts a LEFT JOIN (SELECT account_id, sum(amount_minor) AS total FROM balance_reservations
  WHERE status = 'active' GROUP BY account_id) r ON r.account_id = a.id
WHERE a.reserved <> coalesce(r.total, 0);

-- name: NegativeBalance :many
-- No balance is negative.
SELECT 'account ' || id || ' (' || kind || ') balance ' || balance || ' reserved ' || reserved
FROM accounts WHERE kind <> 'external' AND (balance < 0 OR reserved < 0 OR balance - reserved < 0);

-- name: SucceededPostingCount :many
-- Every succeeded payment has exactly one posting.
SELECT 'succeeded payment ' || p.id || ' has ' || count(lp.id) || ' postings'
FROM payments p LEFT JOIN ledger_postings lp ON lp.kind = 'payment' AND lp.reference = p.id::text
WHERE p.status = 'succeeded' GROUP BY p.id HAVING count(lp.id) <> 1;

-- name: UnexpectedPosting :many
-- No other payment has a posting.
SELECT p.status || ' payment ' || p.id || ' has a ledger posting'
FROM payments p JOIN ledger_postings lp ON lp.kind = 'payment' AND lp.reference = p.id::text
WHERE p.status <> 'succeeded';

-- name: PostedAmountMismatch :many
-- A succeeded payment moved its amount.
SELECT 'payment ' || p.id || ' posted ' || coalesce(sum(e.amount_minor) FILTER (WHERE e.amount_minor > 0), 0) || ' of ' || p.amount_minor
FROM payments p JOIN ledger_postings lp ON lp.kind = 'payment' AND lp.reference = p.id::text
JOIN ledger_entries e ON e.posting_id = lp.id GROUP BY p.id HAVING coalesce(sum(e.amount_minor) FILTER (WHERE e.amount_minor > 0), 0) <> p.amount_minor;

-- name: ReservationOutcomeMismatch :many
-- Reservations match payment outcomes.
SELECT p.status || ' payment ' || p.id || ' has a ' || r.status || ' reservation'
FROM payments p JOIN balance_reservations r ON r.operation_id = p.id
WHERE (p.status = 'succeeded' AND r.status <> 'finalized')
   OR (p.status = 'failed' AND r.status <> 'released')
   OR (p.status = 'unknown' AND r.status <> 'active');

-- name: RecordPaymentMismatch :many
-- Idempotency records follow their payments.
SELECT 'record ' || i.idempotency_key || ' is ' || i.status || ' but payment ' || p.id || ' is ' || p.status
FROM idempotency_records i JOIN payments p ON p.id = i.operation_id
WHERE (p.status IN ('succeeded', 'failed')) <> (i.status = 'completed')
   OR (p.status = 'unknown') <> (i.status = 'unknown');
