package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/reconcile"
)

// An import stopped half-way (its settlements wait for a worker that is gone) changes nothing it
// did not finish and records no run: kasa reconcile sent SIGTERM exits 3 at once, saying so; an
// admin import stops when its API starts shutting down and answers 503 unavailable (import
// again), no report of settlements that never ran. The same file imported again, once the worker
// is back, finishes the job, each payment settled once.
func TestReconcileStoppedMidImport(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newCrashStack(t, crashConfig{capability: "none", syncWait: "300ms"})
	window := []string{"KASA_PROVIDER_BOOKING_WINDOW", "1s"}
	s.startBanksim()
	s.worker = startProc(t, s.dir, s.bin, "worker", s.env(window...), "worker")
	s.startAPI(window...)
	m := s.merchant()
	acct := s.account(m, "TRY", "100.00")
	unknown := func(key, fault string) string {
		s.setFaults(`{"rules":[{"on":"charge","action":"` + fault + `","count":1}]}`)
		r, err := s.pay(m, key, payBody(key, "10.00", "TRY", acct))
		require.NoError(t, err)
		id := r.json(t)["id"].(string)
		require.Equal(t, "unknown", s.waitPayment(m, id, time.Now().Add(20*time.Second))["status"])
		return id
	}
	charged := []string{unknown("charged-1", "drop_response"), unknown("charged-2", "drop_response")}
	notCharged := []string{unknown("not-charged-1", "error_500"), unknown("not-charged-2", "error_500")}
	time.Sleep(1500 * time.Millisecond) // past the booking window
	// The bank's file for today, complete as of now, for every merchant: the two charges it made.
	csv := s.mustCall("GET", s.simURL()+"/v1/settlements/"+time.Now().UTC().Format(time.DateOnly)+".csv", "", "")
	require.Equal(t, 200, csv.Status)
	file := filepath.Join(s.dir, "settlement.csv")
	require.NoError(t, os.WriteFile(file, csv.Body, 0o644))
	unchanged := func(what string) {
		t.Helper()
		for _, id := range append(append([]string{}, charged...), notCharged...) {
			p, err := s.st.Payment(ctx, mustUUID(t, id))
			require.NoError(t, err)
			require.Equal(t, payment.StatusUnknown, p.Status, "%s: %s", what, id)
		}
		a, err := s.st.Account(ctx, mustUUID(t, acct))
		require.NoError(t, err)
		require.Equal(t, int64(4000), a.Reserved, "%s: every hold kept", what)
		totals, err := s.st.ReconcileTotals(ctx)
		require.NoError(t, err)
		require.Zero(t, totals.Runs, "%s: no run recorded", what)
	}

	s.worker.terminate() // no worker takes a settlement: the import waits on its first ones

	cmd := exec.Command(s.bin, "reconcile", "--json", file)
	var out bytes.Buffer
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = s.dir, s.env(window...), &out, &out
	require.NoError(t, cmd.Start())
	time.Sleep(3 * time.Second)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	stopped := time.Now()
	err := cmd.Wait()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "%s", out.String())
	require.Equal(t, 3, exit.ExitCode(), "%s", out.String())
	require.Less(t, time.Since(stopped), 5*time.Second, "it stops at once")
	require.Contains(t, out.String(), "could not finish (what was settled stays settled; run it again)")
	unchanged("kasa reconcile stopped")

	type answer struct {
		r   response
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		r, err := httpCall("POST", s.apiURL()+"/admin/v1/settlements", adminToken, string(csv.Body), "Content-Type", "text/csv")
		answered <- answer{r, err}
	}()
	time.Sleep(3 * time.Second)
	require.NoError(t, syscall.Kill(s.api.pid(), syscall.SIGTERM))
	stopped = time.Now()
	select {
	case a := <-answered:
		// Like kasa reconcile's exit 3: could not finish, import again. Never a report of the
		// settlements its stop cut as settle_failed, nor the closed database's 500.
		require.NoError(t, a.err)
		requireProblem(t, a.r, 503, "unavailable")
		require.NotEmpty(t, a.r.Header.Get("Retry-After"))
		require.Less(t, time.Since(stopped), 5*time.Second, "it stops at once, not after the 10 s a request gets")
	case <-time.After(30 * time.Second):
		t.Fatal("the admin import was not cut when its API stopped")
	}
	select {
	case <-s.api.c.Done():
		require.NoError(t, s.api.c.Err(), "the API stops cleanly")
	case <-time.After(15 * time.Second):
		t.Fatal("the API did not stop")
	}
	log, err := os.ReadFile(s.api.log)
	require.NoError(t, err)
	log = log[s.api.from:]
	require.NotContains(t, string(log), "closed pool", "the import ended before the database was closed")
	require.NotContains(t, string(log), "client connection is closing", "and before Temporal's client was")
	unchanged("admin import cut")

	s.worker = startProc(t, s.dir, s.bin, "worker", s.env(window...), "worker")
	s.startAPI(window...)
	report := func() reconcile.Report {
		t.Helper()
		cmd := exec.Command(s.bin, "reconcile", "--json", file)
		var stderr bytes.Buffer
		cmd.Dir, cmd.Env, cmd.Stderr = s.dir, s.env(window...), &stderr
		got, err := cmd.Output()
		require.NoError(t, err, "%s%s", got, stderr.String())
		var rep reconcile.Report
		require.NoError(t, json.Unmarshal(got, &rep), "%s", got)
		return rep
	}
	// The cut imports' settlements never reached a workflow while no worker ran, but Temporal may
	// hand them over once one is back: a listed payment is then settled by them (pending
	// settling here), never twice.
	rep := report()
	require.Equal(t, 2, rep.Counts.ResolvedNotCharged, "%+v", rep.Resolved)
	require.Equal(t, 2, rep.Counts.ResolvedCharged+rep.Counts.Pending, "%+v", rep.Pending)
	for _, p := range rep.Pending {
		require.Equal(t, reconcile.ReasonSettling, p.Reason, "%+v", p)
	}
	for _, id := range charged {
		require.Eventually(t, func() bool { return s.payment(m, id)["status"] == "succeeded" }, 20*time.Second, 100*time.Millisecond)
		require.Equal(t, 1, s.simCount(id))
		c, err := pgx.Connect(ctx, s.dbURL)
		require.NoError(t, err)
		var n int
		require.NoError(t, c.QueryRow(ctx, `SELECT count(*) FROM ledger_postings WHERE kind = 'payment' AND reference = $1`, id).Scan(&n))
		require.NoError(t, c.Close(ctx))
		require.Equal(t, 1, n, "posted once")
	}
	for _, id := range notCharged {
		require.Equal(t, "failed", s.payment(m, id)["status"])
		require.Equal(t, string(payment.FailureDeclined), s.payment(m, id)["failure_code"])
		require.Zero(t, s.simCount(id))
	}
	balance, reserved := s.balances(m, acct)
	require.Equal(t, []string{"80.00", "0.00"}, []string{balance, reserved}, "the two charges captured, every hold gone")
	s.verify()
	require.Equal(t, reconcile.Counts{Matched: 2}, report().Counts, "once more: nothing moves")
	balance, reserved = s.balances(m, acct)
	require.Equal(t, []string{"80.00", "0.00"}, []string{balance, reserved})
}
