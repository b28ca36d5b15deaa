package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
)

// Lists read newest first in (created_at, id) order, a page at a time: each page starts
// strictly after the last row of the one before (keyset pagination), so rows inserted meanwhile
// never shift a page and none is listed twice; the cost of a page does not grow with its number.

// ErrUnknownCursor: the row a page should start after is not one of the listed rows' kind and
// owner (another merchant's, or none at all). Answering it with an empty page would look like
// the end of the list.
var ErrUnknownCursor = errors.New("no such row to start the page after")

// MaxListLimit is the most rows a page may ask for.
const MaxListLimit = 1000

// ListPaymentsInput selects a page of a merchant's payments.
type ListPaymentsInput struct {
	MerchantID    uuid.UUID
	Limit         int            // 1 to MaxListLimit
	StartingAfter *uuid.UUID     // the page after this payment of the merchant's (nil: the newest)
	Status        payment.Status // empty: any
	CreatedGTE    *time.Time     // created at or after (inclusive)
	CreatedLT     *time.Time     // created before (exclusive)
}

// ListPayments reads a page of a merchant's payments, newest first, and whether more follow it.
// A StartingAfter that is not the merchant's payment is ErrUnknownCursor; it is a position, so
// it need not itself match the filters.
func (s *Store) ListPayments(ctx context.Context, in ListPaymentsInput) ([]payment.Payment, bool, error) {
	if in.Limit < 1 || in.Limit > MaxListLimit {
		return nil, false, fmt.Errorf("list payments: limit %d is not from 1 to %d", in.Limit, MaxListLimit)
	}
	top := pageTop(in.CreatedLT)
	if in.StartingAfter != nil {
		var created time.Time
		err := s.pool.QueryRow(ctx, dbsqlc.PaymentCursor, *in.StartingAfter, in.MerchantID).Scan(&created)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, false, ErrUnknownCursor
		}
		if err != nil {
			return nil, false, translate(err)
		}
		top = top.below(created, *in.StartingAfter)
	}
	sql, args := dbsqlc.ListPayments, []any{in.MerchantID, pageBottom(in.CreatedGTE), top.createdAt, top.id, in.Limit + 1}
	switch in.Status {
	case "":
	case payment.StatusFailed:
		sql = dbsqlc.ListFailedPayments
	case payment.StatusProcessing:
		sql, args = dbsqlc.ListOpenPayments, append(args, in.Status)
	case payment.StatusUnknown:
		// A manual payment's capture or void may be unknown long after its record completed:
		// the open records do not name it.
		sql, args = dbsqlc.ListUnknownPayments, append(args, in.Status)
	default:
		sql, args = dbsqlc.ListPaymentsWithStatus, append(args, in.Status)
	}
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, false, translate(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (payment.Payment, error) { return scanPayment(r) })
	if err != nil {
		return nil, false, translate(err)
	}
	page, more := trimPage(out, in.Limit)
	return page, more, nil
}

// keyset is a page's exclusive upper bound in (created_at, id) order.
type keyset struct {
	createdAt pgtype.Timestamptz
	id        uuid.UUID
}

// pageTop is the bound of a first page: everything, or what was created before createdLT.
// (createdLT, the nil id) excludes exactly the rows created at createdLT or later.
func pageTop(createdLT *time.Time) keyset {
	if createdLT == nil {
		return keyset{pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}, uuid.Max}
	}
	return keyset{pgtype.Timestamptz{Time: ceilMicro(*createdLT), Valid: true}, uuid.Nil}
}

// below is the tighter of k and the position of the row (createdAt, id).
func (k keyset) below(createdAt time.Time, id uuid.UUID) keyset {
	if k.createdAt.InfinityModifier == pgtype.Finite &&
		(k.createdAt.Time.Before(createdAt) || k.createdAt.Time.Equal(createdAt) && bytes.Compare(k.id[:], id[:]) <= 0) {
		return k
	}
	return keyset{pgtype.Timestamptz{Time: createdAt, Valid: true}, id}
}

// pageBottom is the inclusive lower bound on created_at: createdGTE, or none.
func pageBottom(createdGTE *time.Time) pgtype.Timestamptz {
	if createdGTE == nil {
		return pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	}
	return pgtype.Timestamptz{Time: ceilMicro(*createdGTE), Valid: true}
}

// ceilMicro rounds t up to the database's microseconds: a bound between two microseconds
// then admits the same rows as it would if the database kept nanoseconds (pgx truncates).
func ceilMicro(t time.Time) time.Time {
	if r := t.Truncate(time.Microsecond); !r.Equal(t) {
		return r.Add(time.Microsecond)
	}
	return t
}

// trimPage cuts rows read with limit+1 to the page and says whether the extra row was there.
// The page is never nil, so that an empty one encodes as [].
func trimPage[T any](rows []T, limit int) ([]T, bool) {
	if rows == nil {
		rows = []T{}
	}
	if len(rows) > limit {
		return rows[:limit], true
	}
	return rows, false
}
