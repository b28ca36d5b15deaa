-- Loads rows :first .. :last - 1 of a preload: finished payments with their idempotency records,
-- so that the replay path can be measured on a large table. Run by psql in one transaction
-- (-1) with the variables merchants (a uuid array literal), prefix, first and last.
--
-- Row i belongs to merchant i % cardinality(merchants) and is paid from that merchant's oldest
-- customer account. Its key is prefix || i, its invoice 'inv-' || key. Every payment failed
-- (declined): a failed payment moves no money, so every invariant of `kasa verify` still holds.
-- Its record is completed with the request hash and the stored answer the API would have written
-- (payment.Request.Hash and payment.Payment.Answer, byte for byte).

CREATE TEMP TABLE preload_payers ON COMMIT DROP AS
SELECT m.n - 1 AS n, m.id AS merchant_id, a.id AS account_id, a.currency
FROM unnest(:'merchants'::uuid[]) WITH ORDINALITY AS m (id, n)
LEFT JOIN LATERAL (
    SELECT id, currency FROM accounts WHERE merchant_id = m.id AND kind = 'customer'
    ORDER BY created_at, id LIMIT 1
) a ON true;

DO $$
DECLARE m uuid;
BEGIN
    SELECT merchant_id INTO m FROM preload_payers WHERE account_id IS NULL LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'preload: merchant % has no customer account', m;
    END IF;
END $$;

CREATE TEMP TABLE preload_rows ON COMMIT DROP AS
SELECT r.*,
    -- A UUIDv7 as payment.NewID mints, a millisecond apart and before now: the rows sit at the
    -- left of the index, and new payments keep appending at its right edge.
    encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
        PLACING substring(int8send(floor(extract(epoch FROM now()) * 1000)::bigint - (:last - r.i)) FROM 3)
        FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid AS id,
    to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS at
FROM (
    SELECT i, p.merchant_id, p.account_id, p.currency,
        :'prefix' || i AS key, 'inv-' || :'prefix' || i AS invoice, 'purchase' AS payment_type, -- payment.DefaultPaymentType
        100 + i::bigint * 7919 % 1000000 AS amount,
        -- The currencies a bench uses: ISO 4217 minor units (payment.Exponent).
        CASE p.currency WHEN 'JPY' THEN 0 WHEN 'KWD' THEN 3 ELSE 2 END AS exponent
    FROM generate_series(:first, :last - 1) AS i
    JOIN preload_payers p ON p.n = i % cardinality(:'merchants'::uuid[])
) r;

INSERT INTO idempotency_records (merchant_id, idempotency_key, request_hash, status, operation_id,
    outcome, response_body, locked_until, workflow_started, created_at, updated_at)
SELECT merchant_id, key,
    encode(sha256(
        int8send(octet_length(invoice)) || convert_to(invoice, 'UTF8') ||
        int8send(octet_length(currency)) || convert_to(currency, 'UTF8') ||
        int8send(36) || convert_to(account_id::text, 'UTF8') ||
        int8send(octet_length(payment_type)) || convert_to(payment_type, 'UTF8') ||
        int8send(amount)), 'hex'),
    'completed', id,
    'failed', -- the stored answer of a failed payment
    convert_to('{"id":"' || id || '","status":"failed","amount":"' || round(amount / power(10::numeric, exponent), exponent) ||
        '","amount_refunded":"' || round(0::numeric, exponent) || '","currency":"' || currency || '","invoice_id":"' || invoice || '","payment_type":"' || payment_type || '","account_id":"' ||
        account_id || '","failure_code":"declined","provider_reference":null,"created_at":"' || at ||
        '","updated_at":"' || at || '"}' || E'\n', 'UTF8'),
    NULL, true, now(), now()
FROM preload_rows;

INSERT INTO payments (id, merchant_id, idempotency_key, account_id, amount_minor, currency, invoice_id,
    payment_type, status, failure_code, created_at, updated_at)
SELECT id, merchant_id, key, account_id, amount, currency, invoice, payment_type, 'failed', 'declined', now(), now()
FROM preload_rows;
