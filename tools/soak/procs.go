package soak

import (
	"context"
	"errors"
	"sync"
)

// crashable is a server the soak crashes: its PostgreSQL, or its Temporal (dev server or Server).
type crashable interface {
	Crash() error
	Stop() error
}

// server is one the soak crashes and starts again, on the same port and state.
type server struct {
	name string
	// launch starts the server; last is the one that ran before, nil the first time.
	launch func(ctx context.Context, last crashable) (crashable, error)

	mu  sync.Mutex
	srv crashable
	up  bool
}

func (s *server) start(ctx context.Context) error {
	last, _ := s.running()
	srv, err := s.launch(ctx, last)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.srv, s.up = srv, true
	s.mu.Unlock()
	return nil
}

// running returns the server and whether it runs.
func (s *server) running() (crashable, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv, s.up
}

// down marks the server down and returns it, if it was running.
func (s *server) down() (crashable, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	up := s.up
	s.up = false
	return s.srv, up
}

// crash kills the server as a crash would: PostgreSQL in immediate mode (nothing checkpointed,
// the next start runs crash recovery), Temporal with SIGKILL.
func (s *server) crash() error {
	srv, up := s.down()
	if !up {
		return errors.New(s.name + " is not running")
	}
	return srv.Crash()
}

func (s *server) stop() {
	if srv, up := s.down(); up {
		_ = srv.Stop()
	}
}

// pgURL is kasa's database on the soak's PostgreSQL at addr (its own, or a link's).
func pgURL(addr string) string { return "postgres://postgres@" + addr + "/kasa?sslmode=disable" }
