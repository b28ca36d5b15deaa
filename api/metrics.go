package api

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kasa-pay/kasa/store"
)

type metrics struct {
	httpDuration *prometheus.HistogramVec
	idempotency  *prometheus.CounterVec
	paymentTime  prometheus.Histogram
	startTime    prometheus.Histogram
	conflicts    *prometheus.CounterVec
	// backlogRefused counts new payments refused past the backlog's bound.
	backlogRefused prometheus.Counter
	// connsRefused counts connections closed because their client address held its share.
	connsRefused prometheus.Counter
}

func newMetrics(r *prometheus.Registry) *metrics {
	m := &metrics{
		httpDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kasa_http_request_duration_seconds",
			Help:    "HTTP request latency by route, method and status (p95/p99 via histogram_quantile).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"route", "method", "status"}),
		idempotency: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kasa_idempotency_requests_total",
			Help: "POST /v1/payments and POST /v1/payments/{id}/refunds by idempotency outcome (new, queued, replayed, in_use, reused, duplicate_payment, unknown, taken_over); a queued payment counts as new too, so duplicate_ratio = all but new and queued / all but queued.",
		}, []string{"outcome"}),
		paymentTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kasa_payment_sync_duration_seconds",
			Help:    "Time from a new payment request to its final answer, for payments answered synchronously.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
		}),
		startTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kasa_workflow_start_duration_seconds",
			Help:    "Time Temporal takes to accept a new payment's or refund's workflow (the start call), the part of the operation's time that is Temporal's.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
	}
	m.conflicts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kasa_unique_conflicts_total",
		Help: "Unique-constraint conflicts that decided a race (idempotency key, business key); a spike means a retry storm or a faulty client.",
	}, []string{"constraint"})
	m.backlogRefused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kasa_backlog_refused_total",
		Help: "New payments answered 503 because the start backlog was past its bound (docs/operations.md, \"Payday\").",
	})
	m.connsRefused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kasa_api_connections_refused_total",
		Help: "Connections closed at once because their client address already held api.max_conns_per_client.",
	})
	r.MustRegister(m.httpDuration, m.idempotency, m.paymentTime, m.startTime, m.conflicts, m.backlogRefused, m.connsRefused,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (s *Server) observe(c *gin.Context) {
	start := time.Now()
	c.Next()
	route := c.FullPath() // the route template, never the raw path
	if route == "" {
		route = "unmatched"
	}
	s.metrics.httpDuration.WithLabelValues(route, methodLabel(c.Request.Method), strconv.Itoa(c.Writer.Status())).Observe(time.Since(start).Seconds())
}

// methodLabel keeps the method label to a fixed set: a client picks the method, and every new
// label value is a series kept in memory for the life of the process.
func methodLabel(m string) string {
	switch m {
	case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch, http.MethodHead, http.MethodOptions:
		return m
	}
	return "other"
}

// statsSource is where the scrape-time gauges come from.
type statsSource interface {
	Stats(ctx context.Context) (store.Stats, error)
}

// dbCollector reads the unknown-payment and outbox gauges from the database at scrape time, so
// every API replica reports the same truth without a background loop. Scrapes within
// statsFresh of a read share it: however often /metrics is asked, its queries run at most once
// a second.
type dbCollector struct {
	src                                        statsSource
	mu                                         sync.Mutex
	last                                       store.Stats
	lastAt                                     time.Time
	unknown, reconcileAge, backlog, backlogAge *prometheus.Desc
	stuck, unknownRefunds, stuckRefunds        *prometheus.Desc
	openAuthorizations, overdueAuthorizations  *prometheus.Desc
	reconcileLines, reconcileRuns              *prometheus.Desc
	reconcileLast, reconcileLastMismatches     *prometheus.Desc
	lockWaiting, hotPostings, hotShare         *prometheus.Desc
	tableBytes, indexBytes                     *prometheus.Desc
}

// statsFresh is how long one read of the database figures answers scrapes.
const statsFresh = time.Second

// stats is the figures read at most statsFresh ago, or read now.
func (c *dbCollector) stats(ctx context.Context) (store.Stats, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.lastAt.IsZero() && time.Since(c.lastAt) < statsFresh {
		return c.last, nil
	}
	st, err := c.src.Stats(ctx)
	if err == nil {
		c.last, c.lastAt = st, time.Now()
	}
	return st, err
}

func newDBCollector(src statsSource) *dbCollector {
	return &dbCollector{
		src:     src,
		unknown: prometheus.NewDesc("kasa_unknown_payments", "Payments whose outcome is unknown, parked for reconciliation (unknown_count): money at risk.", nil, nil),
		stuck: prometheus.NewDesc("kasa_payments_stuck",
			"Payments that need an operator: flagged by a workflow that cannot go on, or still processing after an hour. Alert when above 0 (docs/operations.md, runbook).", nil, nil),
		openAuthorizations: prometheus.NewDesc("kasa_authorizations_open",
			"Manual payments' authorizations holding a payer's money until their capture or cancel (requires_capture, or a capture or void unknown).", nil, nil),
		overdueAuthorizations: prometheus.NewDesc("kasa_authorizations_overdue",
			"Authorizations still open a minute after their capture_before: a void that is late or unknown. Alert when above 0 (docs/operations.md, runbook).", nil, nil),
		unknownRefunds: prometheus.NewDesc("kasa_unknown_refunds", "Refunds whose outcome is unknown, parked for reconciliation: money at risk.", nil, nil),
		stuckRefunds: prometheus.NewDesc("kasa_refunds_stuck",
			"Refunds that need an operator, counted as kasa_payments_stuck counts payments. Alert when above 0.", nil, nil),
		reconcileAge: prometheus.NewDesc("kasa_reconcile_age_seconds", "Age of the oldest unknown payment or refund (reconcile_age); 0 when none.", nil, nil),
		backlog:      prometheus.NewDesc("kasa_outbox_backlog", "Outbox events not yet published (outbox_backlog).", nil, nil),
		backlogAge:   prometheus.NewDesc("kasa_outbox_oldest_age_seconds", "Age of the oldest unpublished outbox event; 0 when none.", nil, nil),
		reconcileLines: prometheus.NewDesc("kasa_reconcile_outcomes_total",
			"Settlement-file outcomes over every reconciliation run (kasa reconcile and the admin endpoint), by outcome: matched, resolved_charged, resolved_not_charged, pending, mismatch.", []string{"outcome"}, nil),
		reconcileRuns:           prometheus.NewDesc("kasa_reconcile_runs_total", "Reconciliation runs finished.", nil, nil),
		reconcileLast:           prometheus.NewDesc("kasa_reconcile_last_run_timestamp_seconds", "When the latest reconciliation finished (Unix time); 0 when never: alert when it is more than a day old.", nil, nil),
		reconcileLastMismatches: prometheus.NewDesc("kasa_reconcile_last_mismatches", "Mismatches reported by the latest reconciliation run: each needs a person.", nil, nil),
		lockWaiting: prometheus.NewDesc("kasa_db_lock_waiting",
			"Sessions waiting for a lock at scrape time (db_lock_wait), by relation: a table's name, or transactionid for a row another transaction holds (hot rows).", []string{"relation"}, nil),
		hotPostings: prometheus.NewDesc("kasa_hot_account_postings_per_minute", "Ledger entries of the busiest account in the last minute (hot_account_rate).", nil, nil),
		hotShare:    prometheus.NewDesc("kasa_hot_account_share", "The busiest account's share of all ledger entries in the last minute (0..1).", nil, nil),
		tableBytes:  prometheus.NewDesc("kasa_db_table_bytes", "Bytes of each kasa table (heap and TOAST).", []string{"table"}, nil),
		indexBytes:  prometheus.NewDesc("kasa_db_index_bytes", "Bytes of each kasa table's indexes (index_size).", []string{"table"}, nil),
	}
}

func (c *dbCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.unknown
	ch <- c.stuck
	ch <- c.unknownRefunds
	ch <- c.stuckRefunds
	ch <- c.openAuthorizations
	ch <- c.overdueAuthorizations
	ch <- c.reconcileAge
	ch <- c.backlog
	ch <- c.backlogAge
	ch <- c.reconcileLines
	ch <- c.reconcileRuns
	ch <- c.reconcileLast
	ch <- c.reconcileLastMismatches
	ch <- c.lockWaiting
	ch <- c.hotPostings
	ch <- c.hotShare
	ch <- c.tableBytes
	ch <- c.indexBytes
}

func (c *dbCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := c.stats(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.unknown, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.unknown, prometheus.GaugeValue, float64(st.UnknownCount))
	ch <- prometheus.MustNewConstMetric(c.stuck, prometheus.GaugeValue, float64(st.Stuck))
	ch <- prometheus.MustNewConstMetric(c.unknownRefunds, prometheus.GaugeValue, float64(st.UnknownRefunds))
	ch <- prometheus.MustNewConstMetric(c.stuckRefunds, prometheus.GaugeValue, float64(st.StuckRefunds))
	ch <- prometheus.MustNewConstMetric(c.openAuthorizations, prometheus.GaugeValue, float64(st.OpenAuthorizations))
	ch <- prometheus.MustNewConstMetric(c.overdueAuthorizations, prometheus.GaugeValue, float64(st.OverdueAuthorizations))
	ch <- prometheus.MustNewConstMetric(c.reconcileAge, prometheus.GaugeValue, ageSeconds(st.Now, st.OldestUnknown))
	ch <- prometheus.MustNewConstMetric(c.backlog, prometheus.GaugeValue, float64(st.OutboxBacklog))
	ch <- prometheus.MustNewConstMetric(c.backlogAge, prometheus.GaugeValue, ageSeconds(st.Now, st.OldestOutbox))
	r := st.Reconcile
	for outcome, n := range map[string]int64{"matched": r.Matched, "resolved_charged": r.ResolvedCharged,
		"resolved_not_charged": r.ResolvedNotCharged, "pending": r.Pending, "mismatch": r.Mismatches} {
		ch <- prometheus.MustNewConstMetric(c.reconcileLines, prometheus.CounterValue, float64(n), outcome)
	}
	ch <- prometheus.MustNewConstMetric(c.reconcileRuns, prometheus.CounterValue, float64(r.Runs))
	var last float64
	if !r.LastRun.IsZero() {
		last = float64(r.LastRun.UnixNano()) / 1e9
	}
	ch <- prometheus.MustNewConstMetric(c.reconcileLast, prometheus.GaugeValue, last)
	ch <- prometheus.MustNewConstMetric(c.reconcileLastMismatches, prometheus.GaugeValue, float64(r.LastMismatches))
	for rel, n := range st.LockWaits {
		ch <- prometheus.MustNewConstMetric(c.lockWaiting, prometheus.GaugeValue, float64(n), rel)
	}
	ch <- prometheus.MustNewConstMetric(c.hotPostings, prometheus.GaugeValue, float64(st.HotAccountPostings))
	ch <- prometheus.MustNewConstMetric(c.hotShare, prometheus.GaugeValue, st.HotAccountShare)
	for _, t := range st.Tables {
		ch <- prometheus.MustNewConstMetric(c.tableBytes, prometheus.GaugeValue, float64(t.TableBytes), t.Table)
		ch <- prometheus.MustNewConstMetric(c.indexBytes, prometheus.GaugeValue, float64(t.IndexBytes), t.Table)
	}
}

// ageSeconds is how long before now t was, both by the database's clock, which stamped t: this
// host's may be minutes off it.
func ageSeconds(now, t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return now.Sub(t).Seconds()
}

// register exports the start backlog as this process last read it, and its own running
// payments.
func (a *admission) register(r prometheus.Registerer) {
	if a.State == nil {
		return
	}
	state := func(f func(store.BacklogState) float64) func() float64 {
		return func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			return f(a.backlog(ctx))
		}
	}
	r.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kasa_backlog_queued", Help: "Payments queued in the start backlog."},
			state(func(b store.BacklogState) float64 { return float64(b.Queued) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kasa_backlog_oldest_age_seconds", Help: "How long the oldest queued payment has waited to start."},
			state(func(b store.BacklogState) float64 {
				return ageSeconds(b.Now, b.Oldest)
			})),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kasa_backlog_drain_per_second", Help: "Queued payments the drainer started per second, over the last 10 s."},
			state(func(b store.BacklogState) float64 { return b.DrainPerSecond })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kasa_api_running_payments", Help: "Payments this API process started and is waiting for, of its backlog.max_running."},
			func() float64 {
				a.mu.Lock()
				defer a.mu.Unlock()
				return float64(a.running)
			}),
	)
}
