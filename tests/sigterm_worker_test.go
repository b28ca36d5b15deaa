package tests

// SIGTERM to a `kasa worker` while a refund, a capture or a void is at the bank: the worker
// lets the call finish (docs/deployment.md, "Upgrades": up to 25 s) and exits 0; the bank's
// answer is the operation's, so the bank moves money once and the operation ends as the bank
// said, never parked unknown for a stop kasa itself chose.

import (
	"context"
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/tools/banksim"
)

// sigtermGrace is what the docs tell an orchestrator to give a stopping worker.
const sigtermGrace = 30 * time.Second

func TestWorkerSIGTERMWhileAtTheBank(t *testing.T) {
	t.Parallel()
	for _, capability := range []string{"none", "inquiry"} {
		for _, op := range []string{"refund", "capture", "void"} {
			t.Run(capability+"/"+op, func(t *testing.T) {
				t.Parallel()
				s := newCrashStack(t, crashConfig{capability: capability, providerTimeout: "10s", syncWait: "500ms"})
				s.start()
				b := newBankOp(t, s, op, 5*time.Second)
				first := b.send()
				s.waitFaultsUsed()

				stopped := time.Now()
				s.worker.stopCleanly(sigtermGrace)
				t.Logf("worker stopped %v after SIGTERM", time.Since(stopped).Round(time.Millisecond))
				s.startWorker()

				b.requireDoneOnce(first)
				// The key answers what was done, then the same answer byte for byte.
				done := b.mustCall()
				require.Contains(t, []int{http.StatusOK, http.StatusCreated}, done.Status, "%s", done.Body)
				again := b.mustCall()
				require.Equal(t, done.Status, again.Status)
				require.Equal(t, string(done.Body), string(again.Body))
				require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
				s.verify()
			})
		}
	}
}

// SIGTERM to a `kasa worker` while the bank's answer to a refund or a capture is being recorded
// and that step waits for a row another transaction holds (an operator's open session, a long
// report) for longer than the grace: the worker still exits 0 within the grace the docs give it,
// and the next worker records the answer once.
func TestWorkerSIGTERMWhileTheAnswerIsRecorded(t *testing.T) {
	t.Parallel()
	for _, op := range []string{"refund", "capture"} {
		t.Run(op, func(t *testing.T) {
			t.Parallel()
			s := newCrashStack(t, crashConfig{capability: "none", providerTimeout: "10s", syncWait: "500ms"})
			s.start()
			b := newBankOp(t, s, op, 3*time.Second)
			first := b.send()
			s.waitFaultsUsed()

			// The row the answer is written to, held while the bank answers and past the grace.
			ctx := context.Background()
			c, err := pgx.Connect(ctx, s.dbURL)
			require.NoError(t, err)
			defer c.Close(ctx)
			tx, err := c.Begin(ctx)
			require.NoError(t, err)
			row := "SELECT 1 FROM payments WHERE id = $1 FOR UPDATE"
			lockID := b.id
			if op == "refund" {
				row, lockID = "SELECT 1 FROM refunds WHERE id = $1 FOR UPDATE", first.json(t)["id"].(string)
			}
			_, err = tx.Exec(ctx, row, lockID)
			require.NoError(t, err)
			// The answer has come back and its step waits for the row.
			watch, err := pgx.Connect(ctx, s.dbURL)
			require.NoError(t, err)
			defer watch.Close(ctx)
			require.Eventually(t, func() bool {
				var n int
				require.NoError(t, watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&n))
				return n > 0
			}, 15*time.Second, 50*time.Millisecond)

			require.NoError(t, syscall.Kill(s.worker.pid(), syscall.SIGTERM))
			stopped := time.Now()
			released := time.AfterFunc(sigtermGrace+10*time.Second, func() { _ = tx.Rollback(ctx) })
			defer released.Stop()
			select {
			case <-s.worker.c.Done():
			case <-time.After(sigtermGrace + 20*time.Second):
				t.Fatalf("the worker did not stop\n%s", tailOf(s.worker))
			}
			took := time.Since(stopped)
			t.Logf("worker stopped %v after SIGTERM", took.Round(time.Millisecond))
			require.NoError(t, s.worker.c.Err(), "exit 0\n%s", tailOf(s.worker))
			require.Less(t, took, sigtermGrace, "the worker outlived its grace: an orchestrator SIGKILLs it\n%s", tailOf(s.worker))
			require.NoError(t, tx.Rollback(ctx))
			s.startWorker()

			b.requireDoneOnce(first)
			s.verify()
		})
	}
}

// SIGTERM to a `kasa api` while a refund or a capture request waits for its outcome: the request
// is answered at once with 202 and the operation as it is (docs/deployment.md, "Upgrades"), the
// API exits 0, and the operation finishes: once at the bank, its key then answering what was done.
func TestAPISIGTERMWhileARefundOrCaptureWaits(t *testing.T) {
	t.Parallel()
	for _, op := range []string{"refund", "capture"} {
		t.Run(op, func(t *testing.T) {
			t.Parallel()
			s := newCrashStack(t, crashConfig{capability: "none", providerTimeout: "12s", syncWait: "15s"})
			s.start()
			b := newBankOp(t, s, op, 8*time.Second)
			type result struct {
				r   response
				err error
			}
			answered := make(chan result, 1)
			go func() {
				r, err := b.call()
				answered <- result{r, err}
			}()
			s.waitFaultsUsed()
			told := time.Now()
			s.api.stopCleanly(20 * time.Second)
			res := <-answered
			t.Logf("answered and stopped %v after SIGTERM", time.Since(told).Round(time.Millisecond))
			require.NoError(t, res.err, "the request in flight lost its answer")
			require.Equal(t, http.StatusAccepted, res.r.Status, "%s", res.r.Body)
			require.NotEmpty(t, res.r.Header.Get("Retry-After"))
			require.Less(t, time.Since(told), 6*time.Second, "answered at once, not when the bank answered")

			s.startAPI()
			deadline := time.Now().Add(60 * time.Second)
			var done response
			for {
				done = b.mustCall()
				if done.Status != http.StatusAccepted && done.Status != http.StatusConflict || time.Now().After(deadline) {
					break
				}
				time.Sleep(250 * time.Millisecond)
			}
			require.Equal(t, http.StatusCreated, done.Status, "%s", done.Body)
			again := b.mustCall()
			require.Equal(t, string(done.Body), string(again.Body))
			require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
			if op == "refund" {
				require.Equal(t, res.r.json(t)["id"], done.json(t)["id"])
			}
			b.requireDoneOnce(res.r)
			s.verify()
		})
	}
}

// bankOp is a refund, capture or void of a payment of 50.00 (a manual one but for a refund) on a
// crash stack, sent under the key "op" while the bank delays its answer.
type bankOp struct {
	t          *testing.T
	s          *crashStack
	op         string
	m          merchant
	acct, id   string
	path, body string
}

// newBankOp makes the payment, waits until op can be sent, and has the bank hold op's answer
// for delay.
func newBankOp(t *testing.T, s *crashStack, op string, delay time.Duration) *bankOp {
	t.Helper()
	b := &bankOp{t: t, s: s, op: op, m: s.merchant()}
	b.acct = s.account(b.m, "TRY", "100.00")
	body := payBody("inv-"+op, "50.00", "TRY", b.acct)
	if op != "refund" {
		body = manualBody("inv-"+op, "50.00", b.acct)
	}
	r, err := s.pay(b.m, "pay", body)
	require.NoError(t, err)
	require.Contains(t, []int{http.StatusCreated, http.StatusAccepted}, r.Status, "%s", r.Body)
	b.id = r.json(t)["id"].(string)
	want := map[string]string{"refund": "succeeded", "capture": "requires_capture", "void": "requires_capture"}[op]
	require.Eventually(t, func() bool { return s.payment(b.m, b.id)["status"] == want }, 30*time.Second, 100*time.Millisecond)
	s.setFaults(fmt.Sprintf(`{"rules":[{"on":%q,"action":"delay","delay_ms":%d,"count":1}]}`, op, delay.Milliseconds()))
	switch op {
	case "refund":
		b.path, b.body = "/v1/payments/"+b.id+"/refunds", `{"amount":"20.00"}`
	case "capture":
		b.path, b.body = "/v1/payments/"+b.id+"/capture", `{"amount":"30.00"}`
	case "void":
		b.path = "/v1/payments/" + b.id + "/cancel"
	}
	return b
}

// call sends op under its key.
func (b *bankOp) call() (response, error) {
	h := []string{"Idempotency-Key", "op"}
	if b.body != "" {
		h = append(h, "Content-Type", "application/json")
	}
	return httpCall("POST", b.s.apiURL()+b.path, b.m.APIKey, b.body, h...)
}

func (b *bankOp) mustCall() response {
	b.t.Helper()
	r, err := b.call()
	require.NoError(b.t, err)
	return r
}

// send sends op until it is taken (on a loaded machine a command may not be within the sync
// wait: the same one again) and returns its 202.
func (b *bankOp) send() response {
	b.t.Helper()
	first := b.mustCall()
	for retry := 0; first.Status == http.StatusServiceUnavailable && retry < 10; retry++ {
		first = b.mustCall()
	}
	require.Equal(b.t, http.StatusAccepted, first.Status, "%s", first.Body)
	return first
}

// requireDoneOnce waits up to a minute for op to end and checks it was done once: at the bank,
// in the ledger and in the payer's balance and hold. first is op's first answer.
func (b *bankOp) requireDoneOnce(first response) {
	t, s := b.t, b.s
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	if b.op == "refund" {
		refundID := first.json(t)["id"].(string)
		rf := s.waitRefund(b.m, refundID, deadline)
		require.Equal(t, "succeeded", rf["status"], "%v", rf)
		require.Equal(t, 1, s.simRefundCount(refundID), "one refund at the bank")
		require.Equal(t, refundState{Refunded: 2000, Balance: 3000, Refunds: 1, Settled: 1, Postings: 1, Succeeded: 1},
			readRefundState(t, s.dbURL, b.id))
		return
	}
	var p map[string]any
	for {
		p = s.payment(b.m, b.id)
		if p["status"] != "requires_capture" || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	held, err := banksim.Control{URL: s.simURL()}.Authorizations(context.Background(), b.id)
	require.NoError(t, err)
	balance, reserved := s.balances(b.m, b.acct)
	if b.op == "capture" {
		require.Equal(t, "succeeded", p["status"], "%v", p)
		require.Equal(t, int64(3000), held.CapturedMinor, "%+v", held)
		require.False(t, held.Voided, "%+v", held)
		require.Equal(t, []string{"70.00", "0.00"}, []string{balance, reserved})
		return
	}
	require.Equal(t, "canceled", p["status"], "%v", p)
	require.Zero(t, held.CapturedMinor, "%+v", held)
	require.True(t, held.Voided, "%+v", held)
	require.Equal(t, []string{"100.00", "0.00"}, []string{balance, reserved})
}
