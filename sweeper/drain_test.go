package sweeper_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/sweeper"
	"github.com/kasa-pay/kasa/tools/testkit"
	"github.com/kasa-pay/kasa/workflows"
)

// cluster is a Temporal that runs each started payment for latency and fails it (the store's
// Release), recording the order of the starts and how many ran at once.
type cluster struct {
	latency time.Duration

	mu      sync.Mutex
	order   []string       // keys, as started
	starts  map[string]int // per key
	running int            // runs not yet leaving processing: at most the drainer's MaxRunning
	peak    int
	live    int // runs whose last step has not returned: none once the test is idle
}

func newCluster(latency time.Duration) *cluster {
	return &cluster{latency: latency, starts: map[string]int{}}
}

func (c *cluster) StartPayment(_ context.Context, key string, in workflows.PaymentInput) (string, error) {
	c.mu.Lock()
	c.order = append(c.order, key)
	c.starts[key]++
	c.running++
	c.live++
	c.peak = max(c.peak, c.running)
	c.mu.Unlock()
	go func() {
		time.Sleep(c.latency)
		// No longer counted just before it leaves processing, as a workflow's last step does: the
		// drainer may fill the slot as soon as that commits, so counted after it, a run would
		// overlap the next one here without ever doing so in the database (peak 6 of 5 under load).
		c.mu.Lock()
		c.running--
		c.mu.Unlock()
		_, err := db.Release(context.Background(), in.OperationID, "declined")
		c.mu.Lock()
		defer c.mu.Unlock()
		c.live--
		if err != nil {
			panic(err)
		}
	}()
	return "run", nil
}

// CheckPaymentRun: a run closes only once its payment has left processing.
func (c *cluster) CheckPaymentRun(context.Context, string, workflows.PaymentInput) (workflows.RunState, error) {
	return workflows.RunOpen, nil
}

func (c *cluster) StartRefund(context.Context, string, workflows.RefundInput) (string, error) {
	return "", fmt.Errorf("no refund is queued")
}

// idle waits until every payment started on c has run: none of its runs outlives the test.
func (c *cluster) idle(t *testing.T) {
	require.Eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.live == 0
	}, 10*time.Second, 10*time.Millisecond)
}

func (c *cluster) snapshot() ([]string, map[string]int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.order), maps.Clone(c.starts), c.peak
}

// queue begins n payments of m queued in the start backlog, in order, under key prefix+i.
func queue(t *testing.T, m testkit.Merchant, prefix string, n int) []string {
	t.Helper()
	var keys []string
	for i := range n {
		key := fmt.Sprintf("%s-%02d", prefix, i)
		req := payment.Request{InvoiceID: key, AmountMinor: 100, Currency: "TRY", AccountID: m.Account, PaymentType: "purchase"}
		rec, _, began, err := db.Begin(context.Background(), store.BeginInput{MerchantID: m.ID, Key: key, Request: req,
			OperationID: payment.NewID(), Lease: time.Minute, Queue: true})
		require.NoError(t, err)
		require.Equal(t, store.BeganNew, began)
		require.True(t, rec.Queued)
		keys = append(keys, key)
	}
	// The tests share a database, and a drainer that takes the lead counts the drained payments
	// still processing as its own running ones: those a test's fake runs never finish would hold
	// the slots of every later test's drainer. (No test here runs in parallel.)
	t.Cleanup(func() {
		ps, err := db.DrainedProcessing(context.Background())
		require.NoError(t, err)
		for _, p := range ps {
			_, err := db.Release(context.Background(), p.ID, "declined")
			require.NoError(t, err)
		}
	})
	return keys
}

// drain runs d until every key in keys has started and left processing.
func drain(t *testing.T, d *sweeper.Drainer, c *cluster, keys []string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	defer func() { cancel(); <-done }()
	require.Eventually(t, func() bool {
		_, starts, _ := c.snapshot()
		for _, k := range keys {
			if starts[k] == 0 {
				return false
			}
		}
		return true
	}, 60*time.Second, 20*time.Millisecond, "every queued payment starts")
	require.Eventually(t, func() bool {
		n, _, err := db.QueuedBacklog(context.Background())
		c.mu.Lock()
		defer c.mu.Unlock()
		return err == nil && n == 0 && c.live == 0
	}, 10*time.Second, 20*time.Millisecond, "the backlog is empty and every payment ran")
	// The drainer saves its rate once a second: a backlog drained within the first second
	// would otherwise end the drainer before it recorded any.
	require.Eventually(t, func() bool {
		st, err := db.BacklogState(context.Background())
		return err == nil && st.DrainPerSecond > 0
	}, 5*time.Second, 20*time.Millisecond, "the drainer records its rate")
}

// Merchant A queues 30 payments, then merchant B 5. The drainer keeps at most 4 running, starts
// each merchant's in the order they arrived, and B's in turn with A's: after A's first claim (B is
// not yet known), each merchant gets its share of the slots that free, one at a time (short runs)
// or four at once (long runs started together), so B's five have started by the 14th start.
func TestDrainerStartsMerchantsInTurnEachInArrivalOrder(t *testing.T) {
	for _, latency := range []time.Duration{30 * time.Millisecond, 300 * time.Millisecond} {
		t.Run(latency.String(), func(t *testing.T) {
			a := testkit.NewMerchant(t, db, testkit.MerchantOptions{Name: "a"})
			b := testkit.NewMerchant(t, db, testkit.MerchantOptions{Name: "b"})
			aKeys := queue(t, a, "a", 30)
			bKeys := queue(t, b, "b", 5)

			c := newCluster(latency)
			d := &sweeper.Drainer{Store: db, Starter: c, MaxRunning: 4, Lease: time.Minute}
			drain(t, d, c, append(slices.Clone(aKeys), bKeys...))

			order, starts, peak := c.snapshot()
			for k, n := range starts {
				require.Equal(t, 1, n, "%s started once", k)
			}
			require.LessOrEqual(t, peak, 4, "never more running than MaxRunning")
			var aOrder, bOrder []string
			for _, k := range order {
				if k[0] == 'a' {
					aOrder = append(aOrder, k)
				} else {
					bOrder = append(bOrder, k)
				}
			}
			require.Equal(t, aKeys, aOrder, "A's in arrival order")
			require.Equal(t, bKeys, bOrder, "B's in arrival order")
			lastB := slices.Index(order, bKeys[len(bKeys)-1])
			t.Logf("start order: %v", order)
			// Four of A's, then A and B in turn: B's last is the 13th start, the 14th at most.
			require.LessOrEqual(t, lastB, 13, "B's five started in turn with A's (last at %d)", lastB)

			st, err := db.BacklogState(context.Background())
			require.NoError(t, err)
			require.Positive(t, st.DrainPerSecond, "the drainer records its rate")
		})
	}
}

// A drainer that claimed payments and died before starting them leaves them queued and leased:
// the next drainer takes them again once the lease runs out, the sweeper running beside it
// starts none of them, and each payment starts once.
func TestDrainerDiedWhileDraining(t *testing.T) {
	ctx := context.Background()
	m := testkit.NewMerchant(t, db, testkit.MerchantOptions{Name: "c"})
	keys := queue(t, m, "c", 20)
	// The drainer that died: it had claimed the first six when it was killed.
	queues, err := db.ClaimQueued(ctx, uuid.Nil, 1, 6, 300*time.Millisecond)
	require.NoError(t, err)
	require.Len(t, queues, 1)
	require.Len(t, queues[0], 6)
	for i, p := range queues[0] {
		require.Equal(t, keys[i], p.IdempotencyKey, "the oldest first")
	}

	c := newCluster(10 * time.Millisecond)
	sw := &sweeper.Sweeper{Store: db, Starter: c, Interval: 100 * time.Millisecond, Lease: time.Minute, Merchant: &m.ID}
	sctx, stop := context.WithCancel(ctx)
	swept := make(chan struct{})
	go func() { defer close(swept); sw.Run(sctx) }()
	defer func() { stop(); <-swept }()
	drain(t, &sweeper.Drainer{Store: db, Starter: c, MaxRunning: 4}, c, keys)

	_, starts, _ := c.snapshot()
	for _, k := range keys {
		require.Equal(t, 1, starts[k], "%s started once", k)
	}
}

// One drainer leads at a time: a second one stands by while the first holds the lead.
func TestOneDrainerLeads(t *testing.T) {
	ctx := context.Background()
	ok, _, release, err := db.Lead(ctx, "test-lead")
	require.NoError(t, err)
	require.True(t, ok)
	again, _, _, err := db.Lead(ctx, "test-lead")
	require.NoError(t, err)
	require.False(t, again, "the lead is held")
	release()
	ok, _, release, err = db.Lead(ctx, "test-lead")
	require.NoError(t, err)
	require.True(t, ok, "released, it can be taken again")
	release()
}

// Six merchants with six queued payments each, five slots: the claims, however the free slots
// divide among the merchants, never start more than five at once.
func TestDrainerNeverRunsMoreThanMaxRunning(t *testing.T) {
	var keys []string
	for i := range 6 {
		m := testkit.NewMerchant(t, db, testkit.MerchantOptions{Name: fmt.Sprintf("peak-%d", i)})
		keys = append(keys, queue(t, m, fmt.Sprintf("peak%d", i), 6)...)
	}
	c := newCluster(300 * time.Millisecond)
	d := &sweeper.Drainer{Store: db, Starter: c, MaxRunning: 5, Lease: time.Minute}
	drain(t, d, c, keys)
	_, starts, peak := c.snapshot()
	for k, n := range starts {
		require.Equal(t, 1, n, "%s started once", k)
	}
	require.LessOrEqual(t, peak, 5, "never more running than MaxRunning")
}

// slowStart is a Temporal whose runs take their payment off the queue only after firstStep (the
// workers are busy), so the drainer's lease runs out and it claims and starts them again: the
// start of a run that exists starts nothing.
type slowStart struct {
	firstStep time.Duration
	mu        sync.Mutex
	runs      map[string]bool
}

func (c *slowStart) StartPayment(_ context.Context, key string, in workflows.PaymentInput) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runs[key] {
		return "run", nil
	}
	c.runs[key] = true
	go func() {
		time.Sleep(c.firstStep)
		_ = db.WorkflowStarted(context.Background(), in.OperationID)
		_, _ = db.Release(context.Background(), in.OperationID, "declined")
	}()
	return "run", nil
}

func (c *slowStart) CheckPaymentRun(context.Context, string, workflows.PaymentInput) (workflows.RunState, error) {
	return workflows.RunOpen, nil
}

func (c *slowStart) StartRefund(context.Context, string, workflows.RefundInput) (string, error) {
	return "", fmt.Errorf("no refund is queued")
}

// kasa_backlog_started_total counts each queued payment once, however often its lease ran out.
func TestDrainerCountsEachStartOnce(t *testing.T) {
	m := testkit.NewMerchant(t, db, testkit.MerchantOptions{Name: "slow"})
	keys := queue(t, m, "slow", 3)
	reg := prometheus.NewRegistry()
	d := &sweeper.Drainer{Store: db, Starter: &slowStart{firstStep: 2 * time.Second, runs: map[string]bool{}}, MaxRunning: 10,
		Lease: 300 * time.Millisecond, Registerer: reg}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	defer func() { cancel(); <-done }()
	require.Eventually(t, func() bool {
		n, _, err := db.QueuedBacklog(context.Background())
		return err == nil && n == 0
	}, 20*time.Second, 20*time.Millisecond)
	require.Equal(t, float64(len(keys)), gathered(t, reg, "kasa_backlog_started_total"), "each queued payment counted once")
}

// gathered is the value of the counter name in reg.
func gathered(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// hangingReads is a Temporal that starts payments (whose runs never finish) and never answers
// whether a run has closed: each read lasts until its timeout.
type hangingReads struct{ slowStart }

func (h *hangingReads) StartPayment(context.Context, string, workflows.PaymentInput) (string, error) {
	return "run", nil
}

func (h *hangingReads) CheckPaymentRun(ctx context.Context, _ string, _ workflows.PaymentInput) (workflows.RunState, error) {
	<-ctx.Done()
	return workflows.RunOpen, ctx.Err()
}

// A Temporal slow to say whether runs closed does not hold the drainer: it keeps saving its
// record every second or so (else the APIs read its rate as 0, docs/operations.md "Payday").
func TestDrainerKeepsItsRecordWhileReadsOfRunsHang(t *testing.T) {
	m := testkit.NewMerchant(t, db, testkit.MerchantOptions{Name: "hanging"})
	queue(t, m, "hang", 12)
	d := &sweeper.Drainer{Store: db, Starter: &hangingReads{}, MaxRunning: 12, Lease: 200 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	defer func() { cancel(); <-done }()
	time.Sleep(2 * time.Second) // started, and their runs' reads due
	for deadline := time.Now().Add(8 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		st, err := db.BacklogState(context.Background())
		require.NoError(t, err)
		require.Less(t, st.Age, 5*time.Second, "the drainer's record is current")
	}
	// The payments stay queued (their runs never took them): leave none for the next tests.
	cancel()
	<-done
	queues, err := db.ClaimQueued(context.Background(), uuid.Nil, 1, 12, time.Hour)
	require.NoError(t, err)
	for _, q := range queues {
		var ids []uuid.UUID
		for _, p := range q {
			ids = append(ids, p.ID)
		}
		require.NoError(t, db.Unqueue(context.Background(), ids))
	}
}

// held is a Temporal whose runs take their payment off the queue at once (their first step) and
// then keep it processing until the test lets them finish, counting how many are processing.
type held struct {
	mu      sync.Mutex
	starts  map[string]int
	order   []string
	running int
	peak    int
	finish  chan struct{}
	live    sync.WaitGroup
}

func newHeld() *held { return &held{starts: map[string]int{}, finish: make(chan struct{})} }

func (h *held) StartPayment(_ context.Context, key string, in workflows.PaymentInput) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.starts[key]++
	if h.starts[key] > 1 {
		return "run", nil // the run exists: its start starts nothing
	}
	h.order = append(h.order, key)
	h.running++
	h.peak = max(h.peak, h.running)
	h.live.Add(1)
	go func() {
		defer h.live.Done()
		if err := db.WorkflowStarted(context.Background(), in.OperationID); err != nil {
			panic(err)
		}
		<-h.finish
		h.mu.Lock()
		h.running--
		h.mu.Unlock()
		if _, err := db.Release(context.Background(), in.OperationID, "declined"); err != nil {
			panic(err)
		}
	}()
	return "run", nil
}

func (h *held) CheckPaymentRun(context.Context, string, workflows.PaymentInput) (workflows.RunState, error) {
	return workflows.RunOpen, nil
}

func (h *held) StartRefund(context.Context, string, workflows.RefundInput) (string, error) {
	return "", fmt.Errorf("no refund is queued")
}

func (h *held) snapshot() (order []string, starts map[string]int, running, peak int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.order), maps.Clone(h.starts), h.running, h.peak
}

// A new leader counts the payments the last one started that are still processing: across a
// change of leader (the last one died, froze, or let the lead go) at most MaxRunning of the
// drained payments process at once, not MaxRunning more.
func TestNewLeaderCountsTheLastLeadersRunningPayments(t *testing.T) {
	ctx := context.Background()
	m := testkit.NewMerchant(t, db, testkit.MerchantOptions{Name: "takeover"})
	keys := queue(t, m, "takeover", 10)
	h := newHeld()
	defer h.live.Wait()
	finished := false
	finish := func() {
		if !finished {
			finished = true
			close(h.finish)
		}
	}
	defer finish()

	lead := func(d *sweeper.Drainer) (stop func()) {
		dctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); d.Run(dctx) }()
		return func() { cancel(); <-done }
	}
	// The first leader starts four, whose runs take them off the queue and keep processing.
	stopFirst := lead(&sweeper.Drainer{Store: db, Starter: h, MaxRunning: 4, Lease: time.Minute})
	require.Eventually(t, func() bool {
		_, _, running, _ := h.snapshot()
		n, _, err := db.QueuedBacklog(ctx)
		return err == nil && running == 4 && n == int64(len(keys)-4)
	}, 10*time.Second, 10*time.Millisecond, "the first leader started four, off the queue")
	stopFirst() // it dies: its session, and the lead, end

	stopSecond := lead(&sweeper.Drainer{Store: db, Starter: h, MaxRunning: 4, Lease: time.Minute})
	defer func() { stopSecond() }()
	time.Sleep(3 * time.Second) // the second leader took the lead and claimed, had it room
	_, _, running, peak := h.snapshot()
	require.Equal(t, 4, peak, "at most MaxRunning of the drained payments processing across the change of leader (%d now)", running)

	// The first four finish: the second leader drains the rest, each once, in arrival order.
	finish()
	require.Eventually(t, func() bool {
		n, _, err := db.QueuedBacklog(ctx)
		_, _, running, _ := h.snapshot()
		return err == nil && n == 0 && running == 0
	}, 20*time.Second, 20*time.Millisecond, "the backlog drains")
	order, starts, _, peak := h.snapshot()
	require.Equal(t, keys, order, "in arrival order")
	for _, k := range keys {
		require.Equal(t, 1, starts[k], "%s started once", k)
	}
	require.LessOrEqual(t, peak, 4)
}
