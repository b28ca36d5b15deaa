package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kasa-pay/kasa/payment"
)

// The event pipeline's tables (CONTRACT §7): the outbox the relay drains, the inbox that makes a
// consumer's effect happen once per message, and the webhook deliveries with their attempt log.
//
// Order per aggregate (payment) is explicit at every hop:
//   - the relay claims only the oldest unpublished event of each aggregate, so a later event is
//     published only after the earlier one was acknowledged by the broker and marked, whatever
//     the number of relays;
//   - the webhook consumer defers an event while an earlier event of its aggregate, published
//     recently, is not yet in its inbox (several consumer processes may race otherwise);
//   - the sender claims a delivery only when no earlier delivery of its aggregate is pending.
const (
	sqlClaimOutbox = `SELECT o.id, o.aggregate_id, o.type, o.payload, o.created_at
FROM outbox o
WHERE o.published_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM outbox e
      WHERE e.aggregate_id = o.aggregate_id AND e.published_at IS NULL
        AND (e.created_at, e.id) < (o.created_at, o.id))
ORDER BY o.created_at, o.id
LIMIT $1
FOR UPDATE OF o SKIP LOCKED`
	sqlMarkPublished = `UPDATE outbox SET published_at = now() WHERE id = ANY($1) AND published_at IS NULL`
	sqlOutboxBacklog = `SELECT count(*), coalesce(min(created_at), 'epoch') FROM outbox WHERE published_at IS NULL`
	sqlPurgeOutbox   = `DELETE FROM outbox WHERE id IN (SELECT id FROM outbox
WHERE published_at < now() - $1::float8 * interval '1 second' ORDER BY published_at LIMIT $2)`
	sqlPurgeInbox = `DELETE FROM inbox WHERE (consumer, message_id) IN (SELECT consumer, message_id FROM inbox
WHERE processed_at < now() - $1::float8 * interval '1 second' ORDER BY processed_at LIMIT $2)`
	// Finished deliveries only: a pending one is still owed to the merchant. Attempts cascade.
	sqlPurgeDeliveries = `DELETE FROM webhook_deliveries WHERE id IN (SELECT id FROM webhook_deliveries
WHERE status IN ('delivered', 'failed', 'skipped') AND updated_at < now() - $1::float8 * interval '1 second' LIMIT $2)`

	// One event through a consumer's inbox, in one statement. It waits (writes nothing) while an
	// earlier event of the aggregate, published within the grace period (or not yet published),
	// has not been through this inbox; the inbox row goes in only then, and the delivery only
	// with a new inbox row. Every part reads the statement's snapshot, which holds the batch's
	// earlier statements: an earlier event of the same batch counts as processed. The last
	// column says whether the delivery existed before (the inbox row was purged, it was not).
	sqlAcceptEvent = `WITH waiting AS (
  SELECT EXISTS (SELECT 1 FROM outbox o
    WHERE o.aggregate_id = $2 AND (o.created_at, o.id) < ($4, $1)
      AND coalesce(o.published_at, o.created_at) > now() - $7::float8 * interval '1 second'
      AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.consumer = $6 AND i.message_id = o.id)) AS w
), inboxed AS (
  INSERT INTO inbox (consumer, message_id) SELECT $6, $1 FROM waiting WHERE NOT w
  ON CONFLICT DO NOTHING RETURNING 1
), delivered AS (
  INSERT INTO webhook_deliveries (id, merchant_id, aggregate_id, event_type, event_created_at, url, body, status)
  SELECT $1, p.merchant_id, p.id, $3, $4, m.webhook_url, $5,
         CASE WHEN m.webhook_url IS NULL THEN 'skipped' ELSE 'pending' END
  FROM payments p JOIN merchants m ON m.id = p.merchant_id
  WHERE p.id = $2 AND $5::bytea IS NOT NULL AND EXISTS (SELECT 1 FROM inboxed)
  ON CONFLICT (id) DO NOTHING RETURNING status
)
SELECT (SELECT w FROM waiting), EXISTS (SELECT 1 FROM inboxed), coalesce((SELECT status FROM delivered), ''),
       EXISTS (SELECT 1 FROM webhook_deliveries WHERE id = $1)`

	// Claim due deliveries: at most $2 in flight per merchant (counting other senders' live
	// leases), the earliest pending event of each aggregate only, then lease them ($3 seconds)
	// and count the attempt. The attempt number is the fencing token of the result.
	sqlClaimDeliveries = `WITH inflight AS (
    SELECT merchant_id, count(*) AS n FROM webhook_deliveries
    WHERE status = 'pending' AND claimed_until IS NOT NULL AND claimed_until > now() GROUP BY merchant_id
), due AS (
    SELECT d.id, d.merchant_id, d.next_attempt_at,
           row_number() OVER (PARTITION BY d.merchant_id ORDER BY d.next_attempt_at, d.id) AS rn
    FROM webhook_deliveries d
    WHERE d.status = 'pending' AND d.next_attempt_at <= now()
      AND (d.claimed_until IS NULL OR d.claimed_until <= now())
      AND NOT EXISTS (SELECT 1 FROM webhook_deliveries e
          WHERE e.aggregate_id = d.aggregate_id AND e.status = 'pending'
            AND (e.event_created_at, e.id) < (d.event_created_at, d.id))
), picked AS (
    SELECT d.id FROM webhook_deliveries d
    JOIN due ON due.id = d.id
    LEFT JOIN inflight i ON i.merchant_id = due.merchant_id
    WHERE due.rn + coalesce(i.n, 0) <= $2
      AND d.status = 'pending' AND (d.claimed_until IS NULL OR d.claimed_until <= now())
    ORDER BY due.next_attempt_at, d.id
    LIMIT $1
    FOR UPDATE OF d SKIP LOCKED
)
UPDATE webhook_deliveries d
SET claimed_until = now() + $3::float8 * interval '1 second', attempts = d.attempts + 1, updated_at = now()
FROM picked, merchants m
WHERE d.id = picked.id AND m.id = d.merchant_id
RETURNING d.id, d.merchant_id, d.aggregate_id, d.event_type, d.url, d.body, d.attempts, m.webhook_secret_enc`
	sqlInsertAttempt = `INSERT INTO webhook_attempts (id, delivery_id, attempt, started_at, duration_ms, status_code, error)
VALUES ($1, $2, $3, $4, $5, NULLIF($6, 0), NULLIF($7, ''))`
	// A 2xx wins whoever holds the lease now.
	sqlDelivered = `UPDATE webhook_deliveries SET status = 'delivered', delivered_at = now(), claimed_until = NULL,
last_status_code = NULLIF($2, 0), last_error = NULL, updated_at = now()
WHERE id = $1 AND status = 'pending' RETURNING status, attempts`
	// A failure reschedules only if this attempt still owns the row; it gives up once the next
	// attempt would fall after the retry window.
	sqlAttemptFailed = `UPDATE webhook_deliveries SET
  status = CASE WHEN now() + $3::float8 * interval '1 second' > retry_since + $4::float8 * interval '1 second'
                THEN 'failed' ELSE 'pending' END,
  next_attempt_at = now() + $3::float8 * interval '1 second', claimed_until = NULL,
  last_status_code = NULLIF($5, 0), last_error = NULLIF($6, ''), updated_at = now()
WHERE id = $1 AND status = 'pending' AND attempts = $2 RETURNING status, attempts`

	deliveryColumns = `d.id, d.merchant_id, d.aggregate_id, d.event_type, d.event_created_at, coalesce(d.url, ''), d.status,
d.attempts, d.next_attempt_at, d.claimed_until, d.retry_since, coalesce(d.last_status_code, 0), coalesce(d.last_error, ''),
d.created_at, d.updated_at, d.delivered_at`
	sqlMerchantExists    = `SELECT EXISTS (SELECT 1 FROM merchants WHERE id = $1)`
	sqlMerchantDelivery  = `SELECT ` + deliveryColumns + ` FROM webhook_deliveries d WHERE d.merchant_id = $1 ORDER BY d.id DESC LIMIT $2`
	sqlDelivery          = `SELECT ` + deliveryColumns + ` FROM webhook_deliveries d WHERE d.id = $1`
	sqlDeliveryBody      = `SELECT body FROM webhook_deliveries WHERE id = $1`
	sqlDeliveriesOfEvent = `SELECT ` + deliveryColumns + ` FROM webhook_deliveries d WHERE d.aggregate_id = $1 ORDER BY d.event_created_at, d.id`
	sqlAttemptsOf        = `SELECT delivery_id, attempt, started_at, duration_ms, coalesce(status_code, 0), coalesce(error, '')
FROM webhook_attempts WHERE delivery_id = ANY($1) ORDER BY delivery_id, attempt, started_at`
	// Redelivery sends the same event (same id and body) to the merchant's current URL, now, and
	// opens a new retry window. A pending delivery keeps its lease: no second concurrent send.
	sqlRedeliver = `UPDATE webhook_deliveries d SET status = 'pending', url = m.webhook_url, next_attempt_at = now(),
claimed_until = CASE WHEN d.status = 'pending' THEN d.claimed_until END, retry_since = now(), updated_at = now()
FROM merchants m WHERE d.id = $1 AND m.id = d.merchant_id AND m.webhook_url IS NOT NULL RETURNING d.id`
)

// OutboxEvent is one outbox row on its way to the broker.
type OutboxEvent struct {
	ID          uuid.UUID // the event id and the broker's message id
	AggregateID uuid.UUID // the payment
	Type        string    // "payment.succeeded", ...
	Payload     []byte    // the payment resource (JSON)
	CreatedAt   time.Time // in the payment's transaction
}

// RelayOutbox claims up to limit unpublished events (FOR UPDATE SKIP LOCKED: concurrent relays
// take disjoint rows; at most one event per aggregate, the oldest), hands them to publish in
// (created_at, id) order, and marks published the ids publish returns (those the broker
// acknowledged), all in one transaction. The rows stay locked while publish runs. If publish
// fails, what it acknowledged is still marked and its error returned; the rest is retried.
func (s *Store) RelayOutbox(ctx context.Context, limit int, publish func(context.Context, []OutboxEvent) ([]uuid.UUID, error)) (claimed, published int, err error) {
	var pubErr error
	err = s.tx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sqlClaimOutbox, limit)
		if err != nil {
			return err
		}
		events, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OutboxEvent, error) {
			var e OutboxEvent
			err := r.Scan(&e.ID, &e.AggregateID, &e.Type, &e.Payload, &e.CreatedAt)
			return e, err
		})
		if err != nil || len(events) == 0 {
			return err
		}
		claimed = len(events)
		var acked []uuid.UUID
		acked, pubErr = publish(ctx, events)
		if len(acked) == 0 {
			return nil
		}
		tag, err := tx.Exec(ctx, sqlMarkPublished, acked)
		published = int(tag.RowsAffected())
		return err
	})
	if err != nil {
		return claimed, 0, err
	}
	return claimed, published, pubErr
}

// OutboxBacklog counts unpublished events and returns the oldest one's creation time (zero when
// there is none).
func (s *Store) OutboxBacklog(ctx context.Context) (count int64, oldest time.Time, err error) {
	err = s.pool.QueryRow(ctx, sqlOutboxBacklog).Scan(&count, &oldest)
	if oldest.Unix() == 0 {
		oldest = time.Time{}
	}
	return count, oldest, translate(err)
}

// Purged counts the rows one retention pass deleted.
type Purged struct{ Outbox, Inbox, Deliveries int64 }

// PurgeEvents deletes published outbox rows, inbox rows and finished webhook deliveries (with
// their attempts) older than olderThan, batch rows per statement (each its own short
// transaction, so no table is locked for long).
func (s *Store) PurgeEvents(ctx context.Context, olderThan time.Duration, batch int) (Purged, error) {
	purge := func(sql string, total *int64) error {
		for {
			tag, err := s.pool.Exec(ctx, sql, olderThan.Seconds(), batch)
			if err != nil {
				return translate(err)
			}
			*total += tag.RowsAffected()
			if tag.RowsAffected() < int64(batch) {
				return nil
			}
		}
	}
	var p Purged
	if err := purge(sqlPurgeOutbox, &p.Outbox); err != nil {
		return p, err
	}
	if err := purge(sqlPurgeInbox, &p.Inbox); err != nil {
		return p, err
	}
	return p, purge(sqlPurgeDeliveries, &p.Deliveries)
}

// Acceptance is what a consumer's inbox made of a message.
type Acceptance string

const (
	AcceptedPending   Acceptance = "pending"   // new: a delivery is due
	AcceptedSkipped   Acceptance = "skipped"   // new: the merchant has no webhook URL
	AcceptedDuplicate Acceptance = "duplicate" // the message id is in the inbox already
	AcceptedOrphan    Acceptance = "orphan"    // new, but no such payment: recorded, nothing to deliver
	AcceptedDeferred  Acceptance = "deferred"  // an earlier event of the aggregate comes first: redeliver later
	AcceptedIgnored   Acceptance = "ignored"   // new, of a type this consumer does not deliver (no Body): inbox only
)

// NewDelivery is an event a webhook consumer received, with the exact body merchants get.
type NewDelivery struct {
	EventID     uuid.UUID // the message id
	AggregateID uuid.UUID // the payment
	Type        string
	CreatedAt   time.Time // the outbox row's
	Body        []byte    // nil: nothing to deliver, only record the message
}

// AcceptEvent is AcceptEvents for one message.
func (s *Store) AcceptEvent(ctx context.Context, consumer string, e NewDelivery, orderGrace time.Duration) (Acceptance, error) {
	acc, err := s.AcceptEvents(ctx, consumer, []NewDelivery{e}, orderGrace)
	if err != nil {
		return "", err
	}
	return acc[0], nil
}

// AcceptEvents records messages in consumer's inbox and creates their deliveries, in order and
// in one transaction (one round trip), and says what became of each. A message already in the
// inbox changes nothing. An event is deferred (nothing written for it) while an earlier event
// of its payment, published less than orderGrace ago, has not been through this inbox yet; an
// earlier event in the same batch counts once it is accepted. Any error writes nothing.
func (s *Store) AcceptEvents(ctx context.Context, consumer string, es []NewDelivery, orderGrace time.Duration) ([]Acceptance, error) {
	out := make([]Acceptance, len(es))
	err := s.pipelined(ctx, func(tx *pipeTx) error {
		b := &pgx.Batch{}
		for _, e := range es {
			// A nil Body goes as NULL: the inbox row only.
			b.Queue(sqlAcceptEvent, e.EventID, e.AggregateID, e.Type, e.CreatedAt, e.Body, consumer, orderGrace.Seconds())
		}
		return tx.commitWith(ctx, b, func(br pgx.BatchResults) error {
			for i, e := range es {
				var waiting, inboxed, existed bool
				var status string
				if err := br.QueryRow().Scan(&waiting, &inboxed, &status, &existed); err != nil {
					return err
				}
				out[i] = acceptance(e, waiting, inboxed, status, existed)
			}
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func acceptance(e NewDelivery, waiting, inboxed bool, status string, existed bool) Acceptance {
	switch {
	case waiting:
		return AcceptedDeferred
	case !inboxed:
		return AcceptedDuplicate
	case e.Body == nil:
		return AcceptedIgnored
	case status != "":
		return Acceptance(status)
	case existed: // the inbox row was purged, the delivery was not
		return AcceptedDuplicate
	default:
		return AcceptedOrphan
	}
}

// ClaimedDelivery is a delivery a sender holds until its lease runs out.
type ClaimedDelivery struct {
	ID          uuid.UUID // the event id
	MerchantID  uuid.UUID
	AggregateID uuid.UUID
	EventType   string
	URL         string
	Body        []byte
	Secret      string // the merchant's webhook secret, decrypted
	Attempt     int    // this attempt's number, 1-based; the fencing token of its result
}

// ClaimDeliveries leases up to limit due deliveries for lease and counts their attempt. A
// merchant never gets more than perMerchant deliveries in flight (across senders, best effort
// under races), and an aggregate's deliveries go one at a time in event order.
func (s *Store) ClaimDeliveries(ctx context.Context, limit, perMerchant int, lease time.Duration) ([]ClaimedDelivery, error) {
	rows, err := s.pool.Query(ctx, sqlClaimDeliveries, limit, perMerchant, lease.Seconds())
	if err != nil {
		return nil, translate(err)
	}
	type claimed struct {
		ClaimedDelivery
		sealed []byte
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (claimed, error) {
		var c claimed
		err := r.Scan(&c.ID, &c.MerchantID, &c.AggregateID, &c.EventType, &c.URL, &c.Body, &c.Attempt, &c.sealed)
		return c, err
	})
	if err != nil {
		return nil, translate(err)
	}
	ds := make([]ClaimedDelivery, 0, len(out))
	for _, c := range out {
		if c.Secret, err = s.open(c.sealed); err != nil {
			return nil, fmt.Errorf("%w: merchant %s: %v", ErrInconsistent, c.MerchantID, err)
		}
		ds = append(ds, c.ClaimedDelivery)
	}
	return ds, nil
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
		if _, err := tx.Exec(ctx, sqlInsertAttempt, payment.NewID(), r.DeliveryID, r.Attempt, r.StartedAt,
			r.Duration.Milliseconds(), r.StatusCode, r.Error); err != nil {
			return err
		}
		var row pgx.Row
		if r.Delivered {
			row = tx.QueryRow(ctx, sqlDelivered, r.DeliveryID, r.StatusCode)
		} else {
			row = tx.QueryRow(ctx, sqlAttemptFailed, r.DeliveryID, r.Attempt, r.RetryIn.Seconds(), r.RetryFor.Seconds(), r.StatusCode, r.Error)
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
	var exists bool
	if err := s.pool.QueryRow(ctx, sqlMerchantExists, merchantID).Scan(&exists); err != nil {
		return nil, translate(err)
	}
	if !exists {
		return nil, payment.ErrNotFound
	}
	return s.deliveries(ctx, sqlMerchantDelivery, merchantID, limit)
}

// PaymentDeliveries lists the deliveries of one payment's events, in event order.
func (s *Store) PaymentDeliveries(ctx context.Context, paymentID uuid.UUID) ([]Delivery, error) {
	return s.deliveries(ctx, sqlDeliveriesOfEvent, paymentID)
}

// Delivery reads one delivery with its attempts.
func (s *Store) Delivery(ctx context.Context, id uuid.UUID) (Delivery, error) {
	ds, err := s.deliveries(ctx, sqlDelivery, id)
	if err != nil {
		return Delivery{}, err
	}
	if len(ds) == 0 {
		return Delivery{}, payment.ErrNotFound
	}
	return ds[0], nil
}

// DeliveryBody returns the exact bytes sent (and signed) for a delivery.
func (s *Store) DeliveryBody(ctx context.Context, id uuid.UUID) ([]byte, error) {
	var b []byte
	err := s.pool.QueryRow(ctx, sqlDeliveryBody, id).Scan(&b)
	return b, translate(err)
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
	rows, err = s.pool.Query(ctx, sqlAttemptsOf, ids)
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
	var got uuid.UUID
	err := s.pool.QueryRow(ctx, sqlRedeliver, id).Scan(&got)
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
