package store

import (
	"reflect"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
)

// A payment or a refund is read whole (SELECT * or RETURNING * in store/queries), so its columns
// are named once, in the migrations: sqlc spells them out in the table's order and generates the
// row's struct in that order, and one converter each turns that struct into the domain's.

// columns lists pointers to every field of the sqlc row struct *row, in order: the destinations
// of its SELECT *.
func columns[T any](row *T) []any {
	v := reflect.ValueOf(row).Elem()
	out := make([]any, v.NumField())
	for i := range out {
		out[i] = v.Field(i).Addr().Interface()
	}
	return out
}

// scanPayment scans a whole payment row, then into extra the columns after it.
func scanPayment(row pgx.Row, extra ...any) (payment.Payment, error) {
	var p dbsqlc.Payment
	if err := row.Scan(append(columns(&p), extra...)...); err != nil {
		return payment.Payment{}, translate(err)
	}
	return paymentOf(p), nil
}

func scanRefund(row pgx.Row) (payment.Refund, error) {
	var r dbsqlc.Refund
	if err := row.Scan(columns(&r)...); err != nil {
		return payment.Refund{}, translate(err)
	}
	return refundOf(r), nil
}

func paymentOf(p dbsqlc.Payment) payment.Payment {
	return payment.Payment{
		ID: p.ID, MerchantID: p.MerchantID, IdempotencyKey: p.IdempotencyKey, AccountID: p.AccountID,
		AmountMinor: p.AmountMinor, AmountRefunded: p.RefundedMinor, Currency: p.Currency,
		InvoiceID: p.InvoiceID, PaymentType: p.PaymentType, Status: payment.Status(p.Status),
		FailureCode: orEmpty(p.FailureCode), ProviderReference: orEmpty(p.ProviderReference),
		CreatedAt: p.CreatedAt, UpdatedAt: p.UpdatedAt,
		CaptureManual: p.CaptureManual, CaptureBefore: orZero(p.CaptureBefore), CapturedMinor: p.CapturedMinor,
		StuckReason: orEmpty(p.StuckReason),
	}
}

func orZero(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

func refundOf(r dbsqlc.Refund) payment.Refund {
	return payment.Refund{
		ID: r.ID, PaymentID: r.PaymentID, MerchantID: r.MerchantID, AccountID: r.AccountID,
		IdempotencyKey: r.IdempotencyKey, AmountMinor: r.AmountMinor, Currency: r.Currency,
		Reason: orEmpty(r.Reason), Status: payment.Status(r.Status),
		FailureCode: orEmpty(r.FailureCode), ProviderReference: orEmpty(r.ProviderReference),
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, StuckReason: orEmpty(r.StuckReason),
	}
}

func orEmpty(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
