-- The database work of a replayed request that misses the API's in-memory cache of completed
-- records (api.replay_cache; a hit reads nothing): the API key lookup and store.Begin, whose
-- pipelined batch first reads the key's record (its stored answer is sent back) and then finds
-- nothing to write: the key exists, and the payment insert is guarded by a record of the fresh
-- operation id. Same fixture and variables as replay.sql, plus merchant 1's API key hash.
-- The "-- query:" lines become store/queries' statements (see payment.sql).

\set k random(:key_base, :key_base + :records - 1)

-- not in kasa: the values Go computes (a fresh operation id, the request hash) and the payer.
-- One extra round trip per replay, without any table access.
SELECT uuid7() AS op_id, md5('payer/1/1')::uuid AS account_id,
    encode(sha256(convert_to(:k::text, 'UTF8')), 'hex') AS request_hash, 'TRY' AS currency, '1m0s' AS lease,
    'purchase' AS payment_type, 100 AS amount, :k AS invoice_id
\gset

-- query: MerchantByAPIKey api_key_hash
\gset auth_
\startpipeline
-- query: GetRecord merchant_id k
-- query: CustomerAccount account_id
-- query: AcquireKey merchant_id k request_hash op_id lease account_id currency
-- query: InsertPayment op_id merchant_id k account_id amount currency invoice_id payment_type
\endpipeline
