package outbox

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the relay's and the webhook pipeline's Prometheus metrics. Make one per process
// with NewMetrics and hand it to the Relay, WebhookConsumer and WebhookSender.
//
// The API already reports kasa_outbox_backlog and kasa_outbox_oldest_age_seconds, read from the
// database at scrape time; the relay's own view of the same figures (as of its last poll) is
// kasa_relay_backlog and kasa_relay_oldest_unpublished_age_seconds, so that a standalone
// `kasa relay` has them and one registry can hold both.
type Metrics struct {
	backlog         prometheus.Gauge
	oldestAge       prometheus.Gauge
	publishLatency  prometheus.Histogram
	published       prometheus.Counter
	republished     prometheus.Counter
	gaveUp          prometheus.Counter
	relayErrors     *prometheus.CounterVec
	purged          *prometheus.CounterVec
	consumed        *prometheus.CounterVec
	deliveries      *prometheus.CounterVec
	attempts        *prometheus.CounterVec
	attemptsPerDel  prometheus.Histogram
	attemptDuration prometheus.Histogram
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		backlog: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kasa_relay_backlog",
			Help: "Unpublished outbox rows, as of the relay's last poll (outbox_backlog).",
		}),
		oldestAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kasa_relay_oldest_unpublished_age_seconds",
			Help: "Age of the oldest unpublished outbox row at the relay's last poll; 0 when none.",
		}),
		publishLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kasa_outbox_publish_latency_seconds",
			Help:    "From the outbox row's commit to the broker's acknowledgement of its message.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kasa_outbox_published_total",
			Help: "Outbox rows published and marked.",
		}),
		republished: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kasa_outbox_republished_total",
			Help: "Published events published again because the webhook consumer's inbox still lacked them (the broker may have lost them).",
		}),
		gaveUp: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kasa_outbox_redelivery_given_up_total",
			Help: "Published events the webhook consumer's inbox still lacked when the relay stopped publishing them again.",
		}),
		relayErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kasa_relay_errors_total",
			Help: "Relay failures by stage (batch, purge, backlog, redeliver); the relay retries.",
		}, []string{"stage"}),
		purged: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kasa_events_purged_total",
			Help: "Rows deleted by retention, by table (outbox, inbox, webhook_deliveries).",
		}, []string{"table"}),
		consumed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kasa_webhook_events_consumed_total",
			Help: "Broker messages the webhook consumer handled, by result (pending, skipped, duplicate, orphan, ignored, invalid, unknown: names no outbox event, error), and earlier events of an aggregate recorded ahead of their messages (from_outbox).",
		}, []string{"result"}),
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kasa_webhook_deliveries_total",
			Help: "Webhook deliveries that reached a final outcome (delivered, failed after retries, skipped: no webhook URL).",
		}, []string{"outcome"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kasa_webhook_attempts_total",
			Help: "Webhook send attempts by result (2xx, non_2xx, timeout, error, refused: the address policy, aborted).",
		}, []string{"result"}),
		attemptsPerDel: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kasa_webhook_attempts_per_delivery",
			Help: "Attempts a delivery took to reach delivered or failed.",
			// 72 hours of retries are about a hundred attempts, and up to ~150.
			Buckets: []float64{1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233},
		}),
		attemptDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kasa_webhook_attempt_duration_seconds",
			Help:    "Duration of one webhook send attempt, whatever its result.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
		}),
	}
	reg.MustRegister(m.backlog, m.oldestAge, m.publishLatency, m.published, m.republished, m.gaveUp, m.relayErrors, m.purged,
		m.consumed, m.deliveries, m.attempts, m.attemptsPerDel, m.attemptDuration)
	return m
}

// unregistered is what a component uses when it was given no Metrics.
func unregistered() *Metrics { return NewMetrics(prometheus.NewRegistry()) }
