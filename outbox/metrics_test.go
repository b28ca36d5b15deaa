package outbox

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// A delivery that fails after its retries (docs/webhooks.md: the delay doubling up to 30–60
// minutes, for 72 hours) takes about a hundred attempts. kasa_webhook_attempts_per_delivery must
// have a bucket above the most it can take: a count past the last bucket falls in +Inf, and
// histogram_quantile then answers the last bucket's bound, not the attempts the dashboard asks for.
func TestAttemptsPerDeliveryBucketsHoldAFailedDelivery(t *testing.T) {
	t.Parallel()
	s := NewWebhookSender(WebhookSenderOptions{})
	// The most attempts: every delay the shortest the jitter allows, half the doubling's.
	attempts, at := 1, time.Duration(0)
	for {
		full := s.o.BackoffMax
		if b := s.o.BackoffBase << (attempts - 1); attempts < 40 && b > 0 && b < full {
			full = b
		}
		if at+full/2 > s.o.RetryFor {
			break
		}
		at += full / 2
		attempts++
	}
	require.Greater(t, attempts, 89, "72 hours of retries")

	reg := prometheus.NewRegistry()
	NewMetrics(reg)
	families, err := reg.Gather()
	require.NoError(t, err)
	var top float64
	for _, f := range families {
		if f.GetName() == "kasa_webhook_attempts_per_delivery" {
			for _, b := range f.GetMetric()[0].GetHistogram().GetBucket() {
				top = max(top, b.GetUpperBound())
			}
		}
	}
	require.GreaterOrEqualf(t, top, float64(attempts), "a failed delivery takes up to %d attempts", attempts)
}
