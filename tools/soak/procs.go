package soak

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"

	"github.com/kasa-pay/kasa/tools/devenv"
)

// postgres is the soak's own PostgreSQL cluster, crashed and restarted on the same port and data.
type postgres struct {
	dir  string
	port int
	mu   sync.Mutex
	pg   *devenv.Postgres
}

func (p *postgres) start(ctx context.Context) error {
	// Durable, not Ephemeral: with synchronous_commit off a crash loses commits kasa was told
	// about, which no payment system can survive.
	pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: p.dir, Port: p.port})
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.pg, p.port = pg, pg.Port
	p.mu.Unlock()
	return nil
}

// crash shuts the cluster down in immediate mode (SIGQUIT to the postmaster: backends are
// killed, nothing is checkpointed, the next start runs crash recovery).
func (p *postgres) crash() error {
	p.mu.Lock()
	pg := p.pg
	p.pg = nil
	p.mu.Unlock()
	if pg == nil {
		return errors.New("postgres is not running")
	}
	return pg.Crash()
}

func (p *postgres) stop() {
	p.mu.Lock()
	pg := p.pg
	p.pg = nil
	p.mu.Unlock()
	if pg != nil {
		_ = pg.Stop()
	}
}

func (p *postgres) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pg != nil
}

func (p *postgres) url(port int) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/kasa?sslmode=disable", port)
}

// temporal is the soak's Temporal, SIGKILLed and restarted on the same port and state: the
// file-backed dev server (devTemporal), or in the cluster shape the real Temporal Server on the
// soak's PostgreSQL (serverTemporal).
type temporal interface {
	start(ctx context.Context) error
	crash() error
	stop()
	running() bool
	address() string
}

// devTemporal is the soak's own file-backed Temporal dev server, its log in logDir.
type devTemporal struct {
	dbFile, logDir string
	port           int
	mu             sync.Mutex
	srv            *devenv.Temporal
}

func (t *devTemporal) start(ctx context.Context) error {
	srv, err := devenv.StartTemporal(ctx, devenv.TemporalOptions{Port: t.port, DBFile: t.dbFile, LogDir: t.logDir})
	if err != nil {
		return err
	}
	t.mu.Lock()
	t.srv = srv
	t.mu.Unlock()
	return nil
}

func (t *devTemporal) running() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.srv != nil
}

func (t *devTemporal) address() string { return "127.0.0.1:" + strconv.Itoa(t.port) }

// crash SIGKILLs the dev server.
func (t *devTemporal) crash() error {
	t.mu.Lock()
	srv := t.srv
	t.srv = nil
	t.mu.Unlock()
	if srv == nil {
		return errors.New("temporal is not running")
	}
	return srv.Crash()
}

func (t *devTemporal) stop() {
	t.mu.Lock()
	srv := t.srv
	t.srv = nil
	t.mu.Unlock()
	if srv != nil {
		_ = srv.Stop()
	}
}

// serverTemporal is the real Temporal Server on the soak's PostgreSQL (directly, not through the
// faulty link), its configuration and log in dir.
type serverTemporal struct {
	dir  string
	port int
	pg   *postgres
	mu   sync.Mutex
	ts   *devenv.TemporalServer
	up   bool
}

func (t *serverTemporal) start(ctx context.Context) error {
	t.mu.Lock()
	ts := t.ts
	t.mu.Unlock()
	var err error
	if ts == nil {
		t.pg.mu.Lock()
		pg := t.pg.pg
		t.pg.mu.Unlock()
		if pg == nil {
			return errors.New("the Temporal Server needs PostgreSQL running")
		}
		ts, err = devenv.StartTemporalServer(ctx, pg, devenv.TemporalServerOptions{Dir: t.dir, Port: t.port, Logger: slog.New(slog.DiscardHandler)})
	} else {
		err = ts.Restart(ctx)
	}
	if err != nil {
		return err
	}
	t.mu.Lock()
	t.ts, t.up = ts, true
	t.mu.Unlock()
	return nil
}

func (t *serverTemporal) crash() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.up {
		return errors.New("the Temporal Server is not running")
	}
	t.up = false
	return t.ts.Crash()
}

func (t *serverTemporal) stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.up {
		t.up = false
		_ = t.ts.Stop()
	}
}

func (t *serverTemporal) running() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.up
}

func (t *serverTemporal) address() string { return "127.0.0.1:" + strconv.Itoa(t.port) }
