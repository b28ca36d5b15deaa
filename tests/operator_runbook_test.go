package tests

import (
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/workflows"
)

// operatorCLI runs the temporal CLI as an operator types it, giving up after 20 s rather than
// waiting for a worker that never comes.
func operatorCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return temporalCLI(t, append(args, "--command-timeout", "20s")...)
}

// settleByHand sends the settle update with the CLI as reconciliation.md (section 3) says, again
// while the run answers that it knows no such update: its first workflow task, which registers
// the handlers, has not run yet.
func settleByHand(t *testing.T, wfID, settlement string) (string, error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := operatorCLI(t, "workflow", "update", "execute", "--workflow-id", wfID, "--name", "settle", "--input", settlement)
		if err == nil || !strings.Contains(out, "unknown update settle") || time.Now().After(deadline) {
			return out, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// A payment whose workflow was terminated by mistake before the workflows moved to another task
// queue (deployment.md, "Settings the processes share"): the operator moved them as the docs
// say, and stopped the old queue's worker once no run was left there. The reset of
// operations.md ("Stuck payments", step 4) runs the payment again where its first run ran, on
// the old queue: the docs must say how to get it run, and that must work.
func TestOperatorResetsAPaymentLeftOnAQueueTheWorkersLeft(t *testing.T) {
	t.Parallel()
	s := newCrashStack(t, crashConfig{capability: string(workflows.CapabilityNone)})
	s.start()
	m := s.merchant()
	acct := s.account(m, "TRY", "100.00")
	s.setFaults(`{"rules":[{"on":"charge","action":"drop_response","count":1}]}`)
	r, err := s.pay(m, "moved-unknown", payBody("inv-moved-unknown", "40.00", "TRY", acct))
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	id := r.json(t)["id"].(string)
	require.Equal(t, "unknown", s.waitPayment(m, id, time.Now().Add(30*time.Second))["status"])
	wfID := workflows.PaymentWorkflowID(mustUUID(t, m.ID), "moved-unknown")
	require.Eventually(t, func() bool { return lastWorkflowTask(t, wfID) != 0 }, 10*time.Second, 50*time.Millisecond)
	out, err := operatorCLI(t, "workflow", "terminate", "--workflow-id", wfID, "--reason", "by mistake")
	require.NoError(t, err, out)

	// The move: workers on the new queue, then the APIs, then the old queue's worker goes once
	// the Web UI's query lists no run left there.
	old := s.queue
	s.queue = "moved-" + uuid.NewString()
	startProc(t, s.dir, s.bin, "worker-moved", s.env(), "worker")
	s.api.terminate()
	s.startAPI()
	out, err = operatorCLI(t, "workflow", "list", "--query", `TaskQueue="`+old+`" AND ExecutionStatus="Running"`)
	require.NoError(t, err, out)
	require.NotContains(t, out, wfID, "no run is left on the old queue")
	s.worker.stopCleanly(30 * time.Second)

	// Stuck payments, step 4.
	out, err = operatorCLI(t, "workflow", "reset", "-w", wfID, "--type", "LastWorkflowTask", "--reason", "terminated by mistake")
	require.NoError(t, err, out)
	// The new run is on its first run's queue, which the workers left: a worker goes there
	// until the run closes.
	out, err = operatorCLI(t, "workflow", "describe", "-w", wfID)
	require.NoError(t, err, out)
	require.Regexp(t, `TaskQueue\s+`+old, out, "describe names the run's task queue")
	oldWorker := startProc(t, s.dir, s.bin, "worker-old", s.env("KASA_TEMPORAL_TASK_QUEUE", old), "worker")

	// The run waits for its settlement as before, the hold kept; the bank's word settles it
	// (reconciliation.md, section 3).
	settle := `{"outcome":"charged","operation_id":"` + id + `","note":"bank ticket"}`
	out, err = settleByHand(t, wfID, settle)
	require.NoError(t, err, "the reset run takes its settlement:\n%s", out)
	require.Contains(t, out, "succeeded")
	got, err := s.st.Payment(t.Context(), mustUUID(t, id))
	require.NoError(t, err)
	require.Equal(t, payment.StatusSucceeded, got.Status)
	balance, held := s.balances(m, acct)
	require.Equal(t, []string{"60.00", "0.00"}, []string{balance, held})
	require.Equal(t, 1, s.simCount(id), "the bank charged once")
	s.verify()
	out, err = operatorCLI(t, "workflow", "list", "--query", `TaskQueue="`+old+`" AND ExecutionStatus="Running"`)
	require.NoError(t, err, out)
	require.NotContains(t, out, wfID, "the run closed: the old queue's worker may go")
	oldWorker.stopCleanly(30 * time.Second)
}

// stuckPaymentsSQL is step 1 of operations.md's "Stuck payments", as an operator pastes it.
const stuckPaymentsSQL = `SELECT id, merchant_id, idempotency_key, status, stuck_since, stuck_reason FROM payments
   WHERE stuck_since IS NOT NULL UNION SELECT p.id, p.merchant_id, p.idempotency_key, p.status,
   p.stuck_since, p.stuck_reason FROM idempotency_records r JOIN payments p ON p.id = r.operation_id
   WHERE r.status <> 'completed' AND r.scope = 'payment' AND p.status = 'processing'
   AND p.created_at < now() - interval '1 hour';`

// psql runs a query with psql on the package's database, one row a line, columns split by |.
func psql(t *testing.T, query string) string {
	t.Helper()
	out, err := exec.Command("psql", env.DatabaseURL, "-At", "-c", query).CombinedOutput()
	require.NoError(t, err, "%s", out)
	return string(out)
}

// The stuck-payment runbook (operations.md, "Stuck payments" and "A settlement that contradicts
// the bank") with the commands it shows: a not_charged settlement meets the bank's charge; the
// operator finds the payment in the UI's list and with the SQL, reads why, and, the bank's
// record holding the charge, signals retry: with inquiry the retry asks the bank again and books
// the charge once.
func TestOperatorRetriesAPaymentASettlementHeldAgainstTheBank(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityInquiry)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	s.setFaults(`{"rules":[{"on":"charge","action":"drop_response","count":1},{"on":"inquiry","action":"error_503"}]}`)
	r := s.pay(m, "held", payBody("inv-held", "40.00", "TRY", acct))
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	id := r.json(t)["id"].(string)
	require.Eventually(t, func() bool { return paymentByKey(t, m, "held").Status == payment.StatusUnknown },
		60*time.Second, 20*time.Millisecond)
	s.setFaults(`{"rules":[]}`) // the bank answers again
	wfID := workflows.PaymentWorkflowID(mustUUID(t, m.ID), "held")

	out, err := settleByHand(t, wfID, `{"outcome":"not_charged","operation_id":"`+id+`","note":"not in the file"}`)
	require.Error(t, err, "the bank's charge is not overruled: %s", out)
	require.Contains(t, out, "contradicts the bank")

	// 1. Find it.
	list := `PaymentStatus="stuck" AND ExecutionStatus="Running" AND MerchantId="` + m.ID + `"`
	require.Eventually(t, func() bool {
		out, err := operatorCLI(t, "workflow", "list", "--query", list)
		return err == nil && strings.Contains(out, wfID)
	}, 20*time.Second, 200*time.Millisecond, "the UI's list shows it")
	rows := psql(t, stuckPaymentsSQL)
	require.Contains(t, rows, id, "the runbook's SQL finds it")
	// 2. Read why.
	row := rows[strings.Index(rows, id):]
	row = row[:strings.IndexByte(row, '\n')]
	require.Contains(t, row, "|unknown|")
	require.Contains(t, row, "contradicts the bank")
	require.Equal(t, "40.00", s.account(m, acct)["reserved"], "the hold is kept")

	// 4. The bank confirms the charge stands: retry.
	out, err = operatorCLI(t, "workflow", "signal", "--workflow-id", wfID, "--name", "retry")
	require.NoError(t, err, out)
	require.Eventually(t, func() bool { return paymentByKey(t, m, "held").Status == payment.StatusSucceeded },
		30*time.Second, 50*time.Millisecond, "the retry asks the bank and books its charge")
	a := s.account(m, acct)
	require.Equal(t, []any{"60.00", "0.00"}, []any{a["balance"], a["reserved"]})
	require.Equal(t, 1, s.simCount(id), "the bank charged once")
	require.Equal(t, 1, postingsOf(t, "payment", id), "posted once")
	require.NotContains(t, psql(t, stuckPaymentsSQL), id, "no longer stuck")
	require.Eventually(t, func() bool {
		out, err := operatorCLI(t, "workflow", "list", "--query", list)
		return err == nil && !strings.Contains(out, wfID)
	}, 20*time.Second, 200*time.Millisecond, "the UI's list no longer shows it")
	requireVerified(t)
}

// overdueSQL is step 1 of operations.md's "Overdue authorizations", as an operator pastes it.
const overdueSQL = `SELECT p.id, p.merchant_id, p.idempotency_key, p.status, a.capture_before
   FROM open_authorizations a JOIN payments p ON p.id = a.payment_id
   WHERE a.capture_before < now() - interval '1 minute';`

// The overdue-authorization runbook (operations.md, "Overdue authorizations", step 3) with the
// commands it shows: the void at capture_before got no answer from a bank without inquiry, so
// the payment is unknown with its hold; the operator finds it with the SQL and, the bank having
// confirmed nothing was captured, settles it not_charged with the CLI: canceled, the hold
// released, nothing captured at the bank.
func TestOperatorSettlesAnOverdueAuthorizationWhoseVoidWasLost(t *testing.T) {
	t.Parallel()
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityNone, temporal: tc, captureWindow: 3 * time.Second})
	m := s.newMerchant()
	s.setFaults(`{"rules":[{"on":"void","action":"drop_response","count":1}]}`)
	id, payer, _ := s.authorize(m, "overdue", "30.00", "100.00")
	require.Eventually(t, func() bool { return paymentByKey(t, m, "overdue").Status == payment.StatusUnknown },
		30*time.Second, 100*time.Millisecond, "the void at capture_before got no answer")

	// 1. Find them (a minute after capture_before).
	require.Eventually(t, func() bool { return strings.Contains(psql(t, overdueSQL), id) },
		90*time.Second, time.Second, "the runbook's SQL lists it")
	rows := psql(t, overdueSQL)
	row := rows[strings.Index(rows, id):]
	require.Contains(t, row[:strings.IndexByte(row, '\n')], "|overdue|unknown|")
	st, err := db.Stats(t.Context())
	require.NoError(t, err)
	require.Positive(t, st.OverdueAuthorizations, "kasa_authorizations_overdue counts it")
	require.Equal(t, int64(3000), reserved(t, payer), "the hold is kept")

	// 3. unknown: the bank confirms nothing was captured.
	wfID := workflows.PaymentWorkflowID(mustUUID(t, m.ID), "overdue")
	out, err := settleByHand(t, wfID, `{"outcome":"not_charged","operation_id":"`+id+`"}`)
	require.NoError(t, err, out)
	require.Contains(t, out, "canceled")
	require.Equal(t, payment.StatusCanceled, paymentByKey(t, m, "overdue").Status)
	a := s.account(m, payer)
	require.Equal(t, []any{"100.00", "0.00"}, []any{a["balance"], a["reserved"]})
	require.Zero(t, s.held(id).CapturedMinor, "nothing was captured at the bank")
	require.NotContains(t, psql(t, overdueSQL), id, "no longer overdue")
	requireVerified(t)
}
