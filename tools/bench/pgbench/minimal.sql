-- The minimal sketch M: the seed's design of one payment in three commits, on the fewest tables
-- (minimal-setup.sql), for comparing kasa's own statements (payment.sql) with the floor.
--   1. the idempotency record, inserted (processing);
--   2. the payer's funds reserved by a conditional update;
--   3. one transaction: the payer's balance captured, the merchant's balance credited, two ledger
--      entries, an outbox row and the record completed with its answer.
-- Run with -M prepared, -D merchants=N -D payers=P and the fixture schema as the search_path.
-- pgbench reads :name as a variable even inside a string literal: keep colons out of literals.

\set m random(1, :merchants)
\set p random(1, :payers)
\set amount random(100, 10000)
\set neg_amount -:amount

-- not in the sketch's cost: the values a program computes (ids, key, hash, answer), as in payment.sql.
SELECT merchant_id, account_id, settlement_id, op_id, entry1_id, entry2_id, outbox_id, k AS idempotency_key,
    encode(sha256(convert_to(k, 'UTF8')), 'hex') AS request_hash,
    json_build_object('id', op_id, 'status', 'succeeded', 'amount', to_char(:amount::bigint / 100.0, 'FM999999999990.00'),
        'currency', 'TRY', 'invoice_id', k, 'payment_type', 'purchase', 'account_id', account_id,
        'failure_code', NULL, 'provider_reference', 'ch_' || op_id,
        'created_at', now(), 'updated_at', now())::text AS body
FROM (SELECT md5('merchant/' || :m::int)::uuid AS merchant_id, md5('payer/' || :m::int || '/' || :p::int)::uuid AS account_id,
        md5('settlement/' || :m::int)::uuid AS settlement_id, gen_random_uuid()::text AS k,
        uuid7() AS op_id, uuid7() AS entry1_id, uuid7() AS entry2_id, uuid7() AS outbox_id) x
\gset

-- 1. the idempotency record
INSERT INTO idempotency_records (merchant_id, idempotency_key, request_hash, status, operation_id)
VALUES (:merchant_id, :idempotency_key, :request_hash, 'processing', :op_id)
ON CONFLICT DO NOTHING;

-- 2. the reservation
UPDATE accounts SET reserved = reserved + :amount WHERE id = :account_id AND balance - reserved >= :amount;

-- 3. the capture, in one transaction
BEGIN;
UPDATE accounts SET reserved = reserved - :amount, balance = balance - :amount WHERE id = :account_id;
UPDATE accounts SET balance = balance + :amount WHERE id = :settlement_id;
INSERT INTO ledger_entries (id, operation_id, account_id, amount_minor)
VALUES (:entry1_id, :op_id, :account_id, :neg_amount), (:entry2_id, :op_id, :settlement_id, :amount);
INSERT INTO outbox (id, aggregate_id, type, payload) VALUES (:outbox_id, :op_id, 'payment.succeeded', :body);
UPDATE idempotency_records SET status = 'completed', response_body = convert_to(:body, 'UTF8')
WHERE merchant_id = :merchant_id AND idempotency_key = :idempotency_key;
COMMIT;
