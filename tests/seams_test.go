package tests

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/reconcile"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// Deployed as docs/deployment.md says: the bank and the workers at capability none, the API left
// at its default (idempotent). The bank's answer to a charge and to a refund is lost: the
// worker's policy governs, so neither is sent again; both wait, unknown, for reconciliation.
func TestSplitCapabilityNeverResendsToABankWithoutIdempotency(t *testing.T) {
	t.Parallel()
	s := newCrashStack(t, crashConfig{capability: "none", syncWait: "300ms"})
	s.startBanksim()
	s.startWorker()
	s.startAPI("KASA_PROVIDER_CAPABILITY", "idempotent")
	m := s.merchant()
	acct := s.account(m, "TRY", "100.00")

	s.setFaults(`{"rules":[{"on":"charge","action":"drop_response","count":1}]}`)
	r, err := s.pay(m, "split-pay", payBody("split-pay", "10.00", "TRY", acct))
	require.NoError(t, err)
	require.Contains(t, []int{http.StatusAccepted}, r.Status, "%s", r.Body)
	id := r.json(t)["id"].(string)
	p := s.waitPayment(m, id, time.Now().Add(20*time.Second))
	require.Equal(t, "unknown", p["status"], "%v", p)
	time.Sleep(3 * time.Second) // an idempotent strategy would have re-sent within this
	require.Equal(t, 1, s.simCount(id), "the bank moved the money once")

	// A refund of another, paid payment: its answer lost too.
	s.setFaults(`{"rules":[]}`)
	r, err = s.pay(m, "split-paid", payBody("split-paid", "20.00", "TRY", acct))
	require.NoError(t, err)
	paid := s.waitPayment(m, r.json(t)["id"].(string), time.Now().Add(20*time.Second))
	require.Equal(t, "succeeded", paid["status"], "%v", paid)
	s.setFaults(`{"rules":[{"on":"refund","action":"drop_response","count":1}]}`)
	rf := s.mustCall("POST", s.apiURL()+"/v1/payments/"+paid["id"].(string)+"/refunds", m.APIKey, `{"amount":"5.00"}`, "Idempotency-Key", "split-refund")
	require.Equal(t, http.StatusAccepted, rf.Status, "%s", rf.Body)
	refundID := rf.json(t)["id"].(string)
	got := s.waitRefund(m, refundID, time.Now().Add(20*time.Second))
	require.Equal(t, "unknown", got["status"], "%v", got)
	time.Sleep(3 * time.Second)
	require.Equal(t, 1, s.simRefundCount(refundID), "the bank refunded once")
	balance, reserved := s.balances(m, acct)
	require.Equal(t, []string{"80.00", "10.00"}, []string{balance, reserved}, "the unknown payment keeps its hold")
	s.verify()

	// A second worker configured otherwise than the running one never polls: it exits at start,
	// naming both settings.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.bin, "worker")
	cmd.Dir, cmd.Env = s.dir, s.env("KASA_PROVIDER_CAPABILITY", "idempotent")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "%s", out)
	require.NotZero(t, exit.ExitCode())
	require.Contains(t, string(out), "runs with capability none", "%s", out)
	require.Contains(t, string(out), "configured with capability idempotent", "%s", out)
}

// kasa reconcile declares a file's scope: a one-merchant file imported without one releases
// nothing it does not list, and --merchant releases that merchant's unlisted unknown payments
// only; the other merchant's hold is kept.
func TestReconcileCLIScope(t *testing.T) {
	t.Parallel()
	s := newCrashStack(t, crashConfig{capability: "none", syncWait: "300ms"})
	window := []string{"KASA_PROVIDER_BOOKING_WINDOW", "1s"}
	s.startBanksim()
	s.worker = startProc(t, s.dir, s.bin, "worker", s.env(window...), "worker")
	s.startAPI(window...)
	unknown := func(m merchant, acct, key string) string {
		s.setFaults(`{"rules":[{"on":"charge","action":"drop_response","count":1}]}`)
		r, err := s.pay(m, key, payBody(key, "10.00", "TRY", acct))
		require.NoError(t, err)
		id := r.json(t)["id"].(string)
		require.Equal(t, "unknown", s.waitPayment(m, id, time.Now().Add(20*time.Second))["status"])
		return id
	}
	a, b := s.merchant(), s.merchant()
	acctA, acctB := s.account(a, "TRY", "100.00"), s.account(b, "TRY", "100.00")
	idA, idB := unknown(a, acctA, "scope-a"), unknown(b, acctB, "scope-b")
	time.Sleep(1500 * time.Millisecond) // past the booking window

	// The bank's file for today, with neither payment on it: complete as of now.
	day := time.Now().UTC().Format("2006-01-02")
	var f strings.Builder
	require.NoError(t, reconcile.Write(&f, nil, reconcile.Trailer{Day: reconcile.Day(day), AsOf: time.Now().UTC()}))
	file := filepath.Join(s.dir, "settlement.csv")
	require.NoError(t, os.WriteFile(file, []byte(f.String()), 0o644))

	out, code := runKasa(t, s.dir, s.bin, s.env(window...), "reconcile", "--json", file)
	require.Equal(t, 0, code, "%s", out)
	require.Contains(t, out, reconcile.ReasonScopeNotDeclared, "%s", out)
	for _, c := range []struct {
		m  merchant
		id string
	}{{a, idA}, {b, idB}} {
		require.Equal(t, "unknown", s.payment(c.m, c.id)["status"], "no scope: nothing released")
	}

	out, code = runKasa(t, s.dir, s.bin, s.env(window...), "reconcile", "--merchant", a.ID, file)
	require.Equal(t, 0, code, "%s", out)
	require.Equal(t, "failed", s.waitPayment(a, idA, time.Now().Add(20*time.Second))["status"], "released: not charged")
	require.Equal(t, "unknown", s.payment(b, idB)["status"], "another merchant's hold is kept")
	_, reservedB := s.balances(b, acctB)
	require.Equal(t, "10.00", reservedB)

	out, code = runKasa(t, s.dir, s.bin, s.env(window...), "reconcile", "--merchant", a.ID, "--all-merchants", file)
	require.Equal(t, 2, code, "%s", out)
	s.verify()
}

// kasa reconcile and kasa verify touch no secret, and docs/reconciliation.md runs them without
// KASA_SECRET_KEY: they neither record a key as the deployment's (which would lock the API and
// workers out) nor are refused for lacking the one recorded.
func TestReconcileAndVerifyNeedNoSecretKey(t *testing.T) {
	t.Parallel()
	s := newCrashStack(t, crashConfig{})
	day := time.Now().UTC().Format("2006-01-02")
	var f strings.Builder
	require.NoError(t, reconcile.Write(&f, nil, reconcile.Trailer{Day: reconcile.Day(day), AsOf: time.Now().UTC()}))
	file := filepath.Join(s.dir, "settlement.csv")
	require.NoError(t, os.WriteFile(file, []byte(f.String()), 0o644))
	noKey := s.env("KASA_SECRET_KEY", "")

	out, code := runKasa(t, s.dir, s.bin, noKey, "reconcile", "--json", file)
	require.Equal(t, 0, code, "before any other process: %s", out)

	s.startBanksim()
	s.startWorker()
	s.startAPI()
	m := s.merchant() // the API seals its webhook secret under the deployment's key
	require.NotEmpty(t, m.ID)

	out, code = runKasa(t, s.dir, s.bin, noKey, "reconcile", "--json", file)
	require.Equal(t, 0, code, "beside the API and the worker: %s", out)
	out, code = runKasa(t, s.dir, s.bin, noKey, "verify")
	require.Equal(t, 0, code, "%s", out)
	s.merchant()
}

// kasa dev pointed at a deployment's database and Temporal (KASA_DATABASE_URL,
// KASA_TEMPORAL_ADDRESS) joins its task queue like any worker: configured otherwise than the
// deployment's live worker, it exits at start naming both settings, and never polls.
func TestDevBesideADeploymentClaimsItsMoneySettings(t *testing.T) {
	t.Parallel()
	s := newCrashStack(t, crashConfig{capability: "none"})
	s.startBanksim()
	s.startWorker()
	s.startAPI() // ready once the worker polls, after it claimed its settings

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.bin, "dev")
	cmd.Dir = s.dir
	cmd.Env = s.env("KASA_PROVIDER_CAPABILITY", "idempotent", "KASA_DATA_DIR", filepath.Join(s.dir, "dev"),
		"KASA_API_ADDR", testkit.FreeAddr(t), "KASA_BANKSIM_ADDR", testkit.FreeAddr(t))
	out, err := cmd.CombinedOutput()
	require.NoError(t, ctx.Err(), "kasa dev ran beside a worker configured otherwise:\n%s", out)
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "%s", out)
	require.NotZero(t, exit.ExitCode())
	require.Contains(t, string(out), "runs with capability none", "%s", out)
	require.Contains(t, string(out), "configured with capability idempotent", "%s", out)
}

// A worker that cannot start (its metrics port is taken) records no money settings: a worker
// configured otherwise starts at once, not blocked for a minute by one that never polled.
func TestWorkerThatCannotStartRecordsNoSettings(t *testing.T) {
	t.Parallel()
	s := newCrashStack(t, crashConfig{capability: "none"})
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	out, code := runKasa(t, s.dir, s.bin, s.env("KASA_WORKER_METRICS_ADDR", taken.Addr().String()), "worker")
	require.NotZero(t, code, "%s", out)
	require.Contains(t, out, "KASA_WORKER_METRICS_ADDR", "%s", out)

	w := startProc(t, s.dir, s.bin, "worker-idempotent", s.env("KASA_PROVIDER_CAPABILITY", "idempotent"), "worker")
	time.Sleep(3 * time.Second)
	w.requireRunning(t, "a worker configured otherwise, after one that never polled")
}

// A worker stalled past the live window (a paused VM) is not a stopped one: a worker configured
// otherwise is still refused, as the deployment's settings are the stalled one's; a change made
// on purpose (--change-money-settings) is taken, and the stalled worker, once it runs again,
// stops at its next report instead of working on with the old settings beside the new.
func TestStalledWorkerKeepsAndThenLosesTheDeploymentsSettings(t *testing.T) {
	t.Parallel()
	s := newCrashStack(t, crashConfig{capability: "none"})
	s.startBanksim()
	s.startWorker()
	s.worker.waitLog("worker polling", time.Minute)
	require.NoError(t, syscall.Kill(s.worker.pid(), syscall.SIGSTOP))
	// Two minutes of silence, without waiting them out.
	_, err := connect(t, s.dbURL).Exec(context.Background(), `UPDATE worker_policies SET last_seen = last_seen - interval '2 minutes' WHERE task_queue = $1`, s.queue)
	require.NoError(t, err)

	idem := s.env("KASA_PROVIDER_CAPABILITY", "idempotent", "KASA_WORKER_METRICS_ADDR", "")
	out, code := runKasa(t, s.dir, s.bin, idem, "worker")
	require.NotZero(t, code, "a worker configured otherwise started while the deployment's worker was stalled:\n%s", out)
	require.Contains(t, out, "money settings on task queue", "%s", out)
	require.Contains(t, out, "are capability none", "%s", out)
	require.Contains(t, out, "configured with capability idempotent", "%s", out)
	require.Contains(t, out, "--change-money-settings", "%s", out)

	changed := startProc(t, s.dir, s.bin, "worker-changed", idem, "worker", "--change-money-settings")
	changed.waitLog("worker polling", time.Minute)
	require.NoError(t, syscall.Kill(s.worker.pid(), syscall.SIGCONT))
	select {
	case <-s.worker.c.Done():
	case <-time.After(time.Minute):
		t.Fatalf("the stalled worker works on beside the changed settings\n%s", tailOf(s.worker))
	}
	require.Error(t, s.worker.c.Err(), "the stalled worker must exit non-zero")
	require.Contains(t, testkit.Tail(s.worker.log, 20), "money settings changed while this worker did not report")
	time.Sleep(time.Second)
	changed.requireRunning(t, "the worker with the changed settings")
}
