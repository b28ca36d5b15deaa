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
	// Step is this attempt's number within the retry window (from its first attempt, or from
	// the latest redelivery), 1-based: a failure waits the backoff of this step.
	Step int
}

// ClaimDeliveries leases up to limit due deliveries for lease and counts their attempt. A
// merchant never gets more than perMerchant deliveries in flight (across senders, best effort
// under races), and an aggregate's deliveries go one at a time in event order.
//
// One statement looks at a bounded number of the oldest due rows (claimCandidates). When they
// were more than that and did not fill limit (their merchants at their limit), a second one
// claims merchant by merchant, a bounded number of merchants from a random one on
// (claimMerchants): rows behind a backlog of merchants at their limit are reached however long
// it is, and neither statement costs more than what it looks at. The rows the first one claimed
// are then in flight, so the limit per merchant holds across the two.
func (s *Store) ClaimDeliveries(ctx context.Context, limit, perMerchant int, lease time.Duration) ([]ClaimedDelivery, error) {
	candidates := claimCandidates(limit)
	ds, scanned, err := s.claimDeliveries(ctx, limit, perMerchant, lease, candidates)
	if err != nil || len(ds) >= limit || scanned < int64(candidates) {
		return ds, err
	}
	more, err := s.claimMerchantDeliveries(ctx, limit-len(ds), perMerchant, lease, claimMerchants(limit, perMerchant), uuid.New())
	return append(ds, more...), err
}

// claimCandidates is how many due rows one claim statement looks at for limit rows: enough that
// a few merchants at their limit or payments waiting for an earlier event do not leave it short.
func claimCandidates(limit int) int { return max(4*limit, 64) }

// claimMerchants is how many merchants the claim past the oldest due rows looks at: it reads
// 2*perMerchant rows of each, about as many rows as the first statement looks at in all, and at
// least 16 merchants. A random start gives the others their turn at later claims.
func claimMerchants(limit, perMerchant int) int {
	return max(claimCandidates(limit)/(2*max(perMerchant, 1)), 16)
}

// claimDeliveries runs the claim of the oldest due rows (claim_deliveries.sql), from the head
// of the queue; scanned is how many due rows it looked at.
func (s *Store) claimDeliveries(ctx context.Context, limit, perMerchant int, lease time.Duration, candidates int) (ds []ClaimedDelivery, scanned int64, err error) {
	// Planned at each call (an unnamed statement), never from a plan cached while the table was
	// small: the walk's probes would then be scans of the whole table.
	rows, err := s.pool.Query(ctx, queryClaimDeliveries, pgx.QueryExecModeCacheDescribe,
		limit, perMerchant, lease.Seconds(), candidates, pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}, uuid.Nil)
	if err != nil {
		return nil, 0, translate(err)
	}
	defer rows.Close()
	var unreadable []error
	for rows.Next() {
		var c claimedRow
		var n *int64
		var at pgtype.Timestamptz
		var last *uuid.UUID
		if err := rows.Scan(&c.id, &c.merchantID, &c.aggregateID, &c.eventType, &c.url, &c.body, &c.attempt, &c.sealed, &c.prevSealed,
			&c.step, &n, &at, &last); err != nil {
			return nil, 0, translate(err)
		}
		if c.id == nil { // the last row: how many due rows the statement looked at
			scanned = *n
			continue
		}
		d, err := s.claimed(c)
		if err != nil {
			unreadable = append(unreadable, err)
			continue
		}
		ds = append(ds, d)
	}
	return ds, scanned, errors.Join(translate(rows.Err()), errors.Join(unreadable...))
}

// claimMerchantDeliveries runs the claim merchant by merchant (claim_merchant_deliveries.sql),
// over at most merchants merchants from after start.
func (s *Store) claimMerchantDeliveries(ctx context.Context, limit, perMerchant int, lease time.Duration, merchants int, start uuid.UUID) ([]ClaimedDelivery, error) {
	// Planned at each call, as claimDeliveries.
	rows, err := s.pool.Query(ctx, queryClaimMerchantDeliveries, pgx.QueryExecModeCacheDescribe,
		limit, perMerchant, lease.Seconds(), merchants, start)
	if err != nil {
		return nil, translate(err)
	}
	defer rows.Close()
	var ds []ClaimedDelivery
	var unreadable []error
	for rows.Next() {
		var c claimedRow
		if err := rows.Scan(&c.id, &c.merchantID, &c.aggregateID, &c.eventType, &c.url, &c.body, &c.attempt, &c.sealed, &c.prevSealed,
			&c.step); err != nil {
			return nil, translate(err)
		}
		d, err := s.claimed(c)
		if err != nil {
			unreadable = append(unreadable, err)
			continue
		}
		ds = append(ds, d)
	}
	return ds, errors.Join(translate(rows.Err()), errors.Join(unreadable...))
}

// claimedRow is a row a claim statement returns (all NULL in claim_deliveries.sql's last row).
type claimedRow struct {
	id, merchantID, aggregateID *uuid.UUID
	eventType, url              *string
	body, sealed, prevSealed    []byte
	attempt, step               *int
}

// claimed opens the merchant's secrets of a claimed row. A row whose secret cannot be opened
// (damaged) is left claimed, its lease running out as a stalled send's would, and named in the
// claim's error: the rest of the batch is sent.
func (s *Store) claimed(r claimedRow) (ClaimedDelivery, error) {
	c := ClaimedDelivery{ID: *r.id, MerchantID: *r.merchantID, AggregateID: *r.aggregateID, EventType: *r.eventType, URL: *r.url,
		Body: r.body, Attempt: *r.attempt, Step: *r.step}
	var err error
	if c.Secret, err = s.open(r.sealed); err != nil {
		return ClaimedDelivery{}, fmt.Errorf("%w: merchant %s: %v", ErrInconsistent, c.MerchantID, err)
	}
	if r.prevSealed != nil {
		if c.PreviousSecret, err = s.open(r.prevSealed); err != nil {
			return ClaimedDelivery{}, fmt.Errorf("%w: merchant %s: previous secret: %v", ErrInconsistent, c.MerchantID, err)
		}
	}
	return c, nil
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
	// Aborted is an attempt kasa cut short itself (its sender stopping), not one the merchant
	// failed: it is logged, and the delivery is due again at once as it was before its claim.
	Aborted  bool
	RetryIn  time.Duration // when failed: the delay before the next attempt
	RetryFor time.Duration // when failed: give up once the next attempt would fall after retry_since + RetryFor
}

// RecordAttempt logs the attempt and moves the delivery: delivered, rescheduled or failed, or
// (Aborted) back to due as it was before the attempt's claim.
// superseded is true when the attempt no longer owned the delivery (its lease ran out and
// another attempt took it, or it was delivered meanwhile): only the log row is written then.
// A 2xx is the exception: the merchant has the event, whoever holds the delivery now, unless
// an operator redelivered it after this attempt's claim.
func (s *Store) RecordAttempt(ctx context.Context, r AttemptResult) (status DeliveryStatus, attempts int, superseded bool, err error) {
	err = s.tx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, dbsqlc.InsertAttempt, payment.NewID(), r.DeliveryID, r.Attempt, r.StartedAt,
			r.Duration.Milliseconds(), r.StatusCode, r.Error); err != nil {
			return err
		}
		var row pgx.Row
		switch {
		case r.Delivered:
			row = tx.QueryRow(ctx, dbsqlc.MarkDelivered, r.DeliveryID, r.StatusCode, r.Attempt)
		case r.Aborted:
			row = tx.QueryRow(ctx, dbsqlc.AttemptAborted, r.DeliveryID, r.Attempt)
		default:
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
