package sweeper

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"go.temporal.io/api/serviceerror"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/workflows"
)

// Backlog is what the drainer reads and claims of the start backlog.
type Backlog interface {
	Store
	Lead(ctx context.Context, name string) (ok bool, held func(context.Context) bool, release func(), err error)
	ClaimQueued(ctx context.Context, after uuid.UUID, merchants, perMerchant int, lease time.Duration) ([][]payment.Payment, error)
	Unclaim(ctx context.Context, ids []uuid.UUID) error
	Unqueue(ctx context.Context, ids []uuid.UUID) error
	QueuedLeased(ctx context.Context) (bool, error)
	StillProcessing(ctx context.Context, ids []uuid.UUID) ([]uuid.UUID, error)
	DrainedProcessing(ctx context.Context) ([]payment.Payment, error)
	QueuedBacklog(ctx context.Context) (int64, time.Time, error)
	SaveBacklogState(ctx context.Context, b store.BacklogState) error
}

// RunStarter starts queued payments' workflows, and reads a payment's run: closed, open, or
// moved here from a task queue nobody polls (workflows.Starter.CheckPaymentRun).
type RunStarter interface {
	StartPayment(ctx context.Context, key string, in workflows.PaymentInput) (runID string, err error)
	CheckPaymentRun(ctx context.Context, key string, in workflows.PaymentInput) (workflows.RunState, error)
}

// Drainer starts the payments the API queued while workflows could not start as fast as they
// arrived (docs/operations.md, "Payday"). One drainer leads at a time, whichever process takes
// the lead first; the others stand by. It keeps at most MaxRunning of the payments drainers
// started processing (the last leader's too), so it starts them at the rate the cluster
// finishes them, and it takes them merchants in turn, each merchant's in arrival order.
type Drainer struct {
	Store      Backlog
	Starter    RunStarter
	MaxRunning int           // drained payments started and still processing; default 64
	Lease      time.Duration // a claimed payment's lease; default 30s
	Logger     *slog.Logger
	// Concurrency is how many merchants' payments start at once; a merchant's start one after
	// another, in order. Default 8.
	Concurrency int
	Registerer  prometheus.Registerer // for kasa_backlog_started_total; nil: not exported

	started prometheus.Counter
}

// leadName is the advisory lock the drainers take turns on.
const leadName = "backlog-drainer"

const (
	activeEvery  = 100 * time.Millisecond // between claims while there is work
	idleEvery    = time.Second            // between claims of an empty backlog, and state saves
	standbyEvery = 2 * time.Second        // between a standby drainer's tries to lead
	readyEvery   = 2 * time.Second        // between a leader's reads of whether a worker polls
	drainWindow  = 10 * time.Second       // the drain rate is the starts within it
	// readRunTimeout bounds reading whether a started payment's run has closed.
	readRunTimeout = 2 * time.Second
	// claimTimeout bounds a claim of queued payments, which a stop lets finish.
	claimTimeout = 10 * time.Second
)

// Run drains until ctx ends, leading whenever it can.
func (d *Drainer) Run(ctx context.Context) {
	d.defaults()
	unready := false // logged once until a worker polls again
	for ctx.Err() == nil {
		ok, held, release, err := d.Store.Lead(ctx, leadName)
		if err != nil && ctx.Err() == nil {
			d.Logger.Warn("backlog drainer: take the lead", "error", err)
		}
		if ok {
			if err := ready(ctx, d.Starter); err != nil {
				// Another process, whose task queue a worker polls, may take the lead.
				release()
				if !unready && ctx.Err() == nil {
					d.Logger.Warn("backlog drainer: not draining the start backlog here", "error", err)
				}
				unready = true
			} else {
				d.Logger.Info("backlog drainer leads")
				err := d.lead(ctx, held)
				release()
				if unready = err != nil; unready {
					d.Logger.Warn("backlog drainer: not draining the start backlog here", "error", err)
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(standbyEvery):
		}
	}
}

func (d *Drainer) defaults() {
	if d.MaxRunning <= 0 {
		d.MaxRunning = 64
	}
	if d.Lease == 0 {
		d.Lease = 30 * time.Second
	}
	if d.Concurrency <= 0 {
		d.Concurrency = 8
	}
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	d.started = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kasa_backlog_started_total", Help: "Queued payments whose workflows the backlog drainer started.",
	})
	if d.Registerer != nil {
		if err := d.Registerer.Register(d.started); err != nil {
			d.Logger.Warn("backlog drainer: metrics", "error", err)
		}
	}
}

// lead drains while it holds the lead, ctx lasts and a worker polls the task queue. It returns
// the readiness error that ended it: the workers left this process's task queue (a change of it
// rolled out to them first), or are all gone, and what it started now would wait where no
// worker may ever run it; another process, whose queue a worker polls, may take the lead.
func (d *Drainer) lead(ctx context.Context, held func(context.Context) bool) error {
	var (
		running   = map[uuid.UUID]*slot{} // payments drainers started, processing when last read
		after     uuid.UUID               // the merchant whose turn was last
		merchants = 1                     // how many merchants had queued payments in the last round
		seen      = 0                     // merchants claimed from in this round of turns so far
		starts    []time.Time             // within drainWindow
		saved     time.Time
		checked   = time.Now() // whether a worker polls: Run asked just before
		// The last leader may have died with payments claimed and not yet started: until their
		// leases run out, a claim would take each merchant's later payments ahead of them.
		inherited = true
		// The payments the last leader (or this process, before it lost the lead) started that
		// still process hold their slots here too: else up to MaxRunning more would run at once.
		adopted = false
	)
	for ctx.Err() == nil {
		now := time.Now()
		if now.Sub(saved) >= idleEvery {
			if !held(ctx) {
				d.Logger.Warn("backlog drainer lost the lead")
				return nil
			}
			if now.Sub(checked) >= readyEvery {
				checked = now
				// Only a definite answer lets the lead go: Temporal slow to answer under a
				// payday's load is no reason to, and the starts say when it is away.
				rctx, cancel := context.WithTimeout(ctx, readRunTimeout)
				err := ready(rctx, d.Starter)
				cancel()
				if errors.Is(err, workflows.ErrNoWorker) {
					return err
				}
			}
			starts = trimBefore(starts, now.Add(-drainWindow))
			d.saveState(ctx, drainRate(starts, now))
			saved = now
		}
		if !adopted {
			ps, err := d.Store.DrainedProcessing(ctx)
			if err != nil {
				d.pause(ctx, "read the last leader's running payments", err)
				continue
			}
			for _, p := range ps {
				running[p.ID] = &slot{p: p, check: now.Add(d.Lease)}
			}
			adopted = true
		}
		still, err := d.Store.StillProcessing(ctx, slices.Collect(maps.Keys(running)))
		if err != nil {
			d.pause(ctx, "read running payments", err)
			continue
		}
		maps.DeleteFunc(running, func(id uuid.UUID, _ *slot) bool { return !slices.Contains(still, id) })
		d.leaveClosed(ctx, running)
		if inherited {
			leased, err := d.Store.QueuedLeased(ctx)
			if err != nil {
				d.pause(ctx, "read the last leader's claims", err)
				continue
			}
			inherited = leased
		}
		free := d.MaxRunning - len(running)
		claimed := 0
		if free > 0 && !inherited {
			// As many merchants as had queued payments last time, each with its share of the
			// free slots (rounded down: a claim never leases more than are free).
			n := min(merchants, free)
			per := free / n
			// A claim commits in the database even when a stop gives up on its answer: it is read
			// whatever the stop, and what a stopping drainer took goes back to its queue at once,
			// none started, rather than leased to no one until the lease runs out.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
			queues, err := d.Store.ClaimQueued(cctx, after, n, per, d.Lease)
			cancel()
			if err == nil && ctx.Err() != nil {
				d.put(ctx, d.Store.Unclaim, slices.Concat(queues...), "put payments back in their queue")
				return nil
			}
			if err != nil {
				// The claim may have committed with its answer lost: payments leased to no one
				// this drainer knows, which the next claim would skip. It waits for their
				// leases to run out, as for a last leader's.
				inherited = true
				d.pause(ctx, "claim queued payments", err)
				continue
			}
			claimed = len(queues)
			seen += claimed
			switch {
			case claimed == 0 && after != uuid.Nil:
				// Past the last merchant: start over from the first, sharing the slots among as
				// many as the round met (not only this claim's), or the first would take them all.
				after, merchants, seen = uuid.Nil, max(1, seen), 0
				continue
			case len(queues) == n:
				after = queues[n-1][0].MerchantID // more merchants may follow: theirs is the next turn
				merchants = min(2*n, d.MaxRunning)
			default:
				after, merchants, seen = uuid.Nil, max(1, seen), 0
			}
			ok, failed, leftLeased := d.start(ctx, queues)
			if leftLeased {
				// A merchant's payments it could not put back stay leased to no claim of its
				// own: it waits for their leases, as for a last leader's, rather than start
				// the merchant's later payments ahead of them.
				inherited = true
			}
			for _, r := range ok {
				if running[r.p.ID] != nil { // claimed again after its lease: its start was a no-op
					continue
				}
				running[r.p.ID] = &slot{p: r.p, check: time.Now().Add(d.Lease)}
				// Only a run the start made drains the backlog: one the last leader started, and
				// claimed again here once its lease ran out before its first step, holds a slot
				// (and is moved, should it wait where no worker polls) but is no start of ours.
				if r.created {
					starts = append(starts, time.Now())
					d.started.Inc()
				}
			}
			if failed {
				// Temporal refuses starts: the payments wait in their queues, and the next
				// claim comes after a pause, not at once.
				d.pause(ctx, "start queued payments", errStartsFailing)
				continue
			}
		}
		every := activeEvery
		if claimed == 0 && len(running) == 0 {
			every = idleEvery
		}
		select {
		case <-ctx.Done():
		case <-time.After(every):
		}
	}
	return nil
}

// start starts the claimed payments, a merchant's one after another in order, and returns the
// ones that started, and whether Temporal refused a start for being down or busy. Then the
// merchant's remaining claims go back to its queue, that payment first, so that none overtakes
// another. A start refused for a reason of the payment's own (an id past the server's limits, an
// earlier run of its key still open) leaves that payment to the sweeper instead, and the queue
// goes on: one payment never holds its merchant up. A started one is not marked so: its
// workflow's first step takes it off the queue, and should the lease run out before, the next
// claim's start finds the run and starts nothing. leftLeased says some payments it could not put
// back in their queue stay leased.
func (d *Drainer) start(ctx context.Context, queues [][]payment.Payment) (started []startedRun, failed, leftLeased bool) {
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		sem = make(chan struct{}, d.Concurrency)
	)
	for _, queue := range queues {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			for i, p := range queue {
				created, err := d.startPayment(ctx, p)
				if err != nil {
					if ctx.Err() == nil {
						d.Logger.Warn("backlog drainer: start", "operation_id", p.ID, "error", err)
					}
					if !refusedForNow(ctx, err) {
						d.put(ctx, d.Store.Unqueue, queue[i:i+1], "leave a payment that cannot start to the sweeper")
						continue
					}
					put := d.put(ctx, d.Store.Unclaim, queue[i:], "put payments back in their queue")
					mu.Lock()
					failed = true
					leftLeased = leftLeased || !put
					mu.Unlock()
					return
				}
				mu.Lock()
				started = append(started, startedRun{p: p, created: created})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return started, failed, leftLeased
}

// startedRun is a payment whose start succeeded, and whether that start made its run.
type startedRun struct {
	p       payment.Payment
	created bool
}

// creator is a starter that says whether a start made the run, or found it already there
// (workflows.Starter does).
type creator interface {
	StartPaymentRun(ctx context.Context, key string, in workflows.PaymentInput) (runID string, created bool, err error)
}

// startPayment starts p's run and says whether it made it; a starter that cannot say is taken
// to have made it.
func (d *Drainer) startPayment(ctx context.Context, p payment.Payment) (bool, error) {
	if c, ok := d.Starter.(creator); ok {
		_, created, err := c.StartPaymentRun(ctx, p.IdempotencyKey, workflows.InputFor(p))
		return created, err
	}
	_, err := d.Starter.StartPayment(ctx, p.IdempotencyKey, workflows.InputFor(p))
	return true, err
}

// slot is a payment a drainer started, holding one of MaxRunning while it processes.
type slot struct {
	p     payment.Payment
	check time.Time // when to read whether its run has closed
}

// leaveClosed frees the slots of payments whose runs closed while they were still processing (an
// operator terminated one before its first step, say), asking a lease after the start and every
// lease after that. One still queued goes to the sweeper, which marks it started for the
// operators' stuck list: left queued, it would be claimed again every lease. A run that waits,
// never having taken a step, on another task queue that no worker polls (a leader started it
// there while the workers were leaving that queue) is started again on this drainer's: left
// there, it would hold its slot for good and never run.
func (d *Drainer) leaveClosed(ctx context.Context, running map[uuid.UUID]*slot) {
	// At most Concurrency reads a pass, side by side: a slow Temporal holds the loop (and the
	// record it saves every second) for one readRunTimeout at most.
	now := time.Now()
	var due []*slot
	for _, s := range running {
		if !now.Before(s.check) && len(due) < d.Concurrency {
			s.check = now.Add(d.Lease)
			due = append(due, s)
		}
	}
	state := make([]workflows.RunState, len(due))
	var wg sync.WaitGroup
	for i, s := range due {
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, readRunTimeout)
			defer cancel()
			var err error
			state[i], err = d.Starter.CheckPaymentRun(rctx, s.p.IdempotencyKey, workflows.InputFor(s.p))
			switch {
			case err != nil && ctx.Err() == nil:
				d.Logger.Warn("backlog drainer: read a payment's run", "operation_id", s.p.ID, "error", err)
			case state[i] == workflows.RunMoved:
				d.Logger.Warn("backlog drainer: a payment's run waited on a task queue no worker polls; started it again here", "operation_id", s.p.ID)
			}
		})
	}
	wg.Wait()
	for i, s := range due {
		if state[i] == workflows.RunClosed {
			d.Logger.Warn("backlog drainer: a payment's run closed while it was processing; leaving it to the sweeper", "operation_id", s.p.ID)
			d.put(ctx, d.Store.Unqueue, []payment.Payment{s.p}, "leave a payment whose run closed to the sweeper")
			delete(running, s.p.ID)
		}
	}
}

// put hands payments back, to their queue or to the sweeper, and says whether it did; should that
// fail, their leases run out and the next claim takes them.
func (d *Drainer) put(ctx context.Context, to func(context.Context, []uuid.UUID) error, ps []payment.Payment, what string) bool {
	ids := make([]uuid.UUID, len(ps))
	for i, p := range ps {
		ids[i] = p.ID
	}
	// A stop lets it finish, within a bound: a stalled database leaves them to their leases.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
	defer cancel()
	if err := to(pctx, ids); err != nil {
		d.Logger.Warn("backlog drainer: "+what, "error", err)
		return false
	}
	return true
}

// refusedForNow says a start failed because Temporal cannot take starts now (down, slow, rate
// limited), or because this drainer is stopping: the payments wait in their queues.
func refusedForNow(ctx context.Context, err error) bool {
	var exhausted *serviceerror.ResourceExhausted
	if ctx.Err() == nil && errors.Is(err, workflows.ErrEarlierRunOpen) {
		return false // the payment's own wait, which may last days (an unknown earlier payment)
	}
	return ctx.Err() != nil || workflows.IsUnavailable(err) || errors.As(err, &exhausted)
}

// errStartsFailing: Temporal refused a start (its error is logged with the payment).
var errStartsFailing = errors.New("a start failed; the payments wait in their queues")

// saveState records the backlog for the API's admission and the dashboard.
func (d *Drainer) saveState(ctx context.Context, drain float64) {
	n, oldest, err := d.Store.QueuedBacklog(ctx)
	if err == nil {
		err = d.Store.SaveBacklogState(ctx, store.BacklogState{Queued: n, Oldest: oldest, DrainPerSecond: drain})
	}
	if err != nil && ctx.Err() == nil {
		d.Logger.Warn("backlog drainer: save state", "error", err)
	}
}

func (d *Drainer) pause(ctx context.Context, what string, err error) {
	if ctx.Err() != nil {
		return
	}
	d.Logger.Warn("backlog drainer: "+what, "error", err)
	select {
	case <-ctx.Done():
	case <-time.After(idleEvery):
	}
}

// drainRate is starts per second over the window, or over the time since the first of them
// when that is shorter (at least a second): a drain that began a moment ago is not slow.
func drainRate(starts []time.Time, now time.Time) float64 {
	if len(starts) == 0 {
		return 0
	}
	over := min(drainWindow, max(now.Sub(starts[0]), time.Second))
	return float64(len(starts)) / over.Seconds()
}

func trimBefore(ts []time.Time, cut time.Time) []time.Time {
	i := 0
	for i < len(ts) && ts[i].Before(cut) {
		i++
	}
	return ts[i:]
}
