package store

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
)

type entry struct {
	account uuid.UUID
	amount  int64 // positive: kasa owes the account more
}

func insertPosting(ctx context.Context, tx pgx.Tx, id uuid.UUID, kind, reference string) error {
	_, err := tx.Exec(ctx, dbsqlc.InsertPosting, id, kind, reference)
	return err
}

// postEntries writes a posting's entries and applies them to the accounts' balances in one batch.
// The database rejects the commit if they do not sum to zero.
func postEntries(ctx context.Context, tx pgx.Tx, postingID uuid.UUID, currency string, entries []entry) error {
	b := &pgx.Batch{}
	for _, e := range entries {
		b.Queue(dbsqlc.InsertEntry, payment.NewID(), postingID, e.account, currency, e.amount)
		b.Queue(dbsqlc.Credit, e.account, e.amount)
	}
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
