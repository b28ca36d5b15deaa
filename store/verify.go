package store

import (
	"context"
	"fmt"

	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
)

// invariants are queries (store/queries/verify.sql) that return one readable line per
// violation; none may return a row.
var invariants = []struct{ name, sql string }{
	{"ledger postings balance per currency", dbsqlc.UnbalancedPostings},
	{"the whole ledger sums to zero per currency", dbsqlc.UnbalancedLedger},
	{"every entry's currency is its account's", dbsqlc.EntryCurrencyMismatch},
	{"balance equals the ledger sum", dbsqlc.BalanceNotLedgerSum},
	{"reserved equals active reservations", dbsqlc.ReservedNotReservations},
	{"no balance is negative", dbsqlc.NegativeBalance},
	{"settlement balances are in their shards, none negative", dbsqlc.ShardViolations},
	{"every succeeded payment has exactly one posting", dbsqlc.SucceededPostingCount},
	{"no other payment has a posting", dbsqlc.UnexpectedPosting},
	{"a succeeded payment moved its amount from its payer to its merchant", dbsqlc.PaymentPostedAccountsMismatch},
	{"a deposit posting credits its deposit's amount to its account from outside", dbsqlc.DepositPostingMismatch},
	{"an open payment holds its whole amount on its payer's account", dbsqlc.OpenPaymentHoldMismatch},
	{"an open payment keeps its idempotency record", dbsqlc.OpenOperationWithoutRecord},
	{"reservations match payment outcomes", dbsqlc.ReservationOutcomeMismatch},
	{"an authorization holds its whole amount until captured or canceled", dbsqlc.AuthorizationHoldMismatch},
	{"an authorization is open exactly until its capture or cancel", dbsqlc.OpenAuthorizationMismatch},
	{"idempotency records follow their payments", dbsqlc.RecordPaymentMismatch},
	{"every succeeded refund has exactly one refund posting", dbsqlc.SucceededRefundPostingCount},
	{"no other refund has a refund posting", dbsqlc.UnexpectedRefundPosting},
	{"a succeeded refund moved its amount from settlement to payer", dbsqlc.RefundPostedAmountMismatch},
	{"payments' refunded and held amounts are their refunds' sums", dbsqlc.PaymentRefundTotals},
	{"a refund pays back its succeeded payment's payer", dbsqlc.RefundPaymentMismatch},
	{"a payment refunds no more than it took", dbsqlc.RefundedAboveTaken},
	{"reservations match refund outcomes", dbsqlc.RefundReservationMismatch},
	{"every reservation is a payment's or a refund's", dbsqlc.OrphanReservation},
	{"idempotency records follow their refunds", dbsqlc.RecordRefundMismatch},
}

// Verify checks the money invariants against the database and returns one line per violation.
func (s *Store) Verify(ctx context.Context) ([]string, error) {
	var problems []string
	for _, inv := range invariants {
		rows, err := s.pool.Query(ctx, inv.sql)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", inv.name, translate(err))
		}
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				rows.Close()
				return nil, translate(err)
			}
			problems = append(problems, inv.name+": "+line)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, translate(err)
		}
	}
	return problems, nil
}
