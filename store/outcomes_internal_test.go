package store

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// Every payment an API waits for registers a watcher: whether the wait ends by the outcome or
// by giving up, nothing is kept for it afterwards, however many payments a process has seen.
func TestWatchOutcomeForgetsItsWatchers(t *testing.T) {
	t.Parallel()
	var s Store
	for _, announced := range []bool{false, true} {
		for range 1000 {
			id := uuid.New()
			done, stop := s.WatchOutcome(id)
			if announced {
				s.announce(id, &Answer{Body: []byte(`{}`)})
				<-done
			}
			stop()
		}
	}
	s.outcomes.mu.Lock()
	defer s.outcomes.mu.Unlock()
	require.Zero(t, len(s.outcomes.waiters), "operations still watched")
}
