package tests

// A Temporal that is not there yet, a namespace without kasa's search attributes, and TLS
// settings against a plain server: what the processes and `kasa migrate` do about each.

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kasa-pay/kasa/tools/testkit"
)

// waitLog waits until p's log contains s, failing if p exits first.
// waitLog waits until this process (not an earlier one of the name) has logged s.
func (p *proc) waitLog(s string, within time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(p.log)
		require.NoError(p.t, err)
		if strings.Contains(string(b[min(p.from, int64(len(b))):]), s) {
			return
		}
		p.requireRunning(p.t, "waiting for "+s+" in its log")
		time.Sleep(100 * time.Millisecond)
	}
	p.t.Fatalf("%s never logged %q\n%s", p.name, s, tailOf(p))
}

func tailOf(p *proc) string { return testkit.Tail(p.log, 30) }

// readyz returns /readyz's status and body.
func (s *crashStack) readyz() (int, map[string]string) {
	s.t.Helper()
	r, err := httpCall("GET", s.apiURL()+"/readyz", "", "")
	if err != nil {
		return 0, nil
	}
	var body map[string]string
	require.NoError(s.t, json.Unmarshal([]byte(r.Body), &body), "%s", r.Body)
	return r.Status, body
}

// TestWorkerWaitsForTemporal: a worker started before Temporal (nothing listens on its address)
// stays up, says why it waits, and serves payments once Temporal is there; SIGTERM during the wait
// ends it cleanly.
func TestWorkerWaitsForTemporal(t *testing.T) {
	t.Parallel()
	s := newCrashStack(t, crashConfig{ownTemporal: true})
	s.crashTemporal() // nothing listens on s.temporal now
	s.startBanksim()
	s.startWorker()
	s.api = startProc(t, s.dir, s.bin, "api", s.env(), "api")
	s.worker.waitLog("waiting for Temporal: unreachable", 15*time.Second)
	time.Sleep(2 * time.Second)
	s.worker.requireRunning(t, "while Temporal is away")
	s.api.requireRunning(t, "while Temporal is away")

	// A second worker told to stop while it waits ends at once, with exit 0.
	w2 := startProc(t, s.dir, s.bin, "worker2", s.env(), "worker")
	w2.waitLog("waiting for Temporal", 15*time.Second)
	require.NoError(t, syscall.Kill(w2.pid(), syscall.SIGTERM))
	select {
	case <-w2.c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a waiting worker did not stop within 5s of SIGTERM")
	}
	require.NoError(t, w2.c.Err(), "exit status of a worker stopped while waiting\n%s", tailOf(w2))

	s.startTemporal(context.Background())
	s.api.waitHTTP(s.apiURL() + "/readyz") // ready means the worker polls
	s.worker.waitLog("worker polling", 5*time.Second)
	m := s.merchant()
	acct := s.account(m, "TRY", "100.00")
	s.paySucceeds(m, "after-temporal", acct)
	balance, reserved := s.balances(m, acct)
	require.Equal(t, "90.00", balance)
	require.Equal(t, "0.00", reserved)
}

// TestNamespaceSetUpAfterKasa: on a namespace that does not exist yet the worker waits; once it
// exists without kasa's search attributes /readyz says so (every start would fail); `kasa
// migrate` registers them, twice without harm, and payments go through.
func TestNamespaceSetUpAfterKasa(t *testing.T) {
	t.Parallel()
	s := newCrashStack(t, crashConfig{})
	ns := "kasa-" + uuid.NewString()
	env := s.env("KASA_TEMPORAL_NAMESPACE", ns)
	s.startBanksim()
	s.worker = startProc(t, s.dir, s.bin, "worker", env, "worker")
	s.api = startProc(t, s.dir, s.bin, "api", env, "api")
	s.worker.waitLog("waiting for Temporal: namespace not found", 15*time.Second)

	// kasa migrate before the namespace exists: the database is migrated and the attributes
	// are left for a later run, and the warning names what is missing rather than calling a
	// Temporal that answered unreachable.
	migrateEnv := kasaEnv(map[string]string{
		"KASA_DATABASE_URL": s.dbURL, "KASA_TEMPORAL_ADDRESS": s.temporal, "KASA_TEMPORAL_NAMESPACE": ns,
	})
	out, code := runKasa(t, s.dir, s.bin, migrateEnv, "migrate")
	require.Zero(t, code, "kasa migrate:\n%s", out)
	require.Contains(t, out, "search attributes not checked (Temporal: namespace not found)", "%s", out)
	require.NotContains(t, out, "not reachable", "%s", out)

	ctx := context.Background()
	_, err := tc.WorkflowService().RegisterNamespace(ctx, &workflowservice.RegisterNamespaceRequest{
		Namespace: ns, WorkflowExecutionRetentionPeriod: durationpb.New(24 * time.Hour),
	})
	require.NoError(t, err)
	s.worker.waitLog("worker polling", 60*time.Second)

	// The worker polls, but the attributes are missing: not ready, and saying why.
	deadline := time.Now().Add(30 * time.Second)
	var status int
	var body map[string]string
	for time.Now().Before(deadline) {
		if status, body = s.readyz(); body["temporal"] == "ok" {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	require.Equal(t, http.StatusServiceUnavailable, status, "%v", body)
	require.Equal(t, map[string]string{"database": "ok", "temporal": "ok", "search_attributes": "missing"}, body)

	began := time.Now()
	out, code = runKasa(t, s.dir, s.bin, migrateEnv, "migrate")
	require.Zero(t, code, "kasa migrate:\n%s", out)
	registering := time.Since(began)
	require.Contains(t, out, "search attributes registered")
	resp, err := tc.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: ns})
	require.NoError(t, err)
	for _, name := range []string{"PaymentStatus", "MerchantId", "PaymentSummary"} {
		require.Equal(t, enumspb.INDEXED_VALUE_TYPE_KEYWORD, resp.GetCustomAttributes()[name], name)
	}
	began = time.Now()
	out, code = runKasa(t, s.dir, s.bin, migrateEnv, "migrate")
	require.Zero(t, code, "kasa migrate, again:\n%s", out)
	t.Logf("kasa migrate: %s registering the attributes (until usable), %s when they are there",
		registering.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
	require.NotContains(t, out, "search attributes registered", "nothing left to add")

	s.api.waitHTTP(s.apiURL() + "/readyz")
	m := s.merchant()
	acct := s.account(m, "TRY", "100.00")
	s.paySucceeds(m, "on-a-new-namespace", acct)
	balance, _ := s.balances(m, acct)
	require.Equal(t, "90.00", balance)
}

// TestMigrateRightAfterTheNamespaceIsRegistered: on a real Temporal Server, `kasa migrate` run
// at once after an operator registers the namespace (having run it once before, as the docs
// allow) registers the search attributes, although the server's operator service does not find
// a namespace it has just registered (nor, for a while, one it was asked about before) until its
// namespace cache is refreshed.
func TestMigrateRightAfterTheNamespaceIsRegistered(t *testing.T) {
	t.Parallel()
	address, _ := multiTemporal()
	s := newCrashStack(t, crashConfig{temporal: address, namespace: "default"})
	ns := "kasa-" + uuid.NewString()
	migrateEnv := kasaEnv(map[string]string{
		"KASA_DATABASE_URL": s.dbURL, "KASA_TEMPORAL_ADDRESS": address, "KASA_TEMPORAL_NAMESPACE": ns,
	})
	out, code := runKasa(t, s.dir, s.bin, migrateEnv, "migrate")
	require.Zero(t, code, "kasa migrate before the namespace exists:\n%s", out)
	require.Contains(t, out, "search attributes not checked (Temporal: namespace not found)", "%s", out)

	server, err := client.Dial(client.Options{HostPort: address, Logger: quietSDKLogger{}})
	require.NoError(t, err)
	defer server.Close()
	ctx := context.Background()
	_, err = server.WorkflowService().RegisterNamespace(ctx, &workflowservice.RegisterNamespaceRequest{
		Namespace: ns, WorkflowExecutionRetentionPeriod: durationpb.New(24 * time.Hour),
	})
	require.NoError(t, err)

	out, code = runKasa(t, s.dir, s.bin, migrateEnv, "migrate")
	require.Zero(t, code, "kasa migrate right after the namespace was registered:\n%s", out)
	require.Contains(t, out, "search attributes registered", "%s", out)
	resp, err := server.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: ns})
	require.NoError(t, err)
	for _, name := range []string{"PaymentStatus", "MerchantId", "PaymentSummary"} {
		require.Equal(t, enumspb.INDEXED_VALUE_TYPE_KEYWORD, resp.GetCustomAttributes()[name], name)
	}
}

// TestTLSToAPlainServerFailsClearly: TLS settings against a server that does not speak TLS are
// a mistake no wait mends: the worker exits at once and says what failed.
func TestTLSToAPlainServerFailsClearly(t *testing.T) {
	t.Parallel()
	s := newCrashStack(t, crashConfig{})
	w := startProc(t, s.dir, s.bin, "worker", s.env("KASA_TEMPORAL_TLS_SERVER_NAME", "localhost"), "worker")
	select {
	case <-w.c.Done():
	case <-time.After(30 * time.Second):
		t.Fatalf("the worker still runs 30s after a failed TLS handshake\n%s", tailOf(w))
	}
	require.Error(t, w.c.Err())
	log := tailOf(w)
	require.Contains(t, log, "kasa worker failed")
	require.Contains(t, log, "handshake", "the log says the TLS handshake failed")
}
