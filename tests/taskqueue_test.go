package tests

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/sweeper"
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
		t.Helper()
		req, err := payment.ParseRequest([]byte(payBody("inv-"+key, "10.00", "TRY", acct)))
		require.NoError(t, err)
		_, p, began, err := db.Begin(ctx, store.BeginInput{MerchantID: mid, Key: key, Request: req,
			OperationID: payment.NewID(), Lease: 10 * time.Millisecond, Queue: queued})
		require.NoError(t, err)
		require.Equal(t, store.BeganNew, began)
		t.Cleanup(func() { _ = db.Unqueue(context.Background(), []uuid.UUID{p.ID}) })
		return p
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
		key := fmt.Sprintf("left-%d", i)
		req, err := payment.ParseRequest([]byte(payBody("inv-"+key, "10.00", "TRY", acct)))
		require.NoError(t, err)
		_, p, began, err := db.Begin(ctx, store.BeginInput{MerchantID: mid, Key: key, Request: req,
			OperationID: payment.NewID(), Lease: time.Minute, Queue: true})
		require.NoError(t, err)
		require.Equal(t, store.BeganNew, began)
		t.Cleanup(func() { _ = db.Unqueue(context.Background(), []uuid.UUID{p.ID}) })
		ps = append(ps, p)
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
