package api

import (
	"context"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/store"
)

// Backlog is the payday admission of new payments (docs/operations.md, "Payday"). This process
// starts at most MaxRunning payments and waits for their outcomes at once; a payment past that,
// or one whose merchant has payments queued, is queued: committed as usual, answered 202 at
// once, and started later by the backlog's drainer. Past the backlog's bound a new payment is
// refused with 503 before anything is written.
type Backlog struct {
	// State is the drainer's record of the backlog; nil: no backlog, every payment starts here.
	State interface {
		BacklogState(ctx context.Context) (store.BacklogState, error)
		MerchantQueued(ctx context.Context, merchant uuid.UUID) (bool, error) // asked only past the bound
	}
	MaxRunning int           // payments this process runs at once; 0: no limit (nothing queued)
	MaxQueued  int64         // the backlog's bound in payments; 0: none
	MaxWait    time.Duration // the bound in time: how long the backlog takes to drain at its rate; 0: none
}

// stateEvery is how often the API reads the drainer's record: at most one request in that time
// pays for the read.
const stateEvery = 500 * time.Millisecond

// backlogFresh is how old the drainer's record may be and still count what this process queued
// before the drainer saved it (it saves it every second; the store counts the queue itself past
// 2 s).
const backlogFresh = 2 * time.Second

// drainerGone is how old the drainer's record may be while a drainer leads (it saves it every
// second): an older one's rate is no drainer's, and reads 0.
const drainerGone = 30 * time.Second

// admission holds this process's running payments, per merchant, and the backlog as last read.
type admission struct {
	Backlog
	merchants *perKey // running payments per merchant, up to its share

	mu      sync.Mutex
	running int
	state   store.BacklogState
	read    time.Time
	// When this process queued the payments state may not count, in order: a burst counts at
	// once, and so do the payments queued between the drainer's save and this process's read.
	queued []time.Time
}

func newAdmission(b Backlog, share float64) *admission {
	return &admission{Backlog: b, merchants: newPerKey(merchantShare(b.MaxRunning, share))}
}

// merchantShare is the part share of n that one merchant may hold, rounded down but at least 1;
// share outside (0, 1) is all of n. Rounded up, a share below 1 could be every slot (0.9 of 8),
// and one busy merchant would leave the others none. The epsilon absorbs float64's error
// (100 × 0.29 is 28.999999999999996).
func merchantShare(n int, share float64) int {
	if share <= 0 || share >= 1 {
		return n
	}
	return max(1, min(n-1, int(math.Floor(float64(n)*share+1e-9))))
}

// queues reports whether payments past MaxRunning are queued at all.
func (a *admission) queues() bool { return a.MaxRunning > 0 && a.State != nil }

// take gives merchant one of this process's running slots, or says to queue the payment.
func (a *admission) take(merchant uuid.UUID) bool {
	if !a.queues() {
		return true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.running >= a.MaxRunning || !a.merchants.acquire(merchant) {
		return false
	}
	a.running++
	return true
}

// give returns merchant's slot.
func (a *admission) give(merchant uuid.UUID) {
	if !a.queues() {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.running--
	a.merchants.release(merchant)
}

// backlog is the drainer's record, read again when stateEvery has passed; none without a backlog.
func (a *admission) backlog(ctx context.Context) store.BacklogState {
	if a.State == nil {
		return store.BacklogState{}
	}
	a.mu.Lock()
	if time.Since(a.read) < stateEvery {
		defer a.mu.Unlock()
		st := a.state
		st.Queued += int64(len(a.queued))
		return st
	}
	asked := time.Now()
	a.read = asked // the other requests keep the last state meanwhile
	a.mu.Unlock()
	st, err := a.State.BacklogState(ctx)
	a.mu.Lock()
	defer a.mu.Unlock()
	if err == nil {
		if st.Age > drainerGone {
			st.DrainPerSecond = 0
		}
		// The queue counted now holds what this process queued before it asked; a record saved
		// lately, what it queued before the drainer counted (st.Age before the answer, so
		// before asked-st.Age at the latest: one queued in between is counted twice, and only
		// one queued in the moment between the drainer's count and its save is missed). An old
		// record (the drainer stuck, or none leads) holds none of it.
		switch {
		case st.Counted:
			a.forget(asked)
		case st.Age <= backlogFresh:
			a.forget(asked.Add(-st.Age))
		}
		a.state = st
	}
	st = a.state
	st.Queued += int64(len(a.queued))
	return st
}

// forget stops counting the payments this process queued before t, which the state read counts.
func (a *admission) forget(t time.Time) {
	i, _ := slices.BinarySearchFunc(a.queued, t, time.Time.Compare)
	a.queued = append(a.queued[:0], a.queued[i:]...)
}

// wasQueued counts a payment this process queued, until the drainer's record includes it.
func (a *admission) wasQueued() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.queued = append(a.queued, time.Now())
}

// admit refuses a new payment past the backlog's bound: a *backlogFullError.
func (a *admission) admit(ctx context.Context) error {
	if a.State == nil || (a.MaxQueued <= 0 && a.MaxWait <= 0) {
		return nil
	}
	st := a.backlog(ctx)
	if a.MaxQueued > 0 && st.Queued >= a.MaxQueued {
		return &backlogFullError{wait: drainTime(st.Queued-a.MaxQueued+1, st.DrainPerSecond)}
	}
	switch {
	case a.MaxWait <= 0:
	case st.DrainPerSecond > 0:
		if d := drainTime(st.Queued, st.DrainPerSecond); d > a.MaxWait {
			return &backlogFullError{wait: d - a.MaxWait}
		}
	case st.Queued > 0 && !st.Oldest.IsZero() && st.Now.Sub(st.Oldest) > a.MaxWait:
		// The drain has stalled (none leads, or nothing it started finishes): at a rate of 0 the
		// backlog takes for ever, which its oldest payment, waiting past the bound, proves. A
		// backlog that only began (no start yet within the drainer's window) is not refused.
		return &backlogFullError{wait: stalledRetry}
	}
	return nil
}

// stalledRetry is the Retry-After of a refusal while the drain has stalled: no rate says how long.
const stalledRetry = 30 * time.Second

// admitFor is admit for a payment of merchant, running: whether this process has a running slot
// for it. Past the bound, a payment that runs here at once is still taken when its merchant has
// nothing queued (it would not be queued behind them): one merchant's burst does not refuse the
// others'.
func (a *admission) admitFor(ctx context.Context, merchant uuid.UUID, running bool) error {
	err := a.admit(ctx)
	if err == nil || !running {
		return err
	}
	if queued, qerr := a.State.MerchantQueued(ctx, merchant); qerr == nil && !queued {
		return nil
	}
	return err
}

// queuedRetryAfter is what a queued payment's 202 says: about how long the backlog ahead of it
// takes to drain, between 1 and 60 seconds.
func (a *admission) queuedRetryAfter(ctx context.Context) int {
	st := a.backlog(ctx)
	return min(60, max(1, int(math.Ceil(drainTime(st.Queued, st.DrainPerSecond).Seconds()))))
}

// drainTime is how long n queued payments take at rate per second; 1s when the rate is unknown.
func drainTime(n int64, rate float64) time.Duration {
	if rate <= 0 {
		return time.Second
	}
	return time.Duration(float64(n) / rate * float64(time.Second))
}

// backlogFullError: the backlog would take longer than the bound to start a new payment.
type backlogFullError struct{ wait time.Duration }

func (*backlogFullError) Error() string {
	return "kasa is taking more payments than it can start; nothing was written: retry after Retry-After seconds"
}

func (e *backlogFullError) retryAfter() int {
	return min(300, max(1, int(math.Ceil(e.wait.Seconds()))))
}

// limitMerchantInFlight answers 503 to a merchant past its share of MaxInFlight, so that one
// merchant's burst leaves room for the others; it runs after merchantAuth.
func (s *Server) limitMerchantInFlight(c *gin.Context) {
	if s.merchantFlight == nil {
		c.Next()
		return
	}
	m := merchantOf(c).ID
	if !s.merchantFlight.acquire(m) {
		s.writeError(c, errOverloaded)
		return
	}
	defer s.merchantFlight.release(m)
	c.Next()
}

// perKey counts what each key holds, up to limit each.
type perKey struct {
	limit int
	mu    sync.Mutex
	held  map[uuid.UUID]int
}

func newPerKey(limit int) *perKey { return &perKey{limit: limit, held: map[uuid.UUID]int{}} }

func (p *perKey) acquire(k uuid.UUID) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held[k] >= p.limit {
		return false
	}
	p.held[k]++
	return true
}

func (p *perKey) release(k uuid.UUID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held[k]--; p.held[k] <= 0 {
		delete(p.held, k)
	}
}
