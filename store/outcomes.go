package store

import (
	"sync"

	"github.com/google/uuid"
)

// outcomes tells waiters in this process that an operation's record left processing through
// this Store (Finalize, Release, MarkUnknown committed). When the API and the payment worker
// share a process, the API learns of the outcome here instead of asking Temporal.
type outcomes struct {
	mu      sync.Mutex
	waiters map[uuid.UUID][]chan struct{}
}

// WatchOutcome returns a channel closed once this Store commits the operation's outcome, and a
// stop to call when the caller no longer waits. An outcome committed by another process (or
// before the watch) is not announced: a watcher needs its own fallback, such as reading the
// record after a while.
func (s *Store) WatchOutcome(operationID uuid.UUID) (done <-chan struct{}, stop func()) {
	o := &s.outcomes
	ch := make(chan struct{})
	o.mu.Lock()
	if o.waiters == nil {
		o.waiters = map[uuid.UUID][]chan struct{}{}
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

// announce wakes every watcher of the operation; called after the outcome's commit.
func (s *Store) announce(operationID uuid.UUID) {
	o := &s.outcomes
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, ch := range o.waiters[operationID] {
		close(ch)
	}
	delete(o.waiters, operationID)
}
