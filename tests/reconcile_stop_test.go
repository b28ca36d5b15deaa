package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/reconcile"
	"github.com/kasa-pay/kasa/tools/kasaapi"
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

// An admin client that leaves during an import of a large file (its connection closed, a timeout
// of its own) stops the import there, as a shutdown does: the settlements it made stay made, no
// further one is sent, no run is recorded, and the API logs that the client left, not a 500.
// The same file imported again settles the rest; every payment is settled and posted once.
func TestAdminImportStopsWhenTheClientLeaves(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newCrashStack(t, crashConfig{capability: "none", syncWait: "300ms"})
	s.startBanksim()
	s.startWorker()
	s.startAPI()
	// Two merchants: the first one's payments settle at once, the second one's wait on their rows
	// (locked below) while the client gives up.
	type side struct {
		m    merchant
		acct string
		ids  []string
	}
	sides := []*side{{}, {}}
	const settledFirst, waiting = 4, 16 // more waiting than the import sends at once (8)
	for i, sd := range sides {
		sd.m = s.merchant()
		sd.acct = s.account(sd.m, "TRY", "100.00")
		n := settledFirst
		if i == 1 {
			n = waiting
		}
		s.setFaults(fmt.Sprintf(`{"rules":[{"on":"charge","action":"drop_response","count":%d}]}`, n))
		for j := range n {
			key := fmt.Sprintf("left-%d-%d", i, j)
			r, err := s.pay(sd.m, key, payBody(key, "1.00", "TRY", sd.acct))
			require.NoError(t, err)
			sd.ids = append(sd.ids, r.json(t)["id"].(string))
		}
		for _, id := range sd.ids {
			require.Equal(t, "unknown", s.waitPayment(sd.m, id, time.Now().Add(20*time.Second))["status"])
		}
	}
	all := append(append([]string{}, sides[0].ids...), sides[1].ids...)

	// The bank's file for today, its lines in the order above: the first merchant's first.
	csv := s.mustCall("GET", s.simURL()+"/v1/settlements/"+time.Now().UTC().Format(time.DateOnly)+".csv", "", "")
	require.Equal(t, 200, csv.Status)
	rows := strings.Split(strings.TrimSpace(string(csv.Body)), "\n")
	byRef := map[string]string{}
	var rest []string
	for _, row := range rows[1:] {
		if f := strings.Split(row, ","); len(f) >= 3 && slices.Contains(all, f[2]) {
			byRef[f[2]] = row
			continue
		}
		rest = append(rest, row)
	}
	require.Len(t, byRef, len(all), "%s", csv.Body)
	file := []string{rows[0]}
	for _, id := range all {
		file = append(file, byRef[id])
	}
	file = append(file, rest...)
	body := strings.Join(file, "\n") + "\n"

	c, err := pgx.Connect(ctx, s.dbURL)
	require.NoError(t, err)
	defer c.Close(ctx)
	lock, err := c.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(ctx) }()
	_, err = lock.Exec(ctx, `SELECT 1 FROM payments WHERE id = ANY($1::uuid[]) FOR UPDATE`, sides[1].ids)
	require.NoError(t, err)
	status := func(ids []string, want string) int {
		t.Helper()
		n := 0
		for _, id := range ids {
			p, err := s.st.Payment(ctx, mustUUID(t, id))
			require.NoError(t, err)
			if string(p.Status) == want {
				n++
			}
		}
		return n
	}

	cctx, leave := context.WithCancel(ctx)
	answered := make(chan error, 1)
	go func() {
		_, err := kasaapi.Do(cctx, testClient, "POST", s.apiURL()+"/admin/v1/settlements", adminToken, []byte(body), "Content-Type", "text/csv")
		answered <- err
	}()
	require.Eventually(t, func() bool { return status(sides[0].ids, "succeeded") == settledFirst }, 30*time.Second, 20*time.Millisecond,
		"the first merchant's lines are settled")
	time.Sleep(500 * time.Millisecond) // the second merchant's first lines are sent and wait
	leave()
	require.ErrorIs(t, <-answered, context.Canceled)
	time.Sleep(time.Second) // the import's end is logged
	require.NoError(t, lock.Rollback(ctx))

	// What the import sent before the client left may still land (its workflows were given the
	// settlements); what it never sent does not.
	require.Eventually(t, func() bool {
		return status(sides[1].ids, "succeeded")+status(sides[1].ids, "unknown") == waiting
	}, 30*time.Second, 50*time.Millisecond)
	time.Sleep(time.Second)
	require.GreaterOrEqual(t, status(sides[1].ids, "unknown"), waiting-8, "the import stopped mid-file: the lines after its first 8 were never sent")
	totals, err := s.st.ReconcileTotals(ctx)
	require.NoError(t, err)
	require.Zero(t, totals.Runs, "a stopped import records no run")
	log, err := os.ReadFile(s.api.log)
	require.NoError(t, err)
	log = log[s.api.from:]
	require.Contains(t, string(log), "settlement import stopped: the client left")
	require.NotContains(t, string(log), `msg="request failed"`, "not a 500")
	require.NotContains(t, string(log), "dependency unavailable")
	var audited int
	require.NoError(t, c.QueryRow(ctx, `SELECT status FROM admin_audit WHERE route = '/admin/v1/settlements' ORDER BY id DESC LIMIT 1`).Scan(&audited))
	require.Equal(t, 499, audited, "audited as the client closing its request")

	// The same file again (once more if a settlement of the stopped import was still landing).
	var rep reconcile.Report
	require.Eventually(t, func() bool {
		r := s.mustCall("POST", s.apiURL()+"/admin/v1/settlements", adminToken, body, "Content-Type", "text/csv")
		require.Equal(t, 200, r.Status, "%s", r.Body)
		rep = reconcile.Report{}
		require.NoError(t, json.Unmarshal(r.Body, &rep))
		return rep.Counts.Pending == 0
	}, 60*time.Second, 500*time.Millisecond)
	require.True(t, rep.OK(), "%+v", rep)
	require.Equal(t, len(all), rep.Counts.Matched+rep.Counts.ResolvedCharged)
	for _, sd := range sides {
		for _, id := range sd.ids {
			require.Equal(t, "succeeded", s.payment(sd.m, id)["status"])
			require.Equal(t, 1, s.simCount(id), "charged once at the bank")
			var n int
			require.NoError(t, c.QueryRow(ctx, `SELECT count(*) FROM ledger_postings WHERE kind = 'payment' AND reference = $1`, id).Scan(&n))
			require.Equal(t, 1, n, "posted once: %s", id)
		}
		balance, reserved := s.balances(sd.m, sd.acct)
		require.Equal(t, []string{fmt.Sprintf("%d.00", 100-len(sd.ids)), "0.00"}, []string{balance, reserved})
	}
	s.verify()
}
