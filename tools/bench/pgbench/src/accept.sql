-- One pgbench transaction is what the API commits to accept a new payment in a burst (docs/
-- operations.md, "Payday"): authenticate, then store.Begin's batch, whose record is queued for the
-- backlog's drainer. The payday run divides the API's accepted payments per second by this.
--
-- Each "-- query: Name var..." line becomes the statement of store/queries/*.sql that kasa runs
-- (go run tools/bench/pgbench/gen.go, run by make generate); see payment.sql for how to run it.

\set m random(1, :merchants)
\set p random(1, :payers)
\set amount random(100, 10000)
\set neg_amount -:amount
-- the settlement account's shard the payment credits (kasa derives it from the payment's id)
\set shard random(0, 15)

-- not in kasa: the values Go computes (UUIDv7 ids, a random UUID as key and invoice like the HTTP
-- bench, the request hash, the rendered payment resource) and the fixture's merchant and payer.
-- One extra round trip per payment, without any table access.
SELECT merchant_id, api_key_hash, account_id, op_id, reservation_id, posting_id, entry1_id, entry2_id, outbox_id, true AS queue,
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

-- API: store.Begin, queued: one pipelined batch, one implicit transaction.
\startpipeline
-- query: GetRecord merchant_id idempotency_key
-- query: AcquireKey merchant_id idempotency_key request_hash op_id lease account_id currency queue
-- query: InsertPayment op_id merchant_id idempotency_key account_id amount currency invoice_id payment_type capture_manual capture_window
\endpipeline
