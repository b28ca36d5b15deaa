package store

import (
	"sync"

	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/payment"
)

// outcomes tells waiters in this process that an operation's record left processing through
// this Store (Finalize, Release, MarkUnknown committed). When the API and the payment worker
// share a process, the API learns of the outcome here instead of asking Temporal.
type outcomes struct {
	mu      sync.Mutex
	waiters map[uuid.UUID][]chan Answer
}

// Answer is a completed operation's stored answer, as the commit that completed it wrote it:
// what every replay of its key returns.
type Answer struct {
	Outcome payment.Status // succeeded or failed
	Body    []byte
}

// WatchOutcome returns a channel closed once this Store commits the operation's outcome, and a
// stop to call when the caller no longer waits. When that commit completed the operation's
// record, the channel first yields the answer it stored; else (unknown, or a step that found
// its work already done) it is closed without one. An outcome committed by another process (or
// before the watch) is not announced: a watcher needs its own fallback, such as reading the
// record after a while.
func (s *Store) WatchOutcome(operationID uuid.UUID) (done <-chan Answer, stop func()) {
	o := &s.outcomes
	ch := make(chan Answer, 1)
	o.mu.Lock()
	if o.waiters == nil {
		o.waiters = map[uuid.UUID][]chan Answer{}
	}
	o.waiters[operationID] = append(o.waiters[operationID], ch)
	o.mu.Unlock()
	return ch, func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		ws := o.waiters[operationID]
		for i, w := range ws {
			if w == ch {
				ws = append(ws[:i], ws[i+1:]...)
				break
			}
		}
		if len(ws) == 0 {
			delete(o.waiters, operationID)
		} else {
			o.waiters[operationID] = ws
		}
	}
}

// announce wakes every watcher of the operation, with the stored answer if the commit wrote
// one; called after the outcome's commit.
func (s *Store) announce(operationID uuid.UUID, a *Answer) {
	o := &s.outcomes
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, ch := range o.waiters[operationID] {
		if a != nil {
			ch <- *a
		}
		close(ch)
	}
	delete(o.waiters, operationID)
}
