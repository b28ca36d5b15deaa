-- A posting must balance per currency once the statement that writes its entries ends. It was
-- checked at commit, once per entry (a payment's posting summed twice); now once per statement,
-- over the postings it touched. Every writer inserts a posting's entries in one statement, and an
-- entry added later to a balanced posting unbalances it, so that is refused as well.

-- +goose Up
DROP TRIGGER ledger_entries_balanced ON ledger_entries;

-- +goose StatementBegin
CREATE FUNCTION ledger_postings_balanced() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    unbalanced uuid;
BEGIN
    -- One posting at a time, by the posting index: new_entries has no statistics to plan a join by.
    SELECT p.posting_id INTO unbalanced
    FROM (SELECT DISTINCT posting_id FROM new_entries) p
    WHERE EXISTS (SELECT 1 FROM ledger_entries e WHERE e.posting_id = p.posting_id
                  GROUP BY e.currency HAVING sum(e.amount_minor) <> 0)
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'ledger posting % does not balance', unbalanced
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ledger_balanced';
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER ledger_entries_balanced AFTER INSERT ON ledger_entries
    REFERENCING NEW TABLE AS new_entries FOR EACH STATEMENT EXECUTE FUNCTION ledger_postings_balanced();

-- +goose Down
DROP TRIGGER ledger_entries_balanced ON ledger_entries;
DROP FUNCTION ledger_postings_balanced;
CREATE CONSTRAINT TRIGGER ledger_entries_balanced AFTER INSERT ON ledger_entries
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ledger_posting_balanced();
