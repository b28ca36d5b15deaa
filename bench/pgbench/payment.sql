-- mirrors store.sqlMerchantByKey, store.sqlCustomerAccount, store.sqlAcquire, store.sqlInsertPayment,
-- mirrors store.sqlReserveFunds, store.sqlCloseReservation,
-- mirrors store.sqlSetStatusSettlement, store.sqlCapture, store.sqlInsertPosting,
-- mirrors store.sqlInsertEntryPair, store.sqlCredit, store.sqlRecordStatus, store.sqlInsertOutbox,
-- mirrors store.sqlRecord
--
-- One pgbench transaction is the whole database work of one new payment that succeeds, statement
-- for statement and transaction for transaction, in the order kasa runs it: the API
-- (authenticate, store.Begin, whose batch first reads the key's record and finds none) and the
-- worker's activities (store.Reserve, which also marks the workflow started; store.Finalize,
-- which also stores the answer, handed in process to the API as its response).
-- Left out: store.BeginChargeAttempt (the Charge activity writes it only for a provider without
-- idempotency; the default provider capability is idempotent), the API's 250 ms polls of the
-- record while it waits (none when the workflow finishes first) and the relay's later work on
-- the outbox row. TestPGBenchScriptsMirrorStore also checks that the API and the activities call
-- no store method this list does not account for.
--
-- Every statement marked "-- store.sqlX" must equal that Go constant up to whitespace and
-- parameter names: bench's TestPGBenchScriptsMirrorStore checks it. Run with -M prepared (pgx
-- prepares and caches every statement too), -D merchants=N -D payers=P, and the fixture schema
-- (setup.sql) as the only schema on the search_path. pgbench reads :name as a variable even inside
-- a string literal: keep colons out of literals.

\set m random(1, :merchants)
\set p random(1, :payers)
\set amount random(100, 10000)
\set neg_amount -:amount

-- not in kasa: the values Go computes (UUIDv7 ids, a random UUID as key and invoice like the HTTP
-- bench, the request hash, the rendered payment resource) and the fixture's merchant and payer.
-- One extra round trip per payment, without any table access.
SELECT merchant_id, api_key_hash, account_id, op_id, reservation_id, posting_id, entry1_id, entry2_id, outbox_id,
    k AS idempotency_key, k AS invoice_id, encode(sha256(convert_to(k, 'UTF8')), 'hex') AS request_hash,
    'TRY' AS currency, 'purchase' AS payment_type, '1m0s' AS lease,
    'finalized' AS reservation_status, 'succeeded' AS succeeded_status, '' AS failure_code, 'ch_' || op_id AS provider_reference,
    '{processing,unknown}' AS from_statuses, 'payment' AS posting_kind, 'completed' AS completed_status,
    'payment.succeeded' AS event_type, 'succeeded' AS outcome,
    json_build_object('id', op_id, 'status', 'succeeded', 'amount', to_char(:amount::bigint / 100.0, 'FM999999999990.00'),
        'currency', 'TRY', 'invoice_id', k, 'payment_type', 'purchase', 'account_id', account_id,
        'failure_code', NULL, 'provider_reference', 'ch_' || op_id,
        'created_at', now(),
        'updated_at', now())::text AS body
FROM (SELECT md5('merchant/' || :m::int)::uuid AS merchant_id, sha256(convert_to('sk_bench_' || :m::int, 'UTF8')) AS api_key_hash,
        md5('payer/' || :m::int || '/' || :p::int)::uuid AS account_id, gen_random_uuid()::text AS k,
        uuid7() AS op_id, uuid7() AS reservation_id, uuid7() AS posting_id, uuid7() AS entry1_id, uuid7() AS entry2_id,
        uuid7() AS outbox_id) x
\gset

-- API: the merchant's API key (Server.merchantAuth -> store.MerchantByAPIKey).
-- store.sqlMerchantByKey
SELECT id, name, coalesce(webhook_url, '') FROM merchants WHERE api_key_hash = :api_key_hash
\gset auth_

-- API: store.Begin, the idempotency record and the payment: one pipelined batch, which PostgreSQL
-- runs as one implicit transaction. Its first statement reads the key's record: a repeated key is
-- answered from it; a new key finds none.
\startpipeline
-- store.sqlRecord
SELECT merchant_id, idempotency_key, request_hash, status, operation_id, coalesce(outcome, ''),
response_body, coalesce(locked_until, 'epoch'), workflow_started
FROM idempotency_records WHERE merchant_id = :merchant_id AND idempotency_key = :idempotency_key;
-- store.sqlCustomerAccount
SELECT merchant_id, currency FROM accounts WHERE id = :account_id AND kind = 'customer';
-- store.sqlAcquire
INSERT INTO idempotency_records (merchant_id, idempotency_key, request_hash, status, operation_id, locked_until)
SELECT :merchant_id, :idempotency_key, :request_hash, 'processing', :op_id, now() + :lease::interval
WHERE EXISTS (SELECT 1 FROM accounts WHERE id = :account_id AND kind = 'customer' AND merchant_id = :merchant_id AND currency = :currency)
ON CONFLICT (merchant_id, idempotency_key) DO NOTHING RETURNING operation_id;
-- store.sqlInsertPayment
INSERT INTO payments (id, merchant_id, idempotency_key, account_id, amount_minor, currency, invoice_id, payment_type, status)
SELECT :op_id, :merchant_id, :idempotency_key, :account_id, :amount, :currency, :invoice_id, :payment_type, 'processing'
WHERE EXISTS (SELECT 1 FROM idempotency_records WHERE operation_id = :op_id)
RETURNING created_at, updated_at;
\endpipeline

-- Worker, ReserveFunds: store.Reserve, one statement.
-- store.sqlReserveFunds
WITH started AS (
  UPDATE idempotency_records SET workflow_started = true, locked_until = NULL, updated_at = now()
  WHERE operation_id = :op_id AND NOT workflow_started
), p AS (
  SELECT id, account_id, amount_minor FROM payments WHERE id = :op_id
), existing AS (
  SELECT 1 FROM balance_reservations WHERE operation_id = :op_id
), held AS (
  UPDATE accounts a SET reserved = a.reserved + p.amount_minor, updated_at = now()
  FROM p WHERE a.id = p.account_id AND a.balance - a.reserved >= p.amount_minor AND NOT EXISTS (SELECT 1 FROM existing)
  RETURNING a.id
), inserted AS (
  INSERT INTO balance_reservations (id, operation_id, account_id, amount_minor, status)
  SELECT :reservation_id, p.id, p.account_id, p.amount_minor, 'active' FROM p, held
  RETURNING id
)
SELECT EXISTS (SELECT 1 FROM p), EXISTS (SELECT 1 FROM existing), EXISTS (SELECT 1 FROM inserted);

-- Worker, Finalize (after the charge): store.Finalize, the posting, the payment, the record with
-- its stored answer and the outbox event in one transaction, sent as two pgx batches: what the
-- rest depends on (with BEGIN), then the rest (with COMMIT). pgbench cannot \gset inside a
-- pipeline, so BEGIN and the first batch are four round trips here where kasa needs one.
BEGIN;
-- store.sqlCloseReservation
UPDATE balance_reservations SET status = :reservation_status, updated_at = now()
WHERE operation_id = :op_id AND status = 'active' RETURNING account_id, amount_minor
\gset close_
-- store.sqlSetStatusSettlement
UPDATE payments SET status = :succeeded_status, failure_code = NULLIF(:failure_code, ''),
provider_reference = coalesce(NULLIF(:provider_reference, ''), provider_reference), updated_at = now()
WHERE id = :op_id AND status = ANY(:from_statuses) RETURNING id, merchant_id, idempotency_key, account_id, amount_minor, currency, invoice_id, payment_type,
status, coalesce(failure_code, ''), coalesce(provider_reference, ''), created_at, updated_at, (SELECT a.id FROM accounts a
WHERE a.merchant_id = payments.merchant_id AND a.currency = payments.currency AND a.kind = 'settlement') AS settlement_id
\gset finalized_
\startpipeline
-- store.sqlCapture
UPDATE accounts SET reserved = reserved - :close_amount_minor, balance = balance - :close_amount_minor, updated_at = now() WHERE id = :close_account_id;
-- store.sqlInsertPosting
INSERT INTO ledger_postings (id, kind, reference) VALUES (:posting_id, :posting_kind, :op_id);
-- store.sqlRecordStatus
UPDATE idempotency_records SET status = :completed_status, outcome = coalesce(outcome, :outcome),
response_body = coalesce(response_body, :body), updated_at = now() WHERE operation_id = :op_id;
-- store.sqlInsertOutbox
INSERT INTO outbox (id, aggregate_id, type, payload) VALUES (:outbox_id, :op_id, :event_type, :body);
-- store.sqlInsertEntryPair
INSERT INTO ledger_entries (id, posting_id, account_id, currency, amount_minor)
VALUES (:entry1_id, :posting_id, :close_account_id, :currency, :neg_amount), (:entry2_id, :posting_id, :finalized_settlement_id, :currency, :amount);
-- store.sqlCredit
UPDATE accounts SET balance = balance + :amount, updated_at = now() WHERE id = :finalized_settlement_id;
\endpipeline
COMMIT;
