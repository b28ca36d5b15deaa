SELECT concat_ws(' ',
(SELECT count(*) FROM merchants), (SELECT count(*) FROM accounts), (SELECT sum(balance) || '/' || sum(reserved) FROM accounts),
(SELECT count(*) FROM idempotency_records), (SELECT count(*) FROM payments), (SELECT count(*) FROM balance_reservations),
(SELECT count(*) FROM ledger_postings), (SELECT count(*) FROM ledger_entries), (SELECT count(*) FROM outbox),
(SELECT max(updated_at) FROM accounts), (SELECT max(updated_at) FROM idempotency_records));
