package worker

import (
	"context"
	"log/slog"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Verifier checks the money invariants and returns one line per violation (store.Verify).
type Verifier interface {
	Verify(ctx context.Context) ([]string, error)
}

// LedgerCheck runs the ledger's invariants periodically and exports what the last run found.
// The database roles keep the application from rewriting the ledger; this catches whoever has
// more power than the application (the tables' owner, a superuser, a restored backup).
type LedgerCheck struct {
	verifier    Verifier
	interval    time.Duration
	log         *slog.Logger
	violations  prometheus.Gauge
	lastSuccess prometheus.Gauge
	duration    prometheus.Gauge
	failures    prometheus.Counter
}

// maxLoggedViolations bounds one run's log: the count is in the metric, `kasa verify` lists all.
const maxLoggedViolations = 20

// NewLedgerCheck registers the check's metrics on reg; Run does nothing when interval is 0.
func NewLedgerCheck(v Verifier, interval time.Duration, reg prometheus.Registerer, log *slog.Logger) *LedgerCheck {
	c := &LedgerCheck{
		verifier: v, interval: interval, log: log,
		violations: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kasa_ledger_violations",
			Help: "Money invariants violated at the last ledger verification (kasa verify lists them; NaN until the first one ends); 0 is the only good value."}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kasa_ledger_verify_last_success_timestamp_seconds",
			Help: "When the last ledger verification completed (Unix seconds); 0: none yet."}),
		duration: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kasa_ledger_verify_duration_seconds",
			Help: "How long the last completed ledger verification took."}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "kasa_ledger_verify_failures_total",
			Help: "Ledger verifications that could not complete (database errors)."}),
	}
	// Not known until a check ends: a restarted worker must not read all clear (0) over the
	// violations its last run found.
	c.violations.Set(math.NaN())
	if reg != nil {
		reg.MustRegister(c.violations, c.lastSuccess, c.duration, c.failures)
	}
	return c
}

// Run checks at once, then every interval, until ctx ends.
func (c *LedgerCheck) Run(ctx context.Context) error {
	if c.interval <= 0 {
		return nil
	}
	every(ctx, c.interval, c.Check)
	return nil
}

// Check runs the invariants once and updates the metrics; a failed run keeps the last count.
func (c *LedgerCheck) Check(ctx context.Context) {
	start := time.Now()
	problems, err := c.verifier.Verify(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.failures.Inc()
			c.log.Warn("ledger verification failed", "error", err)
		}
		return
	}
	took := time.Since(start)
	c.violations.Set(float64(len(problems)))
	c.duration.Set(took.Seconds())
	c.lastSuccess.Set(float64(time.Now().Unix()))
	if len(problems) > 0 {
		shown := problems[:min(len(problems), maxLoggedViolations)]
		c.log.Error("ledger verification found violations: run kasa verify and see docs/operations.md",
			"count", len(problems), "first", shown, "took", took)
		return
	}
	c.log.Debug("ledger verified", "took", took)
}
