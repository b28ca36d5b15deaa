-- mirrors store.sqlMerchantByKey, store.sqlRecord, store.sqlCustomerAccount, store.sqlAcquire,
-- mirrors store.sqlInsertPayment
--
-- The database work of a replayed request that misses the API's in-memory cache of completed
-- records (api.replay_cache; a hit reads nothing): the API key lookup and store.Begin, whose
-- pipelined batch first reads the key's record (its stored answer is sent back) and then finds
-- nothing to write: the key exists, and the payment insert is guarded by a record of the fresh
-- operation id. Same fixture and variables as replay.sql, plus merchant 1's API key hash.
-- TestPGBenchScriptsMirrorStore keeps the statements equal to the Go constants.

\set k random(:key_base, :key_base + :records - 1)

-- not in kasa: the values Go computes (a fresh operation id, the request hash) and the payer.
-- One extra round trip per replay, without any table access.
SELECT uuid7() AS op_id, md5('payer/1/1')::uuid AS account_id,
    encode(sha256(convert_to(:k::text, 'UTF8')), 'hex') AS request_hash, 'TRY' AS currency, '1m0s' AS lease,
    'purchase' AS payment_type, 100 AS amount, :k AS invoice_id
\gset

-- store.sqlMerchantByKey
SELECT id, name, coalesce(webhook_url, '') FROM merchants WHERE api_key_hash = :api_key_hash
\gset auth_
\startpipeline
-- store.sqlRecord
SELECT merchant_id, idempotency_key, request_hash, status, operation_id, coalesce(outcome, ''),
response_body, coalesce(locked_until, 'epoch'), workflow_started
FROM idempotency_records WHERE merchant_id = :merchant_id AND idempotency_key = :k;
-- store.sqlCustomerAccount
SELECT merchant_id, currency FROM accounts WHERE id = :account_id AND kind = 'customer';
-- store.sqlAcquire
INSERT INTO idempotency_records (merchant_id, idempotency_key, request_hash, status, operation_id, locked_until)
SELECT :merchant_id, :k, :request_hash, 'processing', :op_id, now() + :lease::interval
WHERE EXISTS (SELECT 1 FROM accounts WHERE id = :account_id AND kind = 'customer' AND merchant_id = :merchant_id AND currency = :currency)
ON CONFLICT (merchant_id, idempotency_key) DO NOTHING RETURNING operation_id;
-- store.sqlInsertPayment
INSERT INTO payments (id, merchant_id, idempotency_key, account_id, amount_minor, currency, invoice_id, payment_type, status)
SELECT :op_id, :merchant_id, :k, :account_id, :amount, :currency, :invoice_id, :payment_type, 'processing'
WHERE EXISTS (SELECT 1 FROM idempotency_records WHERE operation_id = :op_id)
RETURNING created_at, updated_at;
\endpipeline
