package store

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kasa-pay/kasa/payment"
)

// Reconciliation reads: payments by the references of a settlement file, and the payments a
// settlement file's days should have listed.
const (
	sqlPaymentsByID = `SELECT ` + paymentColumns + ` FROM payments WHERE id = ANY($1::uuid[])`
	// Without merchants ($4 NULL) every merchant's payments. A plain range on created_at: an
	// index on payments (created_at) keeps this from scanning the table once it is large.
	sqlPaymentsCreated = `SELECT ` + paymentColumns + ` FROM payments
WHERE created_at >= $1 AND created_at < $2 AND status = ANY($3::text[])
AND ($4::uuid[] IS NULL OR merchant_id = ANY($4::uuid[]))
ORDER BY created_at, id`
)

// PaymentsByID reads the payments among ids that exist, in no particular order.
func (s *Store) PaymentsByID(ctx context.Context, ids []uuid.UUID) ([]payment.Payment, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, sqlPaymentsByID, uuidStrings(ids))
	if err != nil {
		return nil, translate(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (payment.Payment, error) { return scanPayment(r) })
	return out, translate(err)
}

// EachPaymentCreated calls fn for every payment created in [from, to) whose status is one of
// statuses, of one of merchants (of every merchant when merchants is empty), oldest first. It
// streams: fn runs while the query's rows are read, so it must not call the store. An error
// from fn stops the iteration and is returned.
func (s *Store) EachPaymentCreated(ctx context.Context, from, to time.Time, statuses []payment.Status, merchants []uuid.UUID,
	fn func(payment.Payment) error) error {
	sts := make([]string, len(statuses))
	for i, st := range statuses {
		sts[i] = string(st)
	}
	var ms []string
	if len(merchants) > 0 {
		ms = uuidStrings(merchants)
	}
	rows, err := s.pool.Query(ctx, sqlPaymentsCreated, from, to, sts, ms)
	if err != nil {
		return translate(err)
	}
	var p payment.Payment
	_, err = pgx.ForEachRow(rows, []any{&p.ID, &p.MerchantID, &p.IdempotencyKey, &p.AccountID, &p.AmountMinor, &p.Currency,
		&p.InvoiceID, &p.PaymentType, &p.Status, &p.FailureCode, &p.ProviderReference, &p.CreatedAt, &p.UpdatedAt},
		func() error { return fn(p) })
	return translate(err)
}

func uuidStrings(ids []uuid.UUID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}
