package store

import (
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

// Webhook deliveries and their attempt log (store/queries/deliveries.sql).

// ClaimedDelivery is a delivery a sender holds until its lease runs out.
type ClaimedDelivery struct {
	ID          uuid.UUID // the event id
	MerchantID  uuid.UUID
	AggregateID uuid.UUID
	EventType   string
	URL         string
	Body        []byte
	Secret      string // the merchant's webhook secret, decrypted
	// PreviousSecret is the secret it replaced, while both sign (after a rotation); else empty.
	PreviousSecret string
	Attempt        int // this attempt's number, 1-based; the fencing token of its result
}

// ClaimDeliveries leases up to limit due deliveries for lease and counts their attempt. A
// merchant never gets more than perMerchant deliveries in flight (across senders, best effort
// under races), and an aggregate's deliveries go one at a time in event order.
//
// Each statement looks at a bounded number of due rows in order (claimCandidates); when they
// were all looked at and did not fill limit (their merchants at their limit), the next statement
// goes on after the last of them, until limit is filled or the due rows end. The rows claimed
// before are then in flight, so the limit per merchant holds across the statements.
func (s *Store) ClaimDeliveries(ctx context.Context, limit, perMerchant int, lease time.Duration) ([]ClaimedDelivery, error) {
	var ds []ClaimedDelivery
	afterAt, afterID := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}, uuid.Nil
	for range maxClaimStatements {
		if len(ds) >= limit {
			break
		}
		candidates := claimCandidates(limit - len(ds))
		got, scanned, lastAt, lastID, err := s.claimDeliveries(ctx, limit-len(ds), perMerchant, lease, candidates, afterAt, afterID)
		ds = append(ds, got...)
		if err != nil || scanned < int64(candidates) {
			return ds, err
		}
		afterAt, afterID = lastAt, lastID
	}
	return ds, nil
}

// maxClaimStatements bounds how far past merchants at their limit one claim walks: rows further
// back wait until those merchants' own webhooks have gone out.
const maxClaimStatements = 8

// claimCandidates is how many due rows one claim statement looks at for limit rows: enough that
// a few merchants at their limit or payments waiting for an earlier event do not leave it short.
func claimCandidates(limit int) int { return max(4*limit, 64) }

func (s *Store) claimDeliveries(ctx context.Context, limit, perMerchant int, lease time.Duration, candidates int,
	afterAt pgtype.Timestamptz, afterID uuid.UUID) (ds []ClaimedDelivery, scanned int64, lastAt pgtype.Timestamptz, lastID uuid.UUID, err error) {
	// Planned at each call (an unnamed statement), never from a plan cached while the table was
	// small: the walk's probes would then be scans of the whole table.
	rows, err := s.pool.Query(ctx, queryClaimDeliveries, pgx.QueryExecModeCacheDescribe,
		limit, perMerchant, lease.Seconds(), candidates, afterAt, afterID)
	if err != nil {
		return nil, 0, lastAt, lastID, translate(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, merchantID, aggregateID *uuid.UUID
		var eventType, url *string
		var body, sealed, prevSealed []byte
		var attempt *int
		var n *int64
		var at pgtype.Timestamptz
		var last *uuid.UUID
		if err := rows.Scan(&id, &merchantID, &aggregateID, &eventType, &url, &body, &attempt, &sealed, &prevSealed,
			&n, &at, &last); err != nil {
			return nil, 0, lastAt, lastID, translate(err)
		}
		if id == nil { // the last row: how many due rows the statement looked at, and the last one
			scanned, lastAt = *n, at
			if last != nil {
				lastID = *last
			}
			continue
		}
		c := ClaimedDelivery{ID: *id, MerchantID: *merchantID, AggregateID: *aggregateID, EventType: *eventType, URL: *url,
			Body: body, Attempt: *attempt}
		if c.Secret, err = s.open(sealed); err != nil {
			return nil, 0, lastAt, lastID, fmt.Errorf("%w: merchant %s: %v", ErrInconsistent, c.MerchantID, err)
		}
		if prevSealed != nil {
			if c.PreviousSecret, err = s.open(prevSealed); err != nil {
				return nil, 0, lastAt, lastID, fmt.Errorf("%w: merchant %s: previous secret: %v", ErrInconsistent, c.MerchantID, err)
			}
		}
		ds = append(ds, c)
	}
	return ds, scanned, lastAt, lastID, translate(rows.Err())
}

// DeliveryStatus is a delivery's state.
type DeliveryStatus string

const (
	DeliveryPending   DeliveryStatus = "pending"
	DeliveryDelivered DeliveryStatus = "delivered"
	DeliveryFailed    DeliveryStatus = "failed" // retries exhausted
	DeliverySkipped   DeliveryStatus = "skipped"
)

// AttemptResult is what one send did.
type AttemptResult struct {
	DeliveryID uuid.UUID
	Attempt    int
	StartedAt  time.Time
	Duration   time.Duration
	StatusCode int    // 0: no HTTP answer
	Error      string // empty on a 2xx
	Delivered  bool
	RetryIn    time.Duration // when failed: the delay before the next attempt
	RetryFor   time.Duration // when failed: give up once the next attempt would fall after retry_since + RetryFor
}

// RecordAttempt logs the attempt and moves the delivery: delivered, rescheduled or failed.
// superseded is true when the attempt no longer owned the delivery (its lease ran out and
// another attempt took it, or it was delivered meanwhile): only the log row is written then.
func (s *Store) RecordAttempt(ctx context.Context, r AttemptResult) (status DeliveryStatus, attempts int, superseded bool, err error) {
	err = s.tx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, dbsqlc.InsertAttempt, payment.NewID(), r.DeliveryID, r.Attempt, r.StartedAt,
			r.Duration.Milliseconds(), r.StatusCode, r.Error); err != nil {
			return err
		}
		var row pgx.Row
		if r.Delivered {
			row = tx.QueryRow(ctx, dbsqlc.MarkDelivered, r.DeliveryID, r.StatusCode)
		} else {
			row = tx.QueryRow(ctx, dbsqlc.AttemptFailed, r.DeliveryID, r.Attempt, r.RetryIn.Seconds(), r.RetryFor.Seconds(), r.StatusCode, r.Error)
		}
		err := row.Scan(&status, &attempts)
		if errors.Is(err, pgx.ErrNoRows) {
			superseded = true
			return nil
		}
		return err
	})
	return status, attempts, superseded, err
}

// Delivery is a webhook delivery with its attempt log, for operators.
type Delivery struct {
	ID             uuid.UUID // the event id
	MerchantID     uuid.UUID
	AggregateID    uuid.UUID
	EventType      string
	EventCreatedAt time.Time
	URL            string
	Status         DeliveryStatus
	AttemptCount   int
	NextAttemptAt  time.Time
	ClaimedUntil   *time.Time
	RetrySince     time.Time
	LastStatusCode int
	LastError      string
	CreatedAt      time.Time
	UpdatedAt      time.Time
	DeliveredAt    *time.Time
	Attempts       []DeliveryAttempt
}

// DeliveryAttempt is one row of the attempt log.
type DeliveryAttempt struct {
	Attempt    int
	StartedAt  time.Time
	Duration   time.Duration
	StatusCode int // 0: no HTTP answer
	Error      string
}

func scanDelivery(r pgx.CollectableRow) (Delivery, error) {
	var d Delivery
	err := r.Scan(&d.ID, &d.MerchantID, &d.AggregateID, &d.EventType, &d.EventCreatedAt, &d.URL, &d.Status,
		&d.AttemptCount, &d.NextAttemptAt, &d.ClaimedUntil, &d.RetrySince, &d.LastStatusCode, &d.LastError,
		&d.CreatedAt, &d.UpdatedAt, &d.DeliveredAt)
	return d, err
}

// MerchantDeliveries lists a merchant's most recent deliveries (newest first) with their
// attempts. payment.ErrNotFound when there is no such merchant.
func (s *Store) MerchantDeliveries(ctx context.Context, merchantID uuid.UUID, limit int) ([]Delivery, error) {
	exists, err := s.q.MerchantExists(ctx, merchantID)
	if err != nil {
		return nil, translate(err)
	}
	if !exists {
		return nil, payment.ErrNotFound
	}
	return s.deliveries(ctx, dbsqlc.MerchantDeliveries, merchantID, limit)
}

// PaymentDeliveries lists the deliveries of one payment's events, in event order.
func (s *Store) PaymentDeliveries(ctx context.Context, paymentID uuid.UUID) ([]Delivery, error) {
	return s.deliveries(ctx, dbsqlc.PaymentDeliveries, paymentID)
}

// Delivery reads one delivery with its attempts.
func (s *Store) Delivery(ctx context.Context, id uuid.UUID) (Delivery, error) {
	ds, err := s.deliveries(ctx, dbsqlc.GetDelivery, id)
	if err != nil {
		return Delivery{}, err
	}
	if len(ds) == 0 {
		return Delivery{}, payment.ErrNotFound
	}
	return ds[0], nil
}

func (s *Store) deliveries(ctx context.Context, sql string, args ...any) ([]Delivery, error) {
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, translate(err)
	}
	ds, err := pgx.CollectRows(rows, scanDelivery)
	if err != nil || len(ds) == 0 {
		return ds, translate(err)
	}
	ids := make([]uuid.UUID, len(ds))
	index := make(map[uuid.UUID]int, len(ds))
	for i, d := range ds {
		ids[i], index[d.ID] = d.ID, i
	}
	rows, err = s.pool.Query(ctx, dbsqlc.AttemptsOf, ids)
	if err != nil {
		return nil, translate(err)
	}
	var a DeliveryAttempt
	var deliveryID uuid.UUID
	var ms int64
	_, err = pgx.ForEachRow(rows, []any{&deliveryID, &a.Attempt, &a.StartedAt, &ms, &a.StatusCode, &a.Error}, func() error {
		a.Duration = time.Duration(ms) * time.Millisecond
		i := index[deliveryID]
		ds[i].Attempts = append(ds[i].Attempts, a)
		return nil
	})
	return ds, translate(err)
}

// Redeliver makes a delivery due now, to the merchant's current webhook URL, with the same event
// id and body, and a fresh retry window. payment.ErrNotFound for no such delivery; a
// *payment.ValidationError when the merchant has no webhook URL.
func (s *Store) Redeliver(ctx context.Context, id uuid.UUID) (Delivery, error) {
	_, err := s.q.Redeliver(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		if _, err := s.Delivery(ctx, id); err != nil {
			return Delivery{}, err
		}
		return Delivery{}, &payment.ValidationError{Fields: []payment.FieldError{{Field: "webhook_url", Message: "the merchant has no webhook URL"}}}
	}
	if err != nil {
		return Delivery{}, translate(err)
	}
	return s.Delivery(ctx, id)
}
