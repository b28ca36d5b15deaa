package tests

import (
	"context"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/tools/devenv"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// kasa on a Temporal Server that requires mutual TLS, as docker-compose.yml runs it: the worker
// and the API connect with KASA_TEMPORAL_TLS_CERT/KEY/CA/SERVER_NAME and a payment goes
// through; a worker without a client certificate is refused and says so.
func TestTemporalWithMutualTLS(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ca := testkit.NewCA(t, "kasa temporal CA")
	serverCert, serverKey := ca.Issue(t, "temporal", "temporal", "127.0.0.1")
	clientCert, clientKey := ca.Issue(t, "kasa")
	dir := t.TempDir()
	pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: filepath.Join(dir, "pg"), Ephemeral: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pg.Stop() })
	ts, err := devenv.StartTemporalServer(ctx, pg, devenv.TemporalServerOptions{Dir: filepath.Join(dir, "temporal"),
		TLS: &devenv.TemporalTLS{CA: ca.File, Cert: serverCert, Key: serverKey, ServerName: "temporal"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ts.Stop() })

	s := newCrashStack(t, crashConfig{temporal: ts.Address()})
	tlsEnv := []string{"KASA_TEMPORAL_TLS_CA", ca.File, "KASA_TEMPORAL_TLS_SERVER_NAME", "temporal"}
	withCert := append([]string{"KASA_TEMPORAL_TLS_CERT", clientCert, "KASA_TEMPORAL_TLS_KEY", clientKey}, tlsEnv...)

	refused := startProc(t, s.dir, s.bin, "worker-without-cert", s.env(tlsEnv...), "worker")
	select {
	case <-refused.c.Done():
	case <-time.After(60 * time.Second):
		t.Fatalf("a worker without a client certificate still runs after 60s\n%s", tailOf(refused))
	}
	require.Contains(t, tailOf(refused), "kasa worker failed")
	require.Contains(t, tailOf(refused), "certificate required", "the log says what the server refused")

	s.startBanksim()
	s.worker = startProc(t, s.dir, s.bin, "worker", s.env(withCert...), "worker")
	s.startAPI(withCert...)
	m := s.merchant()
	acct := s.account(m, "TRY", "100.00")
	r, err := s.pay(m, "over-mtls", payBody("inv-mtls", "10.00", "TRY", acct))
	require.NoError(t, err)
	if r.Status == http.StatusAccepted {
		p := s.waitPayment(m, r.json(t)["id"].(string), time.Now().Add(30*time.Second))
		require.Equal(t, "succeeded", p["status"], "%v", p)
	} else {
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	}
	require.Equal(t, 1, s.simCount(r.json(t)["id"].(string)), "charged once at the bank")
}
