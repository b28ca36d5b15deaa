UPDATE accounts SET reserved = balance + 1 WHERE id = md5('payer/1/1')::uuid;
