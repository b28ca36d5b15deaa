package store

import (
	"context"
	"time"
)

// Now is the database's clock, which stamped every time a row holds (created_at, unknown_at,
// capture_before...). A process that compares such a time with a moment must take the moment
// from here: its own host's clock may be minutes off.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	now, err := s.q.Now(ctx)
	return now, translate(err)
}
