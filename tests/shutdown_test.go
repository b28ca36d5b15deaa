package tests

// Shutdown tests: kasa's real processes get SIGTERM in the middle of their work and must stop
// cleanly, losing and doubling nothing.

import (
	"context"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/workflowservice/v1"
	"google.golang.org/protobuf/types/known/durationpb"
)

// A payment request waiting for its outcome when its API gets SIGTERM gets its answer before the
// API exits: the one its key answers (201 once the bank answered, or 202 to poll), never a
// connection closed without one.
func TestAPISIGTERMAnswersTheRequestInFlight(t *testing.T) {
	t.Parallel()
	s := newCrashStack(t, crashConfig{providerTimeout: "12s", syncWait: "15s"})
	s.startBanksim()
	s.startWorker()
	s.startAPI()
	m := s.merchant()
	acct := s.account(m, "TRY", "100.00")
	s.setFaults(`{"rules":[{"on":"charge","action":"delay","delay_ms":10000,"count":1}]}`)
	type result struct {
		r   response
		err error
	}
	answered := make(chan result, 1)
	go func() {
		r, err := s.pay(m, "sigterm-api", payBody("inv-sigterm-api", "10.00", "TRY", acct))
		answered <- result{r, err}
	}()
	s.waitFaultsUsed()
	stopped := time.Now()
	s.api.stopCleanly(40 * time.Second)
	t.Logf("api stopped %v after SIGTERM", time.Since(stopped).Round(time.Millisecond))
	res := <-answered
	require.NoError(t, res.err, "the request in flight lost its answer")
	require.Contains(t, []int{http.StatusCreated, http.StatusAccepted}, res.r.Status, "%s", res.r.Body)
	id := res.r.json(t)["id"].(string)
	s.startAPI()
	p := s.waitPayment(m, id, time.Now().Add(60*time.Second))
	require.Equal(t, "succeeded", p["status"], "%v", p)
	require.Equal(t, 1, s.simCount(id))
	s.verify()
}

// A worker whose Temporal stops serving it for good (its namespace deleted: the SDK stops polling
// after two minutes of such answers) exits non-zero, naming the cause, so that its supervisor
// sees it and starts it again (it then waits for the namespace), instead of running on, healthy
// to look at and polling nothing.
func TestWorkerExitsWhenTemporalStopsItForGood(t *testing.T) {
	t.Parallel()
	s := newCrashStack(t, crashConfig{})
	ns := "kasa-" + uuid.NewString()
	ctx := context.Background()
	_, err := tc.WorkflowService().RegisterNamespace(ctx, &workflowservice.RegisterNamespaceRequest{
		Namespace: ns, WorkflowExecutionRetentionPeriod: durationpb.New(24 * time.Hour),
	})
	require.NoError(t, err)
	w := startProc(t, s.dir, s.bin, "worker", s.env("KASA_TEMPORAL_NAMESPACE", ns), "worker")
	w.waitLog("worker polling", 60*time.Second)
	_, err = tc.OperatorService().DeleteNamespace(ctx, &operatorservice.DeleteNamespaceRequest{Namespace: ns})
	require.NoError(t, err)
	select {
	case <-w.c.Done():
	case <-time.After(4 * time.Minute):
		t.Fatalf("the worker still runs 4 minutes after its namespace was deleted\n%s", tailOf(w))
	}
	require.Error(t, w.c.Err(), "a worker that stopped polling must not exit 0")
	require.Contains(t, tailOf(w), "temporal stopped the worker: Namespace "+ns+" is not found", "the log names the cause")
}

// With KASA_API_SHUTDOWN_DELAY an API told to stop first says so on /readyz (503) while it
// still serves what reaches it, so a load balancer takes it out of rotation before its listener
// closes; then it stops as without the delay.
func TestAPIShutdownDelayTurnsReadinessFirst(t *testing.T) {
	t.Parallel()
	s := newCrashStack(t, crashConfig{})
	s.startBanksim()
	s.startWorker()
	const delay = 4 * time.Second
	s.startAPI("KASA_API_SHUTDOWN_DELAY", delay.String())
	m := s.merchant()
	acct := s.account(m, "TRY", "100.00")
	status, _ := s.readyz()
	require.Equal(t, http.StatusOK, status)

	require.NoError(t, syscall.Kill(s.api.pid(), syscall.SIGTERM))
	told := time.Now()
	require.Eventually(t, func() bool { status, _ := s.readyz(); return status == http.StatusServiceUnavailable },
		delay/2, 20*time.Millisecond, "/readyz says 503 at once")
	_, body := s.readyz()
	require.Equal(t, "shutting down", body["api"])
	r, err := s.pay(m, "during-the-delay", payBody("inv-delay", "10.00", "TRY", acct))
	require.NoError(t, err, "a request during the delay is still served")
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Less(t, time.Since(told), delay, "served within the delay")
	require.Equal(t, 1, s.simCount(r.json(t)["id"].(string)))

	select {
	case <-s.api.c.Done():
	case <-time.After(delay + 20*time.Second):
		t.Fatalf("the api did not stop after its delay\n%s", tailOf(s.api))
	}
	require.NoError(t, s.api.c.Err(), "exit 0\n%s", tailOf(s.api))
	require.GreaterOrEqual(t, time.Since(told), delay, "it served until the delay ended")
}
