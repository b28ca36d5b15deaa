-- mirrors store.sqlMerchantByKey, store.sqlRecord
--
-- The database work of a replayed request that misses the API's in-memory cache of completed
-- records (api.replay_cache; a hit reads nothing): the API key lookup and store.Record, whose
-- stored answer is sent back (createPayment). Same fixture and variables as replay.sql, plus
-- merchant 1's API key hash. TestPGBenchScriptsMirrorStore keeps the statements equal to the
-- Go constants.

\set k random(:key_base, :key_base + :records - 1)

-- store.sqlMerchantByKey
SELECT id, name, coalesce(webhook_url, '') FROM merchants WHERE api_key_hash = :api_key_hash
\gset auth_
-- store.sqlRecord
SELECT merchant_id, idempotency_key, request_hash, status, operation_id, coalesce(response_status, 0),
response_body, coalesce(locked_until, 'epoch'), workflow_started
FROM idempotency_records WHERE merchant_id = :merchant_id AND idempotency_key = :k
\gset record_
