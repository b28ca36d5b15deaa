-- mirrors store.sqlMerchantByKey, store.sqlCustomerAccount, store.sqlAcquire, store.sqlRecord
--
-- The whole database work of a replayed request, as POST /v1/payments does it today: the API key
-- lookup, store.Begin's transaction (the payer account check, then the idempotency insert that
-- finds the key taken and is rolled back), and store.Record, whose stored answer is sent back.
-- Same fixture and variables as replay.sql, plus merchant 1's API key hash, payer account, and
-- an unused operation id for the insert that does nothing. TestPGBenchScriptsMirrorStore keeps
-- the statements equal to the Go constants.

\set k random(:key_base, :key_base + :records - 1)

-- store.sqlMerchantByKey
SELECT id, name, coalesce(webhook_url, '') FROM merchants WHERE api_key_hash = :api_key_hash
\gset auth_
BEGIN;
-- store.sqlCustomerAccount
SELECT merchant_id, currency FROM accounts WHERE id = :account_id AND kind = 'customer'
\gset payer_
-- store.sqlAcquire
INSERT INTO idempotency_records (merchant_id, idempotency_key, request_hash, status, operation_id, locked_until)
VALUES (:merchant_id, :k, :request_hash, 'processing', :op_id, now() + :lease::interval)
ON CONFLICT (merchant_id, idempotency_key) DO NOTHING RETURNING operation_id;
ROLLBACK;
-- store.sqlRecord
SELECT merchant_id, idempotency_key, request_hash, status, operation_id, coalesce(response_status, 0),
response_body, coalesce(locked_until, 'epoch'), workflow_started
FROM idempotency_records WHERE merchant_id = :merchant_id AND idempotency_key = :k
\gset record_
