INSERT INTO payments (id, merchant_id, idempotency_key, account_id, amount_minor, currency, invoice_id, payment_type, status)
VALUES (gen_random_uuid(), md5('merchant/1')::uuid, 'no-account', gen_random_uuid(), 1, 'TRY', 'i', 'purchase', 'processing');
