package soak

import (
	"context"
	"errors"
	"sync"
)

// crashable is a server the soak runs: its PostgreSQL, or its Temporal (the file-backed dev
// server, or in the cluster shape the real Temporal Server on the soak's PostgreSQL).
type crashable interface {
	Crash() error
	Stop() error
}

// server is one the soak crashes and starts again, on the same port and state.
type server[S crashable] struct {
	name string
	// launch starts the server; last is the one that ran before, if ran.
	launch func(ctx context.Context, last S, ran bool) (S, error)

	mu      sync.Mutex
	srv     S
	ran, up bool
}

func (s *server[S]) start(ctx context.Context) error {
	s.mu.Lock()
	last, ran := s.srv, s.ran
	s.mu.Unlock()
	srv, err := s.launch(ctx, last, ran)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.srv, s.ran, s.up = srv, true, true
	s.mu.Unlock()
	return nil
}

// running returns the server while it runs.
func (s *server[S]) running() (S, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv, s.up
}

// down marks the server down and returns it, if it was running.
func (s *server[S]) down() (S, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	up := s.up
	s.up = false
	return s.srv, up
}

// crash kills the server as a crash would: PostgreSQL in immediate mode (nothing checkpointed,
// the next start runs crash recovery), Temporal with SIGKILL.
func (s *server[S]) crash() error {
	srv, up := s.down()
	if !up {
		return errors.New(s.name + " is not running")
	}
	return srv.Crash()
}

func (s *server[S]) stop() {
	if srv, up := s.down(); up {
		_ = srv.Stop()
	}
}

// pgURL is kasa's database on the soak's PostgreSQL at addr (its own, or a link's).
func pgURL(addr string) string { return "postgres://postgres@" + addr + "/kasa?sslmode=disable" }
