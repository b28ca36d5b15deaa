package tests

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"

	"github.com/kasa-pay/kasa/activities"
	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/provider"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/sweeper"
	"github.com/kasa-pay/kasa/worker"
	"github.com/kasa-pay/kasa/workflows"
)

// An API whose task queue (or namespace) no worker polls (a typo, or one instance left behind
// in a change of KASA_TEMPORAL_TASK_QUEUE) answers /readyz 503, so a load balancer sends it
// nothing; its sweeper and backlog drainer still run. A payment another API accepted is never
// started where no worker would run it: it stays processing for ever, its workflow started.
// The healthy API's sweeper and drainer start it on the workers' queue.
func TestPaymentsAnotherAPIAcceptedStartOnlyWhereAWorkerPolls(t *testing.T) {
	ctx := context.Background()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	mid := mustUUID(t, m.ID)
	acct := s.newAccount(m, "TRY", "100.00")
	nobody := workflows.Starter{Client: tc, TaskQueue: "no-worker-" + uuid.NewString()}
	workers := workflows.Starter{Client: tc, TaskQueue: s.queue}
	quiet := slog.New(slog.DiscardHandler)

	begin := func(t *testing.T, key string, queued bool) payment.Payment {
		return beginPayment(t, m, acct, key, "10.00", 10*time.Millisecond, queued)
	}
	succeeds := func(t *testing.T, p payment.Payment, by string) {
		t.Helper()
		require.Eventually(t, func() bool {
			got, err := db.Payment(ctx, p.ID)
			require.NoError(t, err)
			return got.Status == payment.StatusSucceeded
		}, 30*time.Second, 200*time.Millisecond, "%s: the payment never ran", by)
		require.Equal(t, 1, s.simCount(p.ID.String()))
	}

	t.Run("sweeper", func(t *testing.T) {
		p := begin(t, "stranded", false) // the API that accepted it died before the start
		time.Sleep(50 * time.Millisecond)
		n, err := (&sweeper.Sweeper{Store: db, Starter: nobody, Merchant: &mid}).Sweep(ctx)
		require.Error(t, err, "a sweeper with no worker on its queue says so")
		require.Zero(t, n)
		rec, err := db.Record(ctx, mid, "stranded")
		require.NoError(t, err)
		require.False(t, rec.WorkflowStarted, "left for a sweeper whose queue a worker polls")
		_, err = (&sweeper.Sweeper{Store: db, Starter: workers, Merchant: &mid}).Sweep(ctx)
		require.NoError(t, err)
		succeeds(t, p, "sweeper")
	})

	t.Run("drainer", func(t *testing.T) {
		p := begin(t, "queued", true) // accepted in a burst, queued in the start backlog
		run := func(st workflows.Starter) {
			run, stop := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() { defer close(done); (&sweeper.Drainer{Store: db, Starter: st, Logger: quiet}).Run(run) }()
			t.Cleanup(func() { stop(); <-done })
		}
		run(nobody) // first: it would take the lead
		time.Sleep(time.Second)
		run(workers)
		succeeds(t, p, "drainer")
	})

	r := s.pay(m, "queued", payBody("inv-queued", "10.00", "TRY", acct))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Equal(t, "80.00", s.account(m, acct)["balance"])
	requireVerified(t)
}

// staleStarter starts on a task queue whose last worker left less than two minutes ago: a
// poller counts as fresh that long, so it still reads as ready.
type staleStarter struct{ workflows.Starter }

func (staleStarter) Ready(context.Context) error { return nil }

// A drainer goes on leading for up to two minutes after the workers left its task queue: the
// payments it starts meanwhile wait on a queue nobody polls, their runs never take a step. The
// drainer that leads next, on the workers' queue, claims them again once their leases ran out;
// their runs must neither hold its slots for good (stopping the whole drain) nor stay processing
// for ever: each runs where the workers poll, and moves its money once.
func TestPaymentsStartedWhereTheWorkersLeftRunWhereTheyPoll(t *testing.T) {
	ctx := context.Background()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	mid := mustUUID(t, m.ID)
	acct := s.newAccount(m, "TRY", "100.00")
	left := staleStarter{workflows.Starter{Client: tc, TaskQueue: "left-" + uuid.NewString()}}
	workers := workflows.Starter{Client: tc, TaskQueue: s.queue}
	quiet := slog.New(slog.DiscardHandler)

	var ps []payment.Payment
	for i := range 3 {
		ps = append(ps, beginPayment(t, m, acct, fmt.Sprintf("left-%d", i), "10.00", time.Minute, true))
	}
	drain := func(st sweeper.RunStarter) (stop func()) {
		run, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			(&sweeper.Drainer{Store: db, Starter: st, MaxRunning: 2, Lease: time.Second, Logger: quiet}).Run(run)
		}()
		stop = sync.OnceFunc(func() { cancel(); <-done })
		t.Cleanup(stop)
		return stop
	}

	stopLeft := drain(left)
	require.Eventually(t, func() bool {
		for _, p := range ps[:2] {
			if _, err := tc.DescribeWorkflow(ctx, workflows.PaymentWorkflowID(mid, p.IdempotencyKey), ""); err != nil {
				return false
			}
		}
		return true
	}, 10*time.Second, 50*time.Millisecond, "the first drainer leads and fills its two slots where nobody polls")
	stopLeft() // it lets the lead go (it finds no worker, or its process is replaced)
	drain(workers)

	for _, p := range ps {
		require.Eventually(t, func() bool {
			got, err := db.Payment(ctx, p.ID)
			require.NoError(t, err)
			return got.Status == payment.StatusSucceeded
		}, 60*time.Second, 200*time.Millisecond, "payment %s never ran", p.IdempotencyKey)
		require.Equal(t, 1, s.simCount(p.ID.String()), "payment %s charged once", p.IdempotencyKey)
	}
	require.Equal(t, "70.00", s.account(m, acct)["balance"])
	require.Equal(t, "0.00", s.account(m, acct)["reserved"])
	requireVerified(t)
}

// heldReserve is a worker's store whose reserve waits until release is closed: its run's first
// workflow task is taken and in flight.
type heldReserve struct {
	activities.Store
	entered chan struct{}
	release chan struct{}
	done    chan error
	once    sync.Once
}

func (h *heldReserve) ReserveRun(ctx context.Context, id uuid.UUID, runID string) error {
	h.once.Do(func() { close(h.entered) })
	<-h.release
	err := h.Store.ReserveRun(ctx, id, runID)
	select {
	case h.done <- err:
	default:
	}
	return err
}

// The race CheckPaymentRun cannot close: a late worker on the queue the workers left takes the
// stranded run's first task just after the drainer found it untaken, and runs its steps (local
// ones, in that task) while the run that replaced it runs on the workers' queue. The payment's
// money still moves once: the bank sees one charge, the ledger one posting.
func TestAPaymentMovedAsALateWorkerTakesItMovesMoneyOnce(t *testing.T) {
	for _, capability := range []workflows.Capability{workflows.CapabilityIdempotent, workflows.CapabilityNone} {
		t.Run(string(capability), func(t *testing.T) {
			ctx := context.Background()
			s := newStack(t, capability)
			m := s.newMerchant()
			mid := mustUUID(t, m.ID)
			acct := s.newAccount(m, "TRY", "100.00")
			late := workflows.Starter{Client: tc, TaskQueue: "late-" + uuid.NewString()}

			p := beginPayment(t, m, acct, "late", "10.00", time.Minute, true)
			in := workflows.InputFor(p)
			_, err := late.StartPayment(ctx, "late", in)
			require.NoError(t, err)

			held := &heldReserve{Store: db, entered: make(chan struct{}), release: make(chan struct{}), done: make(chan error, 1)}
			w := worker.New(tc, late.TaskQueue, &activities.Activities{Store: held, Provider: provider.New(s.sim.URL, 5*time.Second),
				Policy: workflows.ChargePolicy{Capability: capability, Budget: 10 * time.Second}}, nil)
			require.NoError(t, w.Start())
			t.Cleanup(w.Stop)
			select {
			case <-held.entered:
			case <-time.After(30 * time.Second):
				t.Fatal("the late worker never took the run")
			}
			// What CheckPaymentRun does once it found the run untaken and its queue unpolled.
			_, err = tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
				ID: workflows.PaymentWorkflowID(mid, "late"), TaskQueue: s.queue,
				WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_TERMINATE_EXISTING,
				WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE_FAILED_ONLY,
			}, workflows.WorkflowPayment, in)
			require.NoError(t, err)
			close(held.release)

			var got payment.Payment
			require.Eventually(t, func() bool {
				got, err = db.Payment(ctx, p.ID)
				require.NoError(t, err)
				return got.Status != payment.StatusProcessing
			}, 60*time.Second, 200*time.Millisecond)
			// The run that replaced it ends too, with the payment's status: one that found the
			// payment decided by the other as it marked it unknown at once, one that marked it
			// unknown just before the other run's finalize once its status read finds it final
			// (Revision 10; TestAParkedRunEndsOnceAnotherRunDecidedItsPayment).
			id := workflows.PaymentWorkflowID(mid, "late")
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			var res workflows.PaymentResult
			require.NoError(t, tc.GetWorkflow(wctx, id, "").Get(wctx, &res), "the replacing run never ended")
			require.Equal(t, string(got.Status), res.Status, "the run ends with the payment's status")
			select {
			case err := <-held.done:
				t.Logf("the late run's reserve: %v", err)
			case <-time.After(30 * time.Second):
				t.Fatal("the late run's reserve never returned")
			}
			w.Stop() // whatever the late run's task still does, it ends here
			require.LessOrEqual(t, s.simCount(p.ID.String()), 1, "the bank saw the payment once at most")
			t.Logf("%s: %s, %d charge(s)", capability, got.Status, s.simCount(p.ID.String()))
			switch got.Status {
			case payment.StatusSucceeded:
				require.Equal(t, 1, s.simCount(p.ID.String()))
				require.Equal(t, "90.00", s.account(m, acct)["balance"])
				require.Equal(t, "0.00", s.account(m, acct)["reserved"])
			case payment.StatusUnknown: // parked for reconciliation: the hold stays
				require.Equal(t, "100.00", s.account(m, acct)["balance"])
				require.Equal(t, "10.00", s.account(m, acct)["reserved"])
			default:
				t.Fatalf("payment %s", got.Status)
			}
			requireVerified(t)
		})
	}
}

// After a change of drainer leader, the new leader claims again the payments the old one
// started whose first step has not run within their lease (the workers are slow to take them):
// its start finds each run and starts nothing. kasa_backlog_started_total and the drain rate the
// APIs bound new payments by (KASA_BACKLOG_MAX_WAIT) count only the runs a start made: counted
// again, the rate would read higher than the backlog drains, and admit more than it can start
// within the clients' patience.
func TestANewDrainLeaderCountsOnlyTheRunsItStarted(t *testing.T) {
	ctx := context.Background()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	mid := mustUUID(t, m.ID)
	acct := s.newAccount(m, "TRY", "100.00")
	// The workers' queue, where they take nothing yet: the runs wait for their first step.
	slow := staleStarter{workflows.Starter{Client: tc, TaskQueue: "slow-" + uuid.NewString()}}
	quiet := slog.New(slog.DiscardHandler)

	var ps []payment.Payment
	for i := range 3 {
		ps = append(ps, beginPayment(t, m, acct, fmt.Sprintf("slow-%d", i), "10.00", time.Minute, true))
	}
	drain := func(reg *prometheus.Registry) (stop func()) {
		run, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			(&sweeper.Drainer{Store: db, Starter: slow, MaxRunning: 10, Lease: time.Second, Logger: quiet, Registerer: reg}).Run(run)
		}()
		stop = sync.OnceFunc(func() { cancel(); <-done })
		t.Cleanup(stop)
		return stop
	}
	started := func(reg *prometheus.Registry) float64 {
		families, err := reg.Gather()
		require.NoError(t, err)
		for _, f := range families {
			if f.GetName() == "kasa_backlog_started_total" {
				return f.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return -1 // its drainer has not registered it yet
	}

	first := prometheus.NewRegistry()
	stopFirst := drain(first)
	require.Eventually(t, func() bool { return started(first) == 3 }, 10*time.Second, 50*time.Millisecond,
		"the first leader starts the three")
	stopFirst() // it lets the lead go

	second := prometheus.NewRegistry()
	took := time.Now()
	drain(second)
	require.Eventually(t, func() bool {
		for _, p := range ps {
			rec, err := db.Record(ctx, mid, p.IdempotencyKey)
			require.NoError(t, err)
			if !rec.Queued || !rec.LockedUntil.After(took.Add(time.Second)) {
				return false
			}
		}
		return true
	}, 10*time.Second, 50*time.Millisecond, "the new leader claims the three again once their leases ran out")
	time.Sleep(2 * time.Second) // their starts returned, and the leader saved its record since
	require.Zero(t, started(second), "its starts found the runs: none is counted")
	st, err := db.BacklogState(ctx)
	require.NoError(t, err)
	require.False(t, st.Counted, "the leader's own record")
	require.Zero(t, st.DrainPerSecond, "nothing drains: no run it started")
	for _, p := range ps {
		desc, err := tc.DescribeWorkflow(ctx, workflows.PaymentWorkflowID(mid, p.IdempotencyKey), "")
		require.NoError(t, err)
		require.EqualValues(t, 2, desc.RawResponse.GetWorkflowExecutionInfo().GetHistoryLength(), "the first leader's run, untaken")
	}
}

// The other two starters strand a run the same way within the two minutes a poller counts as
// fresh: an API's own start of a new payment (it never marks the record: its lease runs out, and
// the sweeper finds the run and marks it started), and the sweeper's start of a stranded record
// it took over. Nothing looks at a started payment again, so it would stay processing for ever:
// a sweeper whose task queue the workers poll moves its run there, and it moves its money once.
func TestPaymentsTheAPIOrTheSweeperStartedWhereTheWorkersLeftRunWhereTheyPoll(t *testing.T) {
	ctx := context.Background()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	mid := mustUUID(t, m.ID)
	acct := s.newAccount(m, "TRY", "100.00")
	left := staleStarter{workflows.Starter{Client: tc, TaskQueue: "left-" + uuid.NewString()}}
	workers := &sweeper.Sweeper{Store: db, Starter: workflows.Starter{Client: tc, TaskQueue: s.queue},
		Lease: 200 * time.Millisecond, Merchant: &mid, Logger: slog.New(slog.DiscardHandler)}

	begin := func(t *testing.T, key string) payment.Payment {
		p := beginPayment(t, m, acct, key, "10.00", 10*time.Millisecond, false)
		time.Sleep(20 * time.Millisecond) // the lease ran out
		return p
	}

	for _, c := range []struct {
		name  string
		start func(t *testing.T, p payment.Payment)
	}{
		{"api", func(t *testing.T, p payment.Payment) {
			_, err := left.StartPayment(ctx, p.IdempotencyKey, workflows.InputFor(p))
			require.NoError(t, err)
		}},
		{"sweeper", func(t *testing.T, p payment.Payment) {
			n, err := (&sweeper.Sweeper{Store: db, Starter: left, Merchant: &mid}).Sweep(ctx)
			require.NoError(t, err)
			require.Equal(t, 1, n)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			key := "stale-" + c.name
			p := begin(t, key)
			c.start(t, p)
			desc, err := tc.DescribeWorkflow(ctx, workflows.PaymentWorkflowID(mid, key), "")
			require.NoError(t, err)
			require.Equal(t, left.TaskQueue, desc.RawResponse.GetWorkflowExecutionInfo().GetTaskQueue())

			require.Eventually(t, func() bool {
				_, err := workers.Sweep(ctx)
				require.NoError(t, err)
				got, err := db.Payment(ctx, p.ID)
				require.NoError(t, err)
				return got.Status == payment.StatusSucceeded
			}, 20*time.Second, 200*time.Millisecond, "payment %s never ran", key)
			rec, err := db.Record(ctx, mid, key)
			require.NoError(t, err)
			require.True(t, rec.WorkflowStarted)
			require.Equal(t, 1, s.simCount(p.ID.String()), "charged once")
		})
	}

	// A run that closed before its first step (an operator terminated it) takes no step
	// wherever it is: it is not replaced, and its payment is marked started, left processing
	// for the operators' stuck list rather than taken over again every lease.
	t.Run("closed", func(t *testing.T) {
		p := begin(t, "stale-closed")
		_, err := left.StartPayment(ctx, p.IdempotencyKey, workflows.InputFor(p))
		require.NoError(t, err)
		id := workflows.PaymentWorkflowID(mid, p.IdempotencyKey)
		require.NoError(t, tc.TerminateWorkflow(ctx, id, "", "test: an operator's terminate"))
		n, err := workers.Sweep(ctx)
		require.NoError(t, err)
		require.Zero(t, n, "nothing started")
		rec, err := db.Record(ctx, mid, p.IdempotencyKey)
		require.NoError(t, err)
		require.True(t, rec.WorkflowStarted)
		desc, err := tc.DescribeWorkflow(ctx, id, "")
		require.NoError(t, err)
		require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_TERMINATED, desc.RawResponse.GetWorkflowExecutionInfo().GetStatus(), "the run stays the terminated one")
		got, err := db.Payment(ctx, p.ID)
		require.NoError(t, err)
		require.Equal(t, payment.StatusProcessing, got.Status)
		require.Zero(t, s.simCount(p.ID.String()))
	})
	require.Equal(t, "80.00", s.account(m, acct)["balance"])
	require.Equal(t, "0.00", s.account(m, acct)["reserved"])
	requireVerified(t)
}

// heldAuthorized is a worker's store whose Authorized step, once recorded, waits until release
// is closed: its run's first task has taken the manual payment to requires_capture.
type heldAuthorized struct {
	activities.Store
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (h *heldAuthorized) Authorized(ctx context.Context, id uuid.UUID, ref string) (payment.Payment, error) {
	p, err := h.Store.Authorized(ctx, id, ref)
	h.once.Do(func() { close(h.entered) })
	<-h.release
	return p, err
}

// The late worker of the race above may run a manual payment's whole first task, reserve,
// authorization and its record, before the run that replaced its stranded one takes a step: the
// payment then waits for its capture, its amount held at the bank and on the payer. The run
// that replaced it is the only one left, so it must wait for that capture (or void the
// authorization at capture_before), not end as if another run would.
func TestAManualPaymentALateWorkerAuthorizedAsItWasMovedTakesItsCapture(t *testing.T) {
	ctx := context.Background()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	mid := mustUUID(t, m.ID)
	acct := s.newAccount(m, "TRY", "100.00")
	late := workflows.Starter{Client: tc, TaskQueue: "late-" + uuid.NewString()}

	req, err := payment.ParseRequest([]byte(manualBody("inv-late-manual", "10.00", acct)))
	require.NoError(t, err)
	_, p, began, err := db.Begin(ctx, store.BeginInput{MerchantID: mid, Key: "late-manual", Request: req,
		OperationID: payment.NewID(), Lease: time.Minute, Queue: true, CaptureWindow: time.Hour})
	require.NoError(t, err)
	require.Equal(t, store.BeganNew, began)
	t.Cleanup(func() { _ = db.Unqueue(context.Background(), []uuid.UUID{p.ID}) })
	in := workflows.InputFor(p)
	_, err = late.StartPayment(ctx, "late-manual", in)
	require.NoError(t, err)

	held := &heldAuthorized{Store: db, entered: make(chan struct{}), release: make(chan struct{})}
	w := worker.New(tc, late.TaskQueue, &activities.Activities{Store: held, Provider: provider.New(s.sim.URL, 5*time.Second),
		Policy: workflows.ChargePolicy{Capability: workflows.CapabilityIdempotent, Budget: 10 * time.Second}}, nil)
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)
	select {
	case <-held.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the late worker never recorded the authorization")
	}
	// What CheckPaymentRun does once it found the run untaken and its queue unpolled.
	id := workflows.PaymentWorkflowID(mid, "late-manual")
	moved, err := tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID: id, TaskQueue: s.queue,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_TERMINATE_EXISTING,
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE_FAILED_ONLY,
	}, workflows.WorkflowPayment, in)
	require.NoError(t, err)
	// The moved run's first step finds the authorization recorded by the late run.
	require.Eventually(t, func() bool {
		desc, err := tc.DescribeWorkflow(ctx, id, moved.GetRunID())
		require.NoError(t, err)
		return desc.RawResponse.GetWorkflowExecutionInfo().GetHistoryLength() > 4
	}, 30*time.Second, 100*time.Millisecond, "the moved run never took a step")
	close(held.release)
	w.Stop() // whatever the late run's task still does, it ends here

	var c response
	require.Eventually(t, func() bool {
		c = s.command(m, p.ID.String(), "capture", "cap-late", "")
		return c.Status != http.StatusConflict || !strings.Contains(string(c.Body), "recorded")
	}, 30*time.Second, 200*time.Millisecond)
	require.Equal(t, http.StatusCreated, c.Status, "%s", c.Body)
	require.Equal(t, "succeeded", c.json(t)["status"])
	require.Equal(t, 1, s.held(p.ID.String()).Count, "authorized once at the bank")
	require.Equal(t, int64(1000), s.held(p.ID.String()).CapturedMinor, "the bank captured 10.00 once")
	require.Equal(t, "90.00", s.account(m, acct)["balance"])
	require.Equal(t, "0.00", s.account(m, acct)["reserved"])
	require.NoError(t, moved.Get(ctx, nil), "the moved run took the capture")
	requireVerified(t)
}

// beginPayment commits what an API commits for a new payment of amount TRY from acct under key
// before it starts the workflow (queued for the backlog when queued), its key held for lease, and
// starts nothing. A queued one is taken off the queue when the test ends.
func beginPayment(t *testing.T, m merchant, acct, key, amount string, lease time.Duration, queued bool) payment.Payment {
	t.Helper()
	req, err := payment.ParseRequest([]byte(payBody("inv-"+key, amount, "TRY", acct)))
	require.NoError(t, err)
	_, p, began, err := db.Begin(context.Background(), store.BeginInput{MerchantID: mustUUID(t, m.ID), Key: key, Request: req,
		OperationID: payment.NewID(), Lease: lease, Queue: queued})
	require.NoError(t, err)
	require.Equal(t, store.BeganNew, began)
	if queued {
		t.Cleanup(func() { _ = db.Unqueue(context.Background(), []uuid.UUID{p.ID}) })
	}
	return p
}

// A refund an API (or its sweeper) started on a task queue the workers were leaving waits there
// as a payment would: the sweeper on the workers' queue moves its run, never having taken a step,
// and the refund pays back once.
func TestRefundsStartedWhereTheWorkersLeftRunWhereTheyPoll(t *testing.T) {
	ctx := context.Background()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	mid := mustUUID(t, m.ID)
	left := staleStarter{workflows.Starter{Client: tc, TaskQueue: "left-" + uuid.NewString()}}
	workers := &sweeper.Sweeper{Store: db, Starter: workflows.Starter{Client: tc, TaskQueue: s.queue},
		Lease: 200 * time.Millisecond, Merchant: &mid, Logger: slog.New(slog.DiscardHandler)}
	paid, payer := s.paidFor(m, "left-refunded", "50.00", "100.00")
	req, err := payment.ParseRefundRequest([]byte(`{"amount":"10.00"}`))
	require.NoError(t, err)

	for _, c := range []struct {
		name  string
		start func(t *testing.T, key string, rf payment.Refund)
	}{
		{"api", func(t *testing.T, key string, rf payment.Refund) {
			_, err := left.StartRefund(ctx, key, workflows.RefundInputFor(rf))
			require.NoError(t, err)
		}},
		{"sweeper", func(t *testing.T, _ string, _ payment.Refund) {
			n, err := (&sweeper.Sweeper{Store: db, Starter: left, Merchant: &mid}).Sweep(ctx)
			require.NoError(t, err)
			require.Equal(t, 1, n)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			key := "stale-refund-" + c.name
			_, rf, began, err := db.BeginRefund(ctx, store.BeginRefundInput{MerchantID: mid, PaymentID: mustUUID(t, paid),
				Key: key, Request: req, OperationID: payment.NewID(), Lease: 10 * time.Millisecond})
			require.NoError(t, err)
			require.Equal(t, store.BeganNew, began)
			time.Sleep(20 * time.Millisecond) // the lease ran out
			c.start(t, key, rf)
			desc, err := tc.DescribeWorkflow(ctx, workflows.RefundWorkflowID(mid, key), "")
			require.NoError(t, err)
			require.Equal(t, left.TaskQueue, desc.RawResponse.GetWorkflowExecutionInfo().GetTaskQueue())

			require.Eventually(t, func() bool {
				_, err := workers.Sweep(ctx)
				require.NoError(t, err)
				got, err := db.Refund(ctx, rf.ID)
				require.NoError(t, err)
				return got.Status == payment.StatusSucceeded
			}, 20*time.Second, 200*time.Millisecond, "refund %s never ran", key)
			require.Equal(t, 1, s.simRefunds(rf.ID.String()), "paid back once")
		})
	}
	require.Equal(t, "70.00", s.account(m, payer)["balance"], "50.00 paid, 20.00 paid back")
	requireVerified(t)
}

// The race above can leave the replacing run parked `unknown` on a payment the other run then
// decided: nothing would settle it (a settlement file's import skips a final payment), so it
// would wait in the operators' `PaymentStatus="unknown"` list for ever. From Revision 10 a
// parked run reads its payment's status now and then, and ends with it once it is final. Here
// the other run's finalize is made directly on the database.
func TestAParkedRunEndsOnceAnotherRunDecidedItsPayment(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	s.setFaults(`{"rules":[{"on":"charge","action":"drop_response","count":1}]}`)
	r := s.pay(m, "parked", payBody("inv-parked", "40.00", "TRY", acct))
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	require.Equal(t, "unknown", r.json(t)["status"])
	id := mustUUID(t, r.json(t)["id"].(string))

	_, err := db.Finalize(ctx, id, "ch_other_run")
	require.NoError(t, err)
	wfID := workflows.PaymentWorkflowID(mustUUID(t, m.ID), "parked")
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var res workflows.PaymentResult
	require.NoError(t, tc.GetWorkflow(wctx, wfID, "").Get(wctx, &res), "the parked run still waits on a payment the database shows final")
	require.Equal(t, "succeeded", res.Status)
	desc, err := tc.DescribeWorkflow(ctx, wfID, "")
	require.NoError(t, err)
	var listed string
	require.NoError(t, converter.GetDefaultDataConverter().FromPayload(
		desc.RawResponse.GetWorkflowExecutionInfo().GetSearchAttributes().GetIndexedFields()[workflows.SearchPaymentStatus.GetName()], &listed))
	require.Equal(t, "succeeded", listed, "out of the operators' unknown list")
	require.Equal(t, "60.00", s.account(m, acct)["balance"], "charged once")
	require.Equal(t, "0.00", s.account(m, acct)["reserved"])
	require.Equal(t, 1, s.simCount(id.String()))
	requireVerified(t)
}

// The same race can leave a manual payment's replacing run parked `unknown` in its authorization
// (its send found the other's) while the other run records the authorization: the payment reads
// requires_capture, its amount held at the bank and on the payer, and nothing else waits for its
// capture or voids it at capture_before. From Revision 10 the parked run reads that and takes the
// payment on: the merchant's capture is taken, and the bank captures once. Here the other run's
// record is made directly on the database.
func TestAParkedRunTakesOnAManualPaymentAnotherRunAuthorized(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	id := s.authorizeUnknown(m, "parked-manual", acct)
	var live []string
	require.Eventually(t, func() bool { live = s.held(id).Live; return len(live) == 1 }, 10*time.Second, 100*time.Millisecond,
		"the bank made the authorization whose answer was lost")

	_, err := db.Authorized(ctx, mustUUID(t, id), live[0])
	require.NoError(t, err)
	requireTakenOnAndCaptured(t, s, m, "parked-manual", id, acct, 40*time.Second)
	requireVerified(t)
}

// authorizedAsMarked is a worker's store that, as its run marks a manual payment unknown, first
// records the authorization the bank made, as the other run of the moved run's race does (the
// late worker's run records it between this run's send and its mark).
type authorizedAsMarked struct {
	activities.Store
	ref  func(id uuid.UUID) string // the bank's live authorization of the payment
	once sync.Once
}

func (a *authorizedAsMarked) recordFirst(ctx context.Context, id uuid.UUID) {
	a.once.Do(func() {
		if ref := a.ref(id); ref != "" {
			_, _ = a.Store.Authorized(ctx, id, ref)
		}
	})
}

func (a *authorizedAsMarked) MarkUnknown(ctx context.Context, id uuid.UUID) (payment.Payment, error) {
	a.recordFirst(ctx, id)
	return a.Store.MarkUnknown(ctx, id)
}

func (a *authorizedAsMarked) MarkAuthorizationUnknown(ctx context.Context, id uuid.UUID) (payment.Payment, error) {
	a.recordFirst(ctx, id)
	return a.Store.MarkAuthorizationUnknown(ctx, id)
}

// A run whose authorization got no answer marks its manual payment unknown; should another run
// record the authorization just before (the moved run's race), the mark must not reopen it:
// the authorization stays open at the bank, and nothing would capture or void it. The run
// takes the authorization on instead, and the capture goes through.
func TestMarkingAnAuthorizationUnknownNeverReopensOneRecorded(t *testing.T) {
	t.Parallel()
	var s *stack
	s = newStackWith(t, stackOptions{capability: workflows.CapabilityNone, temporal: tc, steps: func(st activities.Store) activities.Store {
		return &authorizedAsMarked{Store: st, ref: func(id uuid.UUID) string {
			if live := s.held(id.String()).Live; len(live) == 1 {
				return live[0]
			}
			return ""
		}}
	}})
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	s.setFaults(`{"rules":[{"on":"authorize","action":"drop_response","count":1}]}`)
	r := s.pay(m, "marked", manualBody("inv-marked", "25.00", acct))
	require.Contains(t, []int{http.StatusCreated, http.StatusAccepted}, r.Status, "%s", r.Body) // the record may come first
	id := r.json(t)["id"].(string)
	requireTakenOnAndCaptured(t, s, m, "marked", id, acct, 20*time.Second)
	requireVerified(t)
}

// requireTakenOnAndCaptured requires the manual payment id of 25.00 (key) to take a capture
// within, once its run has taken its authorization on: the bank authorized and captured it once,
// the payer paid 25.00 of 100.00 with nothing held, and the run ended succeeded.
func requireTakenOnAndCaptured(t *testing.T, s *stack, m merchant, key, id, payer string, within time.Duration) {
	t.Helper()
	var c response
	require.Eventually(t, func() bool {
		c = s.command(m, id, "capture", "cap-"+key, "")
		return c.Status != http.StatusServiceUnavailable // the run has not taken the capture: send it again
	}, within, 500*time.Millisecond, "the run never took the authorization on")
	require.Equal(t, http.StatusCreated, c.Status, "%s (payment %s)", c.Body, paymentByKey(t, m, key).Status)
	require.Equal(t, "succeeded", c.json(t)["status"])
	require.Equal(t, 1, s.held(id).Count, "authorized once at the bank")
	require.Equal(t, int64(2500), s.held(id).CapturedMinor, "the bank captured 25.00 once")
	require.Equal(t, "75.00", s.account(m, payer)["balance"])
	require.Equal(t, "0.00", s.account(m, payer)["reserved"])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var res workflows.PaymentResult
	require.NoError(t, tc.GetWorkflow(ctx, workflows.PaymentWorkflowID(mustUUID(t, m.ID), key), "").Get(ctx, &res))
	require.Equal(t, "succeeded", res.Status)
}
