package store

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
)

// Reconciliation reads: payments and refunds by the references of a settlement file, and the
// payments and refunds a settlement file's days should have listed.

// PaymentsByID reads the payments among ids that exist, in no particular order.
func (s *Store) PaymentsByID(ctx context.Context, ids []uuid.UUID) ([]payment.Payment, error) {
	return byID(ctx, s, dbsqlc.PaymentsByID, ids, func(r pgx.CollectableRow) (payment.Payment, error) { return scanPayment(r) })
}

// SettlementListings records that a settlement file lists each of refs on the day beside it
// (unless record is false: a dry run), then returns every day an import listed each of refs on,
// this one's included. kind is "charge" (payments) or "refund". Recording before reading
// means that of two imports listing one reference on two days at once, the later reader sees both.
func (s *Store) SettlementListings(ctx context.Context, kind string, refs []uuid.UUID, days []time.Time, record bool) (map[uuid.UUID][]time.Time, error) {
	if record {
		dates := make([]pgtype.Date, len(days))
		for i, d := range days {
			dates[i] = pgtype.Date{Time: d, Valid: true}
		}
		if err := s.q.RecordSettlementListings(ctx, dbsqlc.RecordSettlementListingsParams{Kind: kind, Refs: refs, Days: dates}); err != nil {
			return nil, translate(err)
		}
	}
	rows, err := s.q.SettlementListings(ctx, dbsqlc.SettlementListingsParams{Kind: kind, Refs: refs})
	if err != nil {
		return nil, translate(err)
	}
	out := make(map[uuid.UUID][]time.Time, len(rows))
	for _, r := range rows {
		out[r.Reference] = append(out[r.Reference], r.Day.Time)
	}
	return out, nil
}

// RecordSettlementCompletions records that an import proved days complete (a trailer) for kind's
// operations ("charge" or "refund") of merchants (uuid.Nil: every merchant), each day up to the
// asOf beside it. An import records them after its listings and before it reads
// SettlementCompletions: another import that sees these days complete sees what this one listed.
func (s *Store) RecordSettlementCompletions(ctx context.Context, kind string, merchants []uuid.UUID, days, asOf []time.Time) error {
	var ds []pgtype.Date
	var ms []uuid.UUID
	var as []time.Time
	for _, m := range merchants {
		for i, d := range days {
			ds, ms, as = append(ds, pgtype.Date{Time: d, Valid: true}), append(ms, m), append(as, asOf[i])
		}
	}
	if len(ds) == 0 {
		return nil
	}
	return translate(s.q.RecordSettlementCompletions(ctx, dbsqlc.RecordSettlementCompletionsParams{Kind: kind, Days: ds, Merchants: ms, AsOf: as}))
}

// SettlementCompletions returns, for each of days that an import proved complete for kind's
// operations of one of merchants or of every merchant, how far: the latest as_of by merchant
// (uuid.Nil: a scope of every merchant).
func (s *Store) SettlementCompletions(ctx context.Context, kind string, days []time.Time, merchants []uuid.UUID) (map[time.Time]map[uuid.UUID]time.Time, error) {
	dates := make([]pgtype.Date, len(days))
	for i, d := range days {
		dates[i] = pgtype.Date{Time: d, Valid: true}
	}
	rows, err := s.q.SettlementCompletions(ctx, dbsqlc.SettlementCompletionsParams{Kind: kind, Days: dates, Merchants: merchants})
	if err != nil {
		return nil, translate(err)
	}
	out := map[time.Time]map[uuid.UUID]time.Time{}
	for _, r := range rows {
		m := uuid.Nil
		if r.MerchantID != nil {
			m = *r.MerchantID
		}
		if out[r.Day.Time] == nil {
			out[r.Day.Time] = map[uuid.UUID]time.Time{}
		}
		out[r.Day.Time][m] = r.AsOf
	}
	return out, nil
}

// EachPaymentCreated calls fn for every payment created in [from, to) whose status is one of
// statuses, of one of merchants (of every merchant when merchants is empty), oldest first, with
// the time its outcome was decided: when it left processing (became unknown, or succeeded),
// which neither a later refund nor the settlement of an unknown one moves, as they move
// updated_at. It streams: fn runs while the query's rows are read, so it must not call the
// store. An error from fn stops the iteration and is returned.
func (s *Store) EachPaymentCreated(ctx context.Context, from, to time.Time, statuses []payment.Status, merchants []uuid.UUID,
	fn func(p payment.Payment, decided time.Time) error) error {
	rows, err := s.pool.Query(ctx, dbsqlc.PaymentsCreated, createdArgs(from, to, statuses, merchants)...)
	if err != nil {
		return translate(err)
	}
	var p dbsqlc.Payment
	var decided time.Time
	_, err = pgx.ForEachRow(rows, append(columns(&p), &decided), func() error { return fn(paymentOf(p), decided) })
	return translate(err)
}

// EachCaptureDecided calls fn for every manual payment created before from, with one of statuses,
// whose capture succeeded, or whose capture or void became unknown (settled since or not), in
// [from, to), of one of merchants (all when empty), with the time that happened and the time
// its capture or void may first have been sent. It streams as EachPaymentCreated does.
func (s *Store) EachCaptureDecided(ctx context.Context, from, to time.Time, statuses []payment.Status, merchants []uuid.UUID,
	fn func(p payment.Payment, decided, sentFrom time.Time) error) error {
	rows, err := s.pool.Query(ctx, dbsqlc.CapturesDecided, createdArgs(from, to, statuses, merchants)...)
	if err != nil {
		return translate(err)
	}
	var p dbsqlc.Payment
	var decided, sentFrom time.Time
	_, err = pgx.ForEachRow(rows, append(columns(&p), &decided, &sentFrom), func() error { return fn(paymentOf(p), decided, sentFrom) })
	return translate(err)
}

// RefundsByID reads the refunds among ids that exist, in no particular order.
func (s *Store) RefundsByID(ctx context.Context, ids []uuid.UUID) ([]payment.Refund, error) {
	return byID(ctx, s, dbsqlc.RefundsByID, ids, func(r pgx.CollectableRow) (payment.Refund, error) { return scanRefund(r) })
}

// EachRefundCreated is EachPaymentCreated for refunds: fn gets every refund created in [from, to)
// whose status is one of statuses, of one of merchants (all when empty), oldest first, with the
// time its outcome was decided (it became unknown, or succeeded), while the rows are read (so fn
// must not call the store).
func (s *Store) EachRefundCreated(ctx context.Context, from, to time.Time, statuses []payment.Status, merchants []uuid.UUID,
	fn func(r payment.Refund, decided time.Time) error) error {
	rows, err := s.pool.Query(ctx, dbsqlc.RefundsCreated, createdArgs(from, to, statuses, merchants)...)
	if err != nil {
		return translate(err)
	}
	var r dbsqlc.Refund
	var decided time.Time
	_, err = pgx.ForEachRow(rows, append(columns(&r), &decided), func() error { return fn(refundOf(r), decided) })
	return translate(err)
}

// byID reads the rows of query (one taking the ids as text) among ids that exist.
func byID[T any](ctx context.Context, s *Store, query string, ids []uuid.UUID, scan pgx.RowToFunc[T]) ([]T, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, query, uuidStrings(ids))
	if err != nil {
		return nil, translate(err)
	}
	out, err := pgx.CollectRows(rows, scan)
	return out, translate(err)
}

// createdArgs are the parameters of PaymentsCreated, RefundsCreated and CapturesDecided: the
// window, the statuses, the merchants (none: all) and the UUIDv7 id range that bounds the window
// on the primary key.
func createdArgs(from, to time.Time, statuses []payment.Status, merchants []uuid.UUID) []any {
	sts := make([]string, len(statuses))
	for i, st := range statuses {
		sts[i] = string(st)
	}
	var ms []string
	if len(merchants) > 0 {
		ms = uuidStrings(merchants)
	}
	return []any{from, to, sts, ms, minUUIDv7(from.Add(-idClockSkew)), minUUIDv7(to.Add(idClockSkew))}
}

func uuidStrings(ids []uuid.UUID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}

// idClockSkew is how far the clock that minted a payment's id may be from the database's
// clock that set its created_at.
const idClockSkew = time.Hour

// minUUIDv7 is the smallest UUIDv7 of millisecond t: every id minted at t or later sorts at or
// above it (PostgreSQL compares uuids bytewise, and a UUIDv7 starts with its big-endian time).
func minUUIDv7(t time.Time) uuid.UUID {
	var u uuid.UUID
	ms := uint64(t.UnixMilli())
	for i := 0; i < 6; i++ {
		u[i] = byte(ms >> (40 - 8*i))
	}
	u[6] = 0x70 // version 7
	u[8] = 0x80 // RFC 4122 variant
	return u
}
