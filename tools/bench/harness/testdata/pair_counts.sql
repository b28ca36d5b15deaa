-- The payments and idempotency records of the merchants in :'merchants' (a uuid[] literal).
SELECT (SELECT count(*) FROM payments WHERE merchant_id = ANY(:'merchants'::uuid[])),
       (SELECT count(*) FROM idempotency_records WHERE merchant_id = ANY(:'merchants'::uuid[]));
