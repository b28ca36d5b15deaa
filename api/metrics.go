package api

import (
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

type metrics struct {
	httpDuration *prometheus.HistogramVec
	idempotency  *prometheus.CounterVec
	paymentTime  prometheus.Histogram
	conflicts    *prometheus.CounterVec
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
			Help: "POST /v1/payments by idempotency outcome (new, replayed, in_use, reused, duplicate_payment, unknown, taken_over); duplicate_ratio = non-new / all.",
		}, []string{"outcome"}),
		paymentTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kasa_payment_sync_duration_seconds",
			Help:    "Time from a new payment request to its final answer, for payments answered synchronously.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
		}),
	}
	m.conflicts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kasa_unique_conflicts_total",
		Help: "Unique-constraint conflicts that decided a race (idempotency key, business key); a spike means a retry storm or a faulty client.",
	}, []string{"constraint"})
	r.MustRegister(m.httpDuration, m.idempotency, m.paymentTime, m.conflicts,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (s *Server) observe(c *gin.Context) {
	start := time.Now()
	c.Next()
	route := c.FullPath()
	if route == "" {
		route = "unmatched"
	}
	s.metrics.httpDuration.WithLabelValues(route, c.Request.Method, strconv.Itoa(c.Writer.Status())).Observe(time.Since(start).Seconds())
}
