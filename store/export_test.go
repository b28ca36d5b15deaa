package store

import "context"

// Exec runs one statement; tests use it to prove the schema guards itself.
func (s *Store) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := s.pool.Exec(ctx, sql, args...)
	return translate(err)
}

var MinUUIDv7 = minUUIDv7
