package tests

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/tools/devenv"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// `kasa relay` as its own process, with its embedded broker under the data dir: payments made
// while it is SIGKILLed are announced once it is back, every payment's event reaches the
// merchant (at least once, each with one event id), and SIGTERM stops it cleanly.
func TestRelayProcessSurvivesKillAndStopsOnSIGTERM(t *testing.T) {
	t.Parallel()
	s := newCrashStack(t, crashConfig{capability: "idempotent"})
	s.start()
	relay, relayEnv, metricsAddr := s.startRelay()

	hook := newSink(t)
	r := s.mustCall("POST", s.apiURL()+"/admin/v1/merchants", adminToken, fmt.Sprintf(`{"name":"Relay","webhook_url":%q}`, hook.URL))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	m := merchant{ID: r.json(t)["id"].(string), APIKey: r.json(t)["api_key"].(string)}
	acct := s.account(m, "TRY", "100.00")

	pay := func(i int) string {
		r, err := s.pay(m, fmt.Sprintf("relay-%d", i), payBody(fmt.Sprintf("inv-relay-%d", i), "1.00", "TRY", acct))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		return r.json(t)["id"].(string)
	}
	eventsOf := func() map[string]map[string]bool { // payment id -> event ids received
		out := map[string]map[string]bool{}
		for _, req := range hook.Requests() {
			w := testkit.DecodeWebhook(t, req.Body)
			if out[w.Data.ID] == nil {
				out[w.Data.ID] = map[string]bool{}
			}
			out[w.Data.ID][w.ID] = true
		}
		return out
	}

	ids := []string{pay(0), pay(1)}
	require.Eventually(t, func() bool { return len(eventsOf()) == 2 }, 30*time.Second, 50*time.Millisecond)

	relay.kill()
	ids = append(ids, pay(2), pay(3), pay(4))
	time.Sleep(500 * time.Millisecond)
	require.Len(t, eventsOf(), 2, "nothing is announced while the relay is down")

	relay = startProc(t, s.dir, s.bin, "relay", relayEnv, "relay")
	require.Eventually(t, func() bool { return len(eventsOf()) == 5 }, 60*time.Second, 50*time.Millisecond,
		"every payment is announced once the relay is back\n%s", testkit.Tail(relay.log, 30))
	for _, id := range ids {
		require.Len(t, eventsOf()[id], 1, "payment %s: one event id however often it is delivered", id)
		require.Equal(t, 1, s.simCount(id))
	}
	metrics := s.mustCall("GET", "http://"+metricsAddr+"/metrics", "", "")
	require.Contains(t, string(metrics.Body), "kasa_outbox_published_total")

	relay.terminate()
	require.NoError(t, relay.c.Err(), "kasa relay exits 0 on SIGTERM\n%s", testkit.Tail(relay.log, 30))
	s.verify()
}

// `kasa relay` started while its NATS cannot be reached waits for it, as the worker waits for
// Temporal: it logs why, retries, and runs once NATS is there; SIGTERM during the wait ends it
// cleanly.
func TestRelayWaitsForNATS(t *testing.T) {
	t.Parallel()
	s := newCrashStack(t, crashConfig{})
	natsPort, err := devenv.FreePort()
	require.NoError(t, err)
	metricsAddr := testkit.FreeAddr(t)
	env := s.env("KASA_NATS_URL", fmt.Sprintf("nats://127.0.0.1:%d", natsPort), "KASA_RELAY_METRICS_ADDR", metricsAddr)

	stopped := startProc(t, s.dir, s.bin, "relay-stopped", env, "relay")
	stopped.waitLog("waiting for NATS: unreachable", 30*time.Second)
	stopped.stopCleanly(15 * time.Second)

	relay := startProc(t, s.dir, s.bin, "relay", env, "relay")
	relay.waitLog("waiting for NATS: unreachable", 30*time.Second)
	bin, err := devenv.FindTool("nats-server", "nats-server")
	require.NoError(t, err)
	monitor, err := devenv.FreePort()
	require.NoError(t, err)
	nats, err := devenv.StartNATS(context.Background(), devenv.NewSupervisor(s.dir, nil), bin, filepath.Join(s.dir, "nats"), natsPort, monitor)
	require.NoError(t, err)
	t.Cleanup(func() { nats.Stop(5 * time.Second) })
	relay.waitHTTP("http://" + metricsAddr + "/healthz")
	relay.stopCleanly(15 * time.Second)
}
