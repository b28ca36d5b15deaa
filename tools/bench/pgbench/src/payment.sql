-- One pgbench transaction is the whole database work of one new payment that succeeds, statement
-- for statement and transaction for transaction, in the order kasa runs it: the API
-- (authenticate, store.Begin, whose batch first reads the key's record and finds none) and the
-- worker's activities (store.Reserve, which also marks the workflow started; store.Finalize,
-- which also stores the answer, handed in process to the API as its response).
-- Left out: store.BeginChargeAttempt (the Charge activity writes it only for a provider without
-- idempotency; the default provider capability is idempotent), the API's 250 ms polls of the
-- record while it waits (none when the workflow finishes first) and the relay's later work on
-- the outbox row.
--
-- Each "-- query: Name var..." line becomes the statement of store/queries/*.sql that kasa runs,
-- with the variables for its parameters $1, $2, ... (go run bench/pgbench/gen.go, run by
-- make generate). Run with -M prepared (pgx
-- prepares and caches every statement too), -D merchants=N -D payers=P, and the fixture schema
-- (setup.sql) as the only schema on the search_path. pgbench reads :name as a variable even inside
-- a string literal: keep colons out of literals.

\set m random(1, :merchants)
\set p random(1, :payers)
\set amount random(100, 10000)
\set neg_amount -:amount
-- the settlement account's shard the payment credits (kasa derives it from the payment's id)
\set shard random(0, 15)

-- not in kasa: the values Go computes (UUIDv7 ids, a random UUID as key and invoice like the HTTP
-- bench, the request hash, the rendered payment resource) and the fixture's merchant and payer.
-- One extra round trip per payment, without any table access.
SELECT merchant_id, api_key_hash, account_id, op_id, reservation_id, posting_id, entry1_id, entry2_id, outbox_id, false AS queue,
    k AS idempotency_key, k AS invoice_id, encode(sha256(convert_to(k, 'UTF8')), 'hex') AS request_hash,
    'TRY' AS currency, 'purchase' AS payment_type, '1m0s' AS lease, false AS capture_manual, '0s' AS capture_window,
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
-- query: MerchantByAPIKey api_key_hash
\gset auth_

-- API: store.Begin, the idempotency record and the payment: one pipelined batch, which PostgreSQL
-- runs as one implicit transaction. Its first statement reads the key's record: a repeated key is
-- answered from it; a new key finds none.
\startpipeline
-- query: GetRecord merchant_id idempotency_key
-- query: AcquireKey merchant_id idempotency_key request_hash op_id lease account_id currency queue
-- query: InsertPayment op_id merchant_id idempotency_key account_id amount currency invoice_id payment_type capture_manual capture_window
\endpipeline

-- Worker, ReserveFunds: store.Reserve, one statement.
-- query: ReserveFunds op_id reservation_id op_id

-- Worker, Finalize (after the charge): store.Finalize, the posting, the payment, the record with
-- its stored answer and the outbox event in one transaction, sent as two pgx batches: what the
-- rest depends on (with BEGIN), then the rest (with COMMIT). pgbench cannot \gset inside a
-- pipeline, so BEGIN and the first batch are four round trips here where kasa needs one.
BEGIN;
-- query: CloseReservation op_id reservation_status
\gset close_
-- query: SetPaymentStatusSettlement op_id succeeded_status failure_code provider_reference from_statuses
\gset finalized_
\startpipeline
-- query: CompleteWithEvent op_id completed_status outcome body outbox_id event_type body
-- query: PostPayment close_account_id close_amount_minor posting_id op_id entry1_id currency entry2_id finalized_settlement_id shard
\endpipeline
COMMIT;
