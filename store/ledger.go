package store

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
)

func insertPosting(ctx context.Context, tx pgx.Tx, id uuid.UUID, kind, reference string) error {
	_, err := tx.Exec(ctx, dbsqlc.InsertPosting, id, kind, reference)
	return err
}

// postPair writes a two-entry posting's entries, amount to credit and its opposite to debit, in
// one statement (the database refuses it at the statement's end if they did not balance), and
// applies them to the accounts' balances, in one batch.
func postPair(ctx context.Context, tx pgx.Tx, postingID uuid.UUID, currency string, credit, debit uuid.UUID, amount int64) error {
	b := &pgx.Batch{}
	b.Queue(dbsqlc.InsertEntryPair, payment.NewID(), postingID, credit, currency, amount, payment.NewID(), debit, -amount)
	b.Queue(dbsqlc.Credit, credit, amount)
	b.Queue(dbsqlc.Credit, debit, -amount)
	return tx.SendBatch(ctx, b).Close()
}

// LedgerEntry is one line of a posting.
type LedgerEntry struct {
	PostingID   uuid.UUID
	Kind        string
	AccountID   uuid.UUID
	Currency    string
	AmountMinor int64
}

// LedgerEntries lists the entries of every posting with the reference (an operation id for a
// payment): what an auditor asks first.
func (s *Store) LedgerEntries(ctx context.Context, reference string) ([]LedgerEntry, error) {
	rows, err := s.q.EntriesFor(ctx, reference)
	if err != nil {
		return nil, translate(err)
	}
	out := make([]LedgerEntry, len(rows))
	for i, r := range rows {
		out[i] = LedgerEntry{PostingID: r.ID, Kind: r.Kind, AccountID: r.AccountID, Currency: r.Currency, AmountMinor: r.AmountMinor}
	}
	return out, nil
}
