package outbox

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// A webhook URL may carry a token in its query string (some merchants authenticate kasa so):
// when the endpoint cannot be reached, neither the stored error, which operators and the admin
// API show, nor the logs repeat it.
func TestFailedWebhookHidesTheURLsQuery(t *testing.T) {
	ctx := context.Background()
	db := ownStore(t)
	b := newBroker(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := l.Addr().String()
	require.NoError(t, l.Close()) // nothing listens there: every attempt fails to connect
	const token = "tok_3f9a1c77e2"
	m := newMerchantIn(t, db, "http://"+closed+"/hooks?token="+token+"#frag")
	logs := &testkit.SyncBuffer{}
	startPipeline(t, b, pipelineOptions{relays: 1, store: db, sender: WebhookSenderOptions{
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}})
	pid := settleIn(t, db, m, false)

	var d store.Delivery
	require.Eventually(t, func() bool {
		ds, err := db.PaymentDeliveries(ctx, pid)
		if err != nil || len(ds) != 1 || ds[0].LastError == "" {
			return false
		}
		d = ds[0]
		return true
	}, 10*time.Second, 20*time.Millisecond)
	require.Contains(t, d.LastError, "connection refused", "the stored error still says what went wrong")
	require.Contains(t, d.LastError, closed+"/hooks", "and where")
	require.NotContains(t, d.LastError, token)
	for _, a := range d.Attempts {
		require.NotContains(t, a.Error, token)
	}
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "will retry") }, 5*time.Second, 20*time.Millisecond)
	require.NotContains(t, logs.String(), token)
}

func TestRedactURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"https://m.example/hooks", "https://m.example/hooks"},
		{"https://m.example/hooks?token=abc&x=1", "https://m.example/hooks?…"},
		{"https://m.example/hooks#sig=abc", "https://m.example/hooks"},
		{"https://m.example/hooks?", "https://m.example/hooks?…"},
		{"https://m.example/hooks?ids=1,2&token=abc", "https://m.example/hooks?…"},
		{"https://m.example/a,b/hooks?token=abc", "https://m.example/a,b/hooks?…"},
		{"https://u:pa,ss@h.example/x", "https://u:xxxxx@h.example/x"},
		{"nats://kasa:s3cret@nats-1:4222", "nats://kasa:xxxxx@nats-1:4222"},
		{"://\x7f", "(an unparsable URL)"},
	} {
		require.Equal(t, tc.want, RedactURL(tc.in), tc.in)
	}
	require.Equal(t, "nats://kasa:xxxxx@nats-1:4222,nats://kasa:xxxxx@nats-2:4222",
		redactURLs("nats://kasa:s3cret@nats-1:4222, nats://kasa:s3cret@nats-2:4222"), "KASA_NATS_URL's list")
}

// A broker that cannot be reached is reported without the password of KASA_NATS_URL.
func TestConnectErrorHidesThePassword(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	_, _, err = Connect("nats://kasa:pw_7d1e55@"+addr, "test", BrokerAuth{})
	require.Error(t, err)
	require.Contains(t, err.Error(), "nats://kasa:xxxxx@"+addr)
	require.NotContains(t, err.Error(), "pw_7d1e55")
}
