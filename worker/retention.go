package worker

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// RecordDeleter deletes the idempotency records of operations finished longer ago than
// retention, batch rows per transaction (store.DeleteExpiredRecords).
type RecordDeleter interface {
	SeeRetention(ctx context.Context, retention time.Duration) error
	DeleteExpiredRecords(ctx context.Context, retention time.Duration, batch int) (int64, error)
}

// A deleter announces its retention at every pass; the APIs read the shortest announced within
// RetentionLive every RetentionFollowInterval and answer from their replay caches only records
// younger than it (a deleted record's key may name a new operation). A deleter deletes by its
// retention only once it has announced it for RetentionLead, so that every API has read it.
const (
	RetentionLive           = 4 * RetentionInterval
	RetentionFollowInterval = 5 * time.Second
	RetentionLead           = 2 * RetentionFollowInterval
)

// RetentionInterval is how often a worker deletes expired idempotency records: a record is gone
// within this interval (plus one pass) of expiring.
const RetentionInterval = 15 * time.Second

// RetentionBatch is how many records one delete statement removes: small enough to keep each
// transaction, its locks and its WAL short beside the payment path.
const RetentionBatch = 1000

// RecordRetention deletes expired idempotency records periodically. Every worker runs one; their
// batches skip each other's rows, so more workers only share the work.
type RecordRetention struct {
	deleter   RecordDeleter
	retention time.Duration
	interval  time.Duration
	batch     int
	log       *slog.Logger
	deleted   prometheus.Counter
	failures  prometheus.Counter
	duration  prometheus.Gauge
	last      prometheus.Gauge

	now         func() time.Time // tests set it
	since, seen time.Time        // when this run of announcements began, and the last one
}

// NewRecordRetention registers the runner's metrics on reg (nil: none).
func NewRecordRetention(d RecordDeleter, retention, interval time.Duration, batch int, reg prometheus.Registerer, log *slog.Logger) *RecordRetention {
	r := &RecordRetention{
		deleter: d, retention: retention, interval: interval, batch: batch, log: log, now: time.Now,
		deleted: prometheus.NewCounter(prometheus.CounterOpts{Name: "kasa_idempotency_records_deleted_total",
			Help: "Idempotency records of finished operations deleted by retention (KASA_IDEMPOTENCY_RETENTION)."}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "kasa_idempotency_retention_failures_total",
			Help: "Retention passes over idempotency records that could not complete (database errors)."}),
		duration: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kasa_idempotency_retention_duration_seconds",
			Help: "How long the last completed retention pass over idempotency records took."}),
		last: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kasa_idempotency_retention_last_success_timestamp_seconds",
			Help: "When the last retention pass over idempotency records completed (Unix seconds); 0: none yet."}),
	}
	if reg != nil {
		reg.MustRegister(r.deleted, r.failures, r.duration, r.last)
	}
	return r
}

// Run deletes at once, then every interval, until ctx ends.
func (r *RecordRetention) Run(ctx context.Context) error {
	every(ctx, r.interval, r.Pass)
	return nil
}

// Pass announces the retention, then deletes every record expired by now (once the retention
// was announced for RetentionLead) and updates the metrics.
func (r *RecordRetention) Pass(ctx context.Context) {
	start := r.now()
	if err := r.deleter.SeeRetention(ctx, r.retention); err != nil {
		if ctx.Err() == nil {
			r.failures.Inc()
			r.log.Warn("idempotency record retention could not announce itself", "error", err)
		}
		return
	}
	if r.since.IsZero() || start.Sub(r.seen) > RetentionLive/2 { // first, or after a gap the APIs may have taken for an end
		r.since = start
	}
	r.seen = start
	if start.Sub(r.since) < RetentionLead {
		return
	}
	n, err := r.deleter.DeleteExpiredRecords(ctx, r.retention, r.batch)
	r.deleted.Add(float64(n))
	if err != nil {
		if ctx.Err() == nil {
			r.failures.Inc()
			r.log.Warn("idempotency record retention failed", "deleted", n, "error", err)
		}
		return
	}
	took := r.now().Sub(start)
	r.duration.Set(took.Seconds())
	r.last.Set(float64(r.now().Unix()))
	if n > 0 {
		r.log.Debug("expired idempotency records deleted", "count", n, "took", took)
	}
}
