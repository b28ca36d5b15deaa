package soak

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kasa-pay/kasa/tools/devenv"
)

// child is one long-running kasa process (api, worker, relay, banksim) that the soak keeps
// running: when it exits on its own it is started again, and every such exit is recorded.
// A fault stops it with kill and brings it back with resume.
type child struct {
	name, bin, dir string
	args, env      []string

	mu        sync.Mutex
	want      bool // restart it when it exits
	cmd       *exec.Cmd
	done      chan struct{}
	unplanned []string // exits nobody asked for: "<time>: <status>"
	stopping  bool
}

func newChild(name, bin, dir string, env []string, args ...string) *child {
	return &child{name: name, bin: bin, dir: dir, env: env, args: args}
}

// start runs the process and keeps it running until kill or stop.
func (c *child) start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.want = true
	return c.spawnLocked()
}

func (c *child) spawnLocked() error {
	logf, err := os.OpenFile(filepath.Join(c.dir, c.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "---- %s: start %s %s\n", time.Now().UTC().Format(time.RFC3339Nano), c.name, strings.Join(c.args, " "))
	cmd := exec.Command(c.bin, c.args...)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = c.dir, c.env, logf, logf
	// The child dies with the soak even if the soak is SIGKILLed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", c.name, err)
	}
	done := make(chan struct{})
	c.cmd, c.done = cmd, done
	go func() {
		err := cmd.Wait()
		logf.Close()
		close(done)
		c.exited(cmd, err)
	}()
	return nil
}

// exited restarts a process that stopped on its own, a second later.
func (c *child) exited(cmd *exec.Cmd, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.want || c.stopping || c.cmd != cmd {
		return
	}
	c.unplanned = append(c.unplanned, fmt.Sprintf("%s: %v", time.Now().UTC().Format(time.TimeOnly), err))
	go func() {
		time.Sleep(time.Second)
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.want && !c.stopping && c.cmd == cmd {
			if err := c.spawnLocked(); err != nil {
				c.unplanned = append(c.unplanned, "restart: "+err.Error())
			}
		}
	}()
}

// kill SIGKILLs the process and waits until it is gone; it stays down until resume.
func (c *child) kill() error {
	c.mu.Lock()
	c.want = false
	cmd, done := c.cmd, c.done
	c.mu.Unlock()
	if cmd == nil {
		return nil
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s did not die within 10s of SIGKILL", c.name)
	}
}

// resume starts a killed process again.
func (c *child) resume() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.want || c.stopping {
		return nil
	}
	c.want = true
	return c.spawnLocked()
}

// stop ends the process for good: SIGTERM, then SIGKILL after 15s.
func (c *child) stop() {
	c.mu.Lock()
	c.stopping, c.want = true, false
	cmd, done := c.cmd, c.done
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

func (c *child) unplannedExits() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.unplanned...)
}

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

// temporal is the soak's own file-backed Temporal dev server, SIGKILLed and restarted on the
// same port and file.
type temporal struct {
	dbFile string
	port   int
	log    *os.File
	mu     sync.Mutex
	srv    *devenv.Temporal
}

func (t *temporal) start(ctx context.Context) error {
	srv, err := devenv.StartTemporal(ctx, devenv.TemporalOptions{Port: t.port, DBFile: t.dbFile, Output: t.log})
	if err != nil {
		return err
	}
	t.mu.Lock()
	t.srv = srv
	t.mu.Unlock()
	return nil
}

func (t *temporal) running() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.srv != nil
}

func (t *temporal) address() string { return "127.0.0.1:" + strconv.Itoa(t.port) }

// crash SIGKILLs the dev server: the process whose command line names the soak's database file.
func (t *temporal) crash() error {
	t.mu.Lock()
	srv := t.srv
	t.srv = nil
	t.mu.Unlock()
	if srv == nil {
		return errors.New("temporal is not running")
	}
	pids := pidsMentioning(t.dbFile)
	if len(pids) != 1 {
		_ = srv.Stop()
		return fmt.Errorf("want one dev server process naming %s, found %d (stopped it instead)", t.dbFile, len(pids))
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		return err
	}
	_ = srv.Stop() // reaps it
	return nil
}

func (t *temporal) stop() {
	t.mu.Lock()
	srv := t.srv
	t.srv = nil
	t.mu.Unlock()
	if srv != nil {
		_ = srv.Stop()
	}
}

// pidsMentioning lists the live processes whose command line contains s.
func pidsMentioning(s string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), s) {
			pids = append(pids, pid)
		}
	}
	return pids
}
