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
-- Balance (a settlement account's: its shards' sum) equals the ledger sum.
SELECT 'account ' || a.id || ' balance ' || (a.balance + coalesce(s.balance, 0)) || ' but ledger ' || coalesce(l.total, 0)
FROM accounts a LEFT JOIN (SELECT account_id, sum(amount_minor) AS total FROM ledger_entries GROUP BY account_id) l
  ON l.account_id = a.id
LEFT JOIN (SELECT account_id, sum(balance) AS balance FROM settlement_shards GROUP BY account_id) s ON s.account_id = a.id
WHERE a.balance + coalesce(s.balance, 0) <> coalesce(l.total, 0);

-- name: ReservedNotReservations :many
-- Reserved (a settlement account's: its shards' sum) equals active reservations.
SELECT 'account ' || a.id || ' reserved ' || (a.reserved + coalesce(s.reserved, 0)) || ' but active reservations ' || coalesce(r.total, 0)
FROM accounts a LEFT JOIN (SELECT account_id, sum(amount_minor) AS total FROM balance_reservations
  WHERE status = 'active' GROUP BY account_id) r ON r.account_id = a.id
LEFT JOIN (SELECT account_id, sum(reserved) AS reserved FROM settlement_shards GROUP BY account_id) s ON s.account_id = a.id
WHERE a.reserved + coalesce(s.reserved, 0) <> coalesce(r.total, 0);

-- name: NegativeBalance :many
-- No balance is negative.
SELECT 'account ' || id || ' (' || kind || ') balance ' || balance || ' reserved ' || reserved
FROM accounts WHERE kind <> 'external' AND (balance < 0 OR reserved < 0 OR balance - reserved < 0);

-- name: ShardViolations :many
-- Every shard is a settlement account's and holds no more than its balance; a settlement
-- account's own row holds nothing.
SELECT 'shard ' || s.shard || ' of ' || a.kind || ' account ' || a.id || ' balance ' || s.balance || ' reserved ' || s.reserved
FROM settlement_shards s JOIN accounts a ON a.id = s.account_id
WHERE a.kind <> 'settlement' OR s.shard < 0 OR s.reserved < 0 OR s.balance - s.reserved < 0
UNION ALL
SELECT 'settlement account ' || id || ' holds balance ' || balance || ' reserved ' || reserved || ' outside its shards'
FROM accounts WHERE kind = 'settlement' AND (balance <> 0 OR reserved <> 0);

-- name: SucceededPostingCount :many
-- Every succeeded payment has exactly one posting.
SELECT 'succeeded payment ' || p.id || ' has ' || count(lp.id) || ' postings'
FROM payments p LEFT JOIN ledger_postings lp ON lp.kind = 'payment' AND lp.reference = p.id::text
WHERE p.status = 'succeeded' GROUP BY p.id HAVING count(lp.id) <> 1;

-- name: UnexpectedPosting :many
-- No other payment has a posting, and no payment posting is without its payment.
SELECT 'payment posting ' || lp.id || ' for ' || lp.reference || ' whose payment is ' || coalesce(p.status, 'missing')
FROM ledger_postings lp LEFT JOIN payments p ON p.id::text = lp.reference
WHERE lp.kind = 'payment' AND p.status IS DISTINCT FROM 'succeeded';

-- name: PaymentPostedAccountsMismatch :many
-- A succeeded payment's posting takes what it moved (its amount; a manual one's, what it
-- captured) from its payer, gives it to its own merchant's settlement account, and touches no
-- other account. A posting without entries moved nothing: it is reported, not skipped.
SELECT 'payment ' || p.id || ' took ' || coalesce(-sum(e.amount_minor) FILTER (WHERE e.account_id = p.account_id), 0)
  || ' from its payer and gave ' || coalesce(sum(e.amount_minor) FILTER (WHERE s.id IS NOT NULL), 0)
  || ' to its merchant, of ' || CASE WHEN p.capture_manual THEN p.captured_minor ELSE p.amount_minor END
  || CASE WHEN count(*) FILTER (WHERE e.account_id <> p.account_id AND s.id IS NULL) > 0 THEN ', and moved money on other accounts' ELSE '' END
FROM payments p JOIN ledger_postings lp ON lp.kind = 'payment' AND lp.reference = p.id::text
LEFT JOIN ledger_entries e ON e.posting_id = lp.id
LEFT JOIN accounts s ON s.id = e.account_id AND s.kind = 'settlement' AND s.merchant_id = p.merchant_id
GROUP BY p.id, p.account_id, p.amount_minor, p.capture_manual, p.captured_minor
HAVING coalesce(sum(e.amount_minor) FILTER (WHERE e.account_id = p.account_id), 0) <> -(CASE WHEN p.capture_manual THEN p.captured_minor ELSE p.amount_minor END)
    OR coalesce(sum(e.amount_minor) FILTER (WHERE s.id IS NOT NULL), 0) <> CASE WHEN p.capture_manual THEN p.captured_minor ELSE p.amount_minor END
    OR count(*) FILTER (WHERE e.account_id <> p.account_id AND s.id IS NULL) > 0;

-- name: DepositPostingMismatch :many
-- A deposit posting is its deposit's: it credits the deposit's amount to the deposit's account
-- from its currency's external account, and touches no other account. Money from outside moves
-- only by a deposit an admin asked for; and a deposit has its own posting, one with entries,
-- or the money it answered for never came in.
SELECT 'deposit posting for ' || lp.reference || CASE WHEN d.id IS NULL THEN ' whose deposit is missing'
  ELSE ' credited ' || coalesce(sum(e.amount_minor) FILTER (WHERE e.account_id = d.account_id), 0)
    || ' to the deposit''s account ' || d.account_id || ', of ' || d.amount_minor
    || CASE WHEN count(*) FILTER (WHERE e.account_id <> d.account_id AND x.id IS NULL) > 0 THEN ', and moved money on other accounts' ELSE '' END END
FROM ledger_postings lp LEFT JOIN ledger_entries e ON e.posting_id = lp.id
LEFT JOIN deposits d ON d.posting_id = lp.id AND d.id::text = lp.reference
LEFT JOIN accounts x ON x.id = e.account_id AND x.kind = 'external'
WHERE lp.kind = 'deposit'
GROUP BY lp.id, lp.reference, d.id, d.account_id, d.amount_minor
HAVING d.id IS NULL
    OR coalesce(sum(e.amount_minor) FILTER (WHERE e.account_id = d.account_id), 0) <> d.amount_minor
    OR coalesce(sum(e.amount_minor) FILTER (WHERE x.id IS NOT NULL), 0) <> -d.amount_minor
    OR count(*) FILTER (WHERE e.account_id <> d.account_id AND x.id IS NULL) > 0
UNION ALL
SELECT 'deposit ' || d.id || ' of ' || d.amount_minor || ' to account ' || d.account_id || ' has no deposit posting of its own'
FROM deposits d
WHERE NOT EXISTS (SELECT 1 FROM ledger_postings lp WHERE lp.id = d.posting_id AND lp.kind = 'deposit' AND lp.reference = d.id::text);

-- name: OpenPaymentHoldMismatch :many
-- A payment in flight or unknown holds its whole amount on its payer's account: an active
-- reservation (none yet while it is processing: queued, or not reserved yet).
SELECT p.status || ' payment ' || p.id || ' of ' || p.amount_minor || ' on account ' || p.account_id || ' holds '
  || coalesce(r.status || ' ' || r.amount_minor || ' on account ' || r.account_id, 'nothing')
FROM payments p LEFT JOIN balance_reservations r ON r.operation_id = p.id
WHERE p.status IN ('processing', 'unknown')
  AND CASE WHEN r.id IS NULL THEN p.status = 'unknown'
      ELSE r.status <> 'active' OR r.amount_minor <> p.amount_minor OR r.account_id <> p.account_id END;

-- name: OpenOperationWithoutRecord :many
-- An open payment or refund keeps its idempotency record: records are deleted only once their
-- operation finished, and open operations are found through them.
SELECT p.status || ' payment ' || p.id || ' has no idempotency record' FROM payments p
WHERE p.status IN ('processing', 'unknown', 'requires_capture')
  AND NOT EXISTS (SELECT 1 FROM idempotency_records i WHERE i.operation_id = p.id)
UNION ALL
SELECT r.status || ' refund ' || r.id || ' has no idempotency record' FROM refunds r
WHERE r.status IN ('processing', 'unknown')
  AND NOT EXISTS (SELECT 1 FROM idempotency_records i WHERE i.operation_id = r.id);

-- name: ReservationOutcomeMismatch :many
-- Reservations match payment outcomes.
SELECT p.status || ' payment ' || p.id || ' has a ' || r.status || ' reservation'
FROM payments p JOIN balance_reservations r ON r.operation_id = p.id
WHERE (p.status = 'succeeded' AND r.status <> 'finalized')
   OR (p.status IN ('failed', 'canceled') AND r.status <> 'released')
   OR (p.status IN ('unknown', 'requires_capture') AND r.status <> 'active');

-- name: AuthorizationHoldMismatch :many
-- A manual payment's hold is its whole authorized amount, on its payer's account, while it waits
-- for its capture (and its capture took no more than that: the table's CHECK).
SELECT 'requires_capture payment ' || p.id || ' holds ' || coalesce(r.amount_minor::text, 'nothing') || ' of ' || p.amount_minor ||
  CASE WHEN r.account_id IS DISTINCT FROM p.account_id THEN ' on account ' || coalesce(r.account_id::text, 'none') ||
    ', not its payer''s ' || p.account_id ELSE '' END
FROM payments p LEFT JOIN balance_reservations r ON r.operation_id = p.id AND r.status = 'active'
WHERE p.status = 'requires_capture' AND (r.amount_minor IS DISTINCT FROM p.amount_minor OR r.account_id IS DISTINCT FROM p.account_id);

-- name: OpenAuthorizationMismatch :many
-- An authorization is open exactly while its payment waits for its capture, or its capture or
-- void is unknown.
SELECT p.status || ' payment ' || p.id || CASE WHEN a.payment_id IS NULL THEN ' has no open authorization' ELSE ' has an open authorization' END
FROM payments p LEFT JOIN open_authorizations a ON a.payment_id = p.id
WHERE (p.status = 'requires_capture' AND a.payment_id IS NULL)
   OR (a.payment_id IS NOT NULL AND p.status NOT IN ('requires_capture', 'unknown'));

-- name: RecordPaymentMismatch :many
-- Idempotency records follow their payments.
SELECT 'record ' || i.idempotency_key || ' is ' || i.status || ' but payment ' || p.id || ' is ' || p.status
FROM idempotency_records i JOIN payments p ON p.id = i.operation_id
WHERE (NOT p.capture_manual AND ((p.status IN ('succeeded', 'failed')) <> (i.status = 'completed')
   OR (p.status = 'unknown') <> (i.status = 'unknown')))
-- A manual payment's record completes when it is authorized (or failed); an unknown one's is
-- completed when its capture or void is what is unknown.
   OR (p.capture_manual AND ((p.status IN ('requires_capture', 'succeeded', 'failed', 'canceled') AND i.status <> 'completed')
   OR (p.status = 'processing' AND i.status <> 'processing')));

-- name: SucceededRefundPostingCount :many
-- Every succeeded refund has exactly one refund posting.
SELECT 'succeeded refund ' || r.id || ' has ' || count(lp.id) || ' postings'
FROM refunds r LEFT JOIN ledger_postings lp ON lp.kind = 'refund' AND lp.reference = r.id::text
WHERE r.status = 'succeeded' GROUP BY r.id HAVING count(lp.id) <> 1;

-- name: UnexpectedRefundPosting :many
-- No other refund has a refund posting, and no refund posting is without its refund.
SELECT 'refund posting ' || lp.id || ' for ' || lp.reference || ' whose refund is ' || coalesce(r.status, 'missing')
FROM ledger_postings lp LEFT JOIN refunds r ON r.id::text = lp.reference
WHERE lp.kind = 'refund' AND r.status IS DISTINCT FROM 'succeeded';

-- name: RefundPostedAmountMismatch :many
-- A succeeded refund moved its amount from the merchant's settlement account to the payer's (a
-- posting without entries moved nothing).
SELECT 'refund ' || r.id || ' posted ' || coalesce(sum(e.amount_minor) FILTER (WHERE e.account_id = r.account_id), 0)
  || ' to the payer and ' || coalesce(sum(e.amount_minor) FILTER (WHERE e.account_id <> r.account_id), 0)
  || ' elsewhere of ' || r.amount_minor
FROM refunds r JOIN ledger_postings lp ON lp.kind = 'refund' AND lp.reference = r.id::text
LEFT JOIN ledger_entries e ON e.posting_id = lp.id
LEFT JOIN accounts s ON s.id = e.account_id AND s.kind = 'settlement' AND s.merchant_id = r.merchant_id
GROUP BY r.id, r.account_id, r.amount_minor
HAVING coalesce(sum(e.amount_minor) FILTER (WHERE e.account_id = r.account_id), 0) <> r.amount_minor
    OR coalesce(sum(e.amount_minor) FILTER (WHERE e.account_id <> r.account_id), 0) <> -r.amount_minor
    OR count(*) FILTER (WHERE e.account_id <> r.account_id AND s.id IS NULL) > 0;

-- name: PaymentRefundTotals :many
-- A payment's refunded amount is its succeeded refunds' sum, its held amount its processing and
-- unknown refunds' sum.
SELECT 'payment ' || p.id || ' refunded ' || p.refunded_minor || ' held ' || p.refund_held_minor
  || ' but refunds succeeded ' || coalesce(t.succeeded, 0) || ' in flight ' || coalesce(t.held, 0)
FROM payments p LEFT JOIN (SELECT payment_id,
    sum(amount_minor) FILTER (WHERE status = 'succeeded') AS succeeded,
    sum(amount_minor) FILTER (WHERE status IN ('processing', 'unknown')) AS held
  FROM refunds GROUP BY payment_id) t ON t.payment_id = p.id
WHERE p.refunded_minor <> coalesce(t.succeeded, 0) OR p.refund_held_minor <> coalesce(t.held, 0);

-- name: RefundPaymentMismatch :many
-- A refund (unless it failed) pays back a succeeded payment's payer, in its currency, for its
-- merchant; and a payment refunds, and holds for refunds in flight, no more than it took.
SELECT r.status || ' refund ' || r.id || ' of ' || p.status || ' payment ' || p.id || ' paid to account ' || r.account_id
  || ' (the payer: ' || p.account_id || ')'
FROM refunds r JOIN payments p ON p.id = r.payment_id
WHERE r.status <> 'failed'
  AND (p.status <> 'succeeded' OR r.account_id <> p.account_id OR r.merchant_id <> p.merchant_id OR r.currency <> p.currency);

-- name: RefundedAboveTaken :many
SELECT 'payment ' || id || ' refunded ' || refunded_minor || ' and holds ' || refund_held_minor || ' of the '
  || CASE WHEN capture_manual THEN captured_minor ELSE amount_minor END || ' it took'
FROM payments WHERE refunded_minor + refund_held_minor > CASE WHEN capture_manual THEN captured_minor ELSE amount_minor END;

-- name: RefundReservationMismatch :many
-- A refund's hold is on its merchant's settlement account for its amount: finalized when it
-- succeeded, released (or never made) when it failed, active while it is unknown.
SELECT r.status || ' refund ' || r.id || ' has ' || coalesce(b.status || ' reservation of ' || b.amount_minor, 'no reservation')
FROM refunds r LEFT JOIN balance_reservations b ON b.operation_id = r.id
LEFT JOIN accounts a ON a.id = b.account_id
WHERE (r.status = 'succeeded' AND b.status IS DISTINCT FROM 'finalized')
   OR (r.status = 'failed' AND b.status IS NOT NULL AND b.status <> 'released')
   OR (r.status = 'unknown' AND b.status IS DISTINCT FROM 'active')
   OR (r.status = 'processing' AND b.status IS NOT NULL AND b.status <> 'active')
   OR (b.id IS NOT NULL AND (b.amount_minor <> r.amount_minor OR a.kind <> 'settlement'
       OR a.merchant_id <> r.merchant_id OR a.currency <> r.currency));

-- name: OrphanReservation :many
-- Every reservation is a payment's or a refund's.
SELECT 'reservation ' || b.id || ' for operation ' || b.operation_id || ' which is neither a payment nor a refund'
FROM balance_reservations b
WHERE NOT EXISTS (SELECT 1 FROM payments p WHERE p.id = b.operation_id)
  AND NOT EXISTS (SELECT 1 FROM refunds r WHERE r.id = b.operation_id);

-- name: RecordRefundMismatch :many
-- Idempotency records follow their refunds.
SELECT 'refund record ' || i.idempotency_key || ' is ' || i.status || ' but refund ' || r.id || ' is ' || r.status
FROM idempotency_records i JOIN refunds r ON r.id = i.operation_id
WHERE i.scope <> 'refund'
   OR (r.status IN ('succeeded', 'failed')) <> (i.status = 'completed')
   OR (r.status = 'unknown') <> (i.status = 'unknown');
