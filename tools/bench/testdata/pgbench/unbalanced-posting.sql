BEGIN; INSERT INTO ledger_postings (id, kind, reference) VALUES (gen_random_uuid(), 'payment', 'x');
INSERT INTO ledger_entries (id, posting_id, account_id, currency, amount_minor)
SELECT gen_random_uuid(), id, md5('payer/1/1')::uuid, 'TRY', 5 FROM ledger_postings; COMMIT;
