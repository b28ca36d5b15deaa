SELECT (SELECT count(*) FROM merchants), (SELECT count(*) FROM accounts), (SELECT count(*) FROM idempotency_records);
