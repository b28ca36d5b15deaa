package sweeper_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/serviceerror"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/sweeper"
	"github.com/kasa-pay/kasa/tools/testkit"
	"github.com/kasa-pay/kasa/workflows"
)

// orderStarter records start order; the first start blocks until release is closed, and keys
// in fail fail once.
type orderStarter struct {
	mu      sync.Mutex
	order   []string
	block   bool
	release chan struct{}
	fail    map[string]bool
}

func (s *orderStarter) StartPayment(_ context.Context, key string, in workflows.PaymentInput) (string, error) {
	s.mu.Lock()
	if s.fail[key] {
		delete(s.fail, key)
		s.mu.Unlock()
		return "", serviceerror.NewDeadlineExceeded("temporal: deadline exceeded")
	}
	s.order = append(s.order, key)
	first := s.block && len(s.order) == 1
	s.mu.Unlock()
	if first {
		<-s.release
	}
	_ = db.WorkflowStarted(context.Background(), in.OperationID)
	return "run", nil
}
func (s *orderStarter) CheckPaymentRun(context.Context, string, workflows.PaymentInput) (workflows.RunState, error) {
	return workflows.RunOpen, nil
}
func (s *orderStarter) StartRefund(context.Context, string, workflows.RefundInput) (string, error) {
	return "", errors.New("no refunds")
}
func (s *orderStarter) snapshot() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.order)
}

// A merchant's payments the drainer claimed but has not started yet still wait in its queue: a
// new payment of that merchant arriving meanwhile is queued behind them, never started ahead.
func TestDrainerClaimedPaymentsStayAheadOfNewOnes(t *testing.T) {
	m := orderMerchant(t, "ovt")
	keys := queue(t, m, "ovt", 3)
	c := &orderStarter{block: true, release: make(chan struct{})}
	d := &sweeper.Drainer{Store: db, Starter: c, MaxRunning: 4, Lease: time.Minute}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	defer func() { cancel(); <-done }()
	require.Eventually(t, func() bool { return len(c.snapshot()) == 1 }, 10*time.Second, 10*time.Millisecond)

	// A new payment of the same merchant; the API had a running slot (Queue: false).
	req := payment.Request{InvoiceID: "ovt-new", AmountMinor: 100, Currency: "TRY", AccountID: m.Account, PaymentType: "purchase"}
	rec, p, began, err := db.Begin(context.Background(), store.BeginInput{MerchantID: m.ID, Key: "ovt-new", Request: req,
		OperationID: payment.NewID(), Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, store.BeganNew, began)
	if !rec.Queued { // what api.create then does: run() starts it now
		_, _ = c.StartPayment(context.Background(), "ovt-new", workflows.InputFor(p))
	}
	close(c.release)
	require.Eventually(t, func() bool { return len(c.snapshot()) == 4 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, append(keys, "ovt-new"), c.snapshot(), "the merchant's payments start in arrival order")
}

// A start that fails puts the merchant's claimed payments back in its queue, in order: the
// next ones never overtake it (nor does the sweeper start any of them).
func TestDrainerFailedStartKeepsTheMerchantsOrder(t *testing.T) {
	m := orderMerchant(t, "fst")
	keys := queue(t, m, "fst", 3)
	c := &orderStarter{release: make(chan struct{}), fail: map[string]bool{keys[0]: true}}
	sw := &sweeper.Sweeper{Store: db, Starter: c, Interval: 100 * time.Millisecond, Lease: time.Minute, Merchant: &m.ID}
	d := &sweeper.Drainer{Store: db, Starter: c, MaxRunning: 4, Lease: time.Minute}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); d.Run(ctx) }()
	go func() { defer wg.Done(); sw.Run(ctx) }()
	defer func() { cancel(); wg.Wait() }()
	require.Eventually(t, func() bool { return len(c.snapshot()) == 3 }, 20*time.Second, 10*time.Millisecond)
	require.Equal(t, keys, c.snapshot(), "the merchant's payments start in arrival order")
}

func orderMerchant(t *testing.T, name string) testkit.Merchant {
	return testkit.NewMerchant(t, db, testkit.MerchantOptions{Name: name})
}

type downStarter struct{}

func (downStarter) StartPayment(context.Context, string, workflows.PaymentInput) (string, error) {
	return "", serviceerror.NewUnavailable("temporal: unavailable")
}
func (downStarter) CheckPaymentRun(context.Context, string, workflows.PaymentInput) (workflows.RunState, error) {
	return workflows.RunOpen, serviceerror.NewUnavailable("temporal: unavailable")
}
func (downStarter) StartRefund(context.Context, string, workflows.RefundInput) (string, error) {
	return "", errors.New("temporal: unavailable")
}

// While starts fail (Temporal down or overloaded), the backlog keeps every payment it holds: the
// bound (kasa_backlog_queued against KASA_BACKLOG_MAX_QUEUED) still counts them, and the
// merchant's next payment waits behind its older ones.
func TestDrainerFailingStartsKeepTheQueue(t *testing.T) {
	ctx := context.Background()
	m := orderMerchant(t, "down")
	queue(t, m, "down", 30)
	n, _, err := db.QueuedBacklog(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 30, n)

	d := &sweeper.Drainer{Store: db, Starter: downStarter{}, MaxRunning: 4, Lease: time.Minute}
	dctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	d.Run(dctx)

	n, _, err = db.QueuedBacklog(ctx)
	require.NoError(t, err)
	req := payment.Request{InvoiceID: "down-new", AmountMinor: 100, Currency: "TRY", AccountID: m.Account, PaymentType: "purchase"}
	rec, _, _, err := db.Begin(ctx, store.BeginInput{MerchantID: m.ID, Key: "down-new", Request: req, OperationID: payment.NewID(), Lease: time.Minute})
	require.NoError(t, err)
	t.Logf("after 1.5 s of failing starts: %d still queued, none started; new payment queued=%v", n, rec.Queued)
	require.EqualValues(t, 30, n, "nothing started: the 30 still wait to start")
	require.True(t, rec.Queued, "the merchant's new payment waits behind its older ones")
}

// badStarter is a cluster on which the payments whose key ends in -00 can never start (say the
// workflow id is past the server's length limit); the others run.
type badStarter struct{ *cluster }

func (b badStarter) StartPayment(ctx context.Context, key string, in workflows.PaymentInput) (string, error) {
	switch key {
	case "bad-00":
		return "", serviceerror.NewInvalidArgument("WorkflowId length exceeds limit")
	case "open-00": // an expired key's earlier payment, parked unknown for days
		return "", fmt.Errorf("%w: %w", workflows.ErrEarlierRunOpen, context.DeadlineExceeded)
	}
	return b.cluster.StartPayment(ctx, key, in)
}

// A payment Temporal refuses for a reason of its own (not because it is down or busy) does not
// hold its merchant's later payments, nor the others': it leaves the queue for the sweeper, which
// keeps trying it, and the queue goes on.
func TestDrainerPassesOverAPaymentThatCannotStart(t *testing.T) {
	a, b, o := orderMerchant(t, "bad-a"), orderMerchant(t, "bad-b"), orderMerchant(t, "bad-o")
	aKeys := queue(t, a, "bad", 3)
	bKeys := queue(t, b, "good", 8)
	oKeys := queue(t, o, "open", 3)
	c := newCluster(10 * time.Millisecond)
	d := &sweeper.Drainer{Store: db, Starter: badStarter{c}, MaxRunning: 4, Lease: time.Minute}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	defer func() { cancel(); <-done; c.idle(t) }()
	require.Eventually(t, func() bool {
		_, starts, _ := c.snapshot()
		for _, k := range slices.Concat(aKeys[1:], bKeys, oKeys[1:]) {
			if starts[k] == 0 {
				return false
			}
		}
		return true
	}, 30*time.Second, 20*time.Millisecond, "every payment but the one that cannot start")
	for _, k := range []struct {
		m   uuid.UUID
		key string
	}{{a.ID, aKeys[0]}, {o.ID, oKeys[0]}} {
		rec, err := db.Record(context.Background(), k.m, k.key)
		require.NoError(t, err)
		require.False(t, rec.Queued, "%s left to the sweeper", k.key)
		require.False(t, rec.WorkflowStarted)
	}
}

// deadStarter is a cluster on which the runs of the keys ending in -00 close before their first
// step (an operator terminated them, say): those payments stay processing, and queued.
type deadStarter struct{ *cluster }

func (d deadStarter) StartPayment(ctx context.Context, key string, in workflows.PaymentInput) (string, error) {
	if strings.HasSuffix(key, "-00") {
		d.mu.Lock()
		d.starts[key]++
		d.mu.Unlock()
		return "run", nil
	}
	return d.cluster.StartPayment(ctx, key, in)
}

func (d deadStarter) CheckPaymentRun(_ context.Context, key string, _ workflows.PaymentInput) (workflows.RunState, error) {
	if strings.HasSuffix(key, "-00") {
		return workflows.RunClosed, nil
	}
	return workflows.RunOpen, nil
}

// A payment whose run closed before its first step stays processing and queued. It must not hold
// a drainer slot for good, nor come back every lease: it is left to the sweeper (which marks it
// started, for the operators' stuck list), and the rest of the backlog drains.
func TestDrainerLeavesAPaymentWhoseRunClosedToTheSweeper(t *testing.T) {
	a, b := orderMerchant(t, "dead-a"), orderMerchant(t, "dead-b")
	aKeys := queue(t, a, "dead", 4)
	bKeys := queue(t, b, "alive", 4)
	c := newCluster(10 * time.Millisecond)
	d := &sweeper.Drainer{Store: db, Starter: deadStarter{c}, MaxRunning: 1, Lease: 300 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	defer func() { cancel(); <-done; c.idle(t) }()
	require.Eventually(t, func() bool {
		_, starts, _ := c.snapshot()
		for _, k := range slices.Concat(aKeys[1:], bKeys) {
			if starts[k] == 0 {
				return false
			}
		}
		return true
	}, 20*time.Second, 20*time.Millisecond, "every payment but the one whose run closed")
	require.Eventually(t, func() bool {
		rec, err := db.Record(context.Background(), a.ID, aKeys[0])
		return err == nil && !rec.Queued && !rec.WorkflowStarted
	}, 5*time.Second, 20*time.Millisecond, "left to the sweeper")
	time.Sleep(time.Second) // three leases more
	_, starts, _ := c.snapshot()
	require.LessOrEqual(t, starts[aKeys[0]], 2, "not claimed again every lease")
}

// A drainer that claimed a merchant's oldest payments and died before starting them leaves them
// leased: the next leader waits for that lease rather than start the merchant's later payments
// ahead of them (docs/operations.md, "Payday": nothing overtakes).
func TestDrainerAfterADeadLeaderKeepsTheMerchantsOrder(t *testing.T) {
	ctx := context.Background()
	m := orderMerchant(t, "heir")
	keys := queue(t, m, "heir", 10)
	// The leader that died had claimed the first four when it was killed.
	queues, err := db.ClaimQueued(ctx, uuid.Nil, 100, 4, 2*time.Second)
	require.NoError(t, err)
	var claimed []string
	for _, q := range queues {
		for _, p := range q {
			if p.MerchantID == m.ID {
				claimed = append(claimed, p.IdempotencyKey)
			} else { // an earlier test's leftover: not this leader's
				require.NoError(t, db.Unclaim(ctx, []uuid.UUID{p.ID}))
			}
		}
	}
	require.Equal(t, keys[:4], claimed)

	c := newCluster(10 * time.Millisecond)
	drain(t, &sweeper.Drainer{Store: db, Starter: c, MaxRunning: 4, Lease: time.Minute}, c, keys)
	order, starts, _ := c.snapshot()
	for _, k := range keys {
		require.Equal(t, 1, starts[k], "%s started once", k)
	}
	order = slices.DeleteFunc(order, func(k string) bool { return !strings.HasPrefix(k, "heir-") }) // earlier tests' leftovers
	require.Equal(t, keys, order, "the merchant's payments start in arrival order")
}

// movingStarter is a Temporal whose runs take their payment off the queue at once and finish
// when done is closed, on a task queue that a worker polls while ready says so.
type movingStarter struct {
	orderStarter
	ready atomic.Bool
	done  chan struct{}
	runs  sync.WaitGroup
}

func newMovingStarter() *movingStarter {
	s := &movingStarter{done: make(chan struct{})}
	s.ready.Store(true)
	return s
}

func (s *movingStarter) StartPayment(ctx context.Context, key string, in workflows.PaymentInput) (string, error) {
	if _, err := s.orderStarter.StartPayment(ctx, key, in); err != nil {
		return "", err
	}
	s.runs.Go(func() {
		<-s.done
		_, _ = db.Release(context.Background(), in.OperationID, "declined")
	})
	return "run", nil
}

func (s *movingStarter) Ready(context.Context) error {
	if !s.ready.Load() {
		return fmt.Errorf("%w %q", workflows.ErrNoWorker, "moved")
	}
	return nil
}

// A drainer that leads while a worker polls its task queue, and goes on leading after the
// workers left it (a change of KASA_TEMPORAL_TASK_QUEUE rolled out to the workers first, or
// every worker gone for minutes), starts nothing more there: it lets the lead go, as one that
// finds no worker when it takes the lead does (docs/operations.md, "Payday"), and a drainer
// whose queue the workers poll starts the rest.
func TestDrainerLetsTheLeadGoWhenTheWorkersLeaveItsQueue(t *testing.T) {
	m := testkit.NewMerchant(t, db, testkit.MerchantOptions{Name: "moving"})
	keys := queue(t, m, "moving", 6)
	ctx := context.Background()
	left, workers := newMovingStarter(), newMovingStarter()
	close(workers.done)
	run := func(st *movingStarter) {
		run, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			(&sweeper.Drainer{Store: db, Starter: st, MaxRunning: 2, Lease: 300 * time.Millisecond}).Run(run)
		}()
		t.Cleanup(func() { stop(); <-done })
	}
	run(left)
	require.Eventually(t, func() bool { return len(left.snapshot()) == 2 }, 10*time.Second, 20*time.Millisecond,
		"the first drainer leads and fills its two slots")
	run(workers) // stands by

	left.ready.Store(false) // the workers leave its queue
	time.Sleep(4 * time.Second)
	close(left.done) // its two runs finish, freeing their slots
	assert.Eventually(t, func() bool {
		n, _, err := db.QueuedBacklog(ctx)
		return err == nil && n == 0 && len(workers.snapshot()) == len(keys)-2
	}, 20*time.Second, 20*time.Millisecond, "the drainer on the workers' queue starts the rest")
	require.Equal(t, keys[:2], left.snapshot(), "nothing more started where no worker polls")
	require.Equal(t, keys[2:], workers.snapshot(), "the rest, in order, where the workers are")
	left.runs.Wait()
	workers.runs.Wait()
}
