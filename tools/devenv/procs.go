package devenv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Supervisor runs long-lived child processes, each logging to a file of its own, and stops them
// all. A child that exits without being asked to is reported on Exited or, with Restart set,
// logged and started again.
type Supervisor struct {
	// LogDir holds <name>.log for every child; created when missing.
	LogDir string
	Logger *slog.Logger
	// Restart, when set, starts a child that exited on its own again (same binary, arguments and
	// environment) after the wait it gives, as an orchestrator would, instead of reporting it.
	Restart *Backoff

	exited chan *Child
}

// Backoff spaces the restarts of a child that keeps dying, so that one failing at start does not
// spin: Initial after the first exit, doubled after each quick one up to Max, and Initial again
// after a run that lasted Reset.
type Backoff struct{ Initial, Max, Reset time.Duration }

// DefaultBackoff is the launchers' restart policy.
var DefaultBackoff = Backoff{Initial: time.Second, Max: 30 * time.Second, Reset: time.Minute}

// Next is the wait before a restart after a run that lasted up, prev being the wait before that
// run (0 for none).
func (b Backoff) Next(prev, up time.Duration) time.Duration {
	if prev == 0 || up >= b.Reset {
		return b.Initial
	}
	return min(2*prev, b.Max)
}

// Child is one process a Supervisor started, and the same process started again.
type Child struct {
	Name    string
	LogPath string
	env     []string
	bin     string
	args    []string
	stop    chan struct{} // closed by Stop: no restart after it
	mu      sync.Mutex
	run     *run // the latest process
	asked   bool // Stop was called: its exit is expected
}

// run is one process of a Child.
type run struct {
	cmd   *exec.Cmd
	began time.Time
	done  chan struct{}
	err   error // set before done is closed
}

// NewSupervisor returns a supervisor logging to dir.
func NewSupervisor(dir string, log *slog.Logger) *Supervisor {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Supervisor{LogDir: dir, Logger: log, exited: make(chan *Child, 64)}
}

// Exited delivers every child that exited though nobody stopped it, when Restart is not set.
func (s *Supervisor) Exited() <-chan *Child { return s.exited }

// Start runs bin with args and env, its output appended to LogDir/<name>.log.
func (s *Supervisor) Start(name string, env []string, bin string, args ...string) (*Child, error) {
	c, err := s.spawn(name, env, bin, args...)
	if err != nil {
		return nil, err
	}
	go s.watch(c)
	return c, nil
}

// watch reports each exit of c that nobody asked for, or starts c again after the backoff.
func (s *Supervisor) watch(c *Child) {
	var wait time.Duration
	for {
		r := c.current()
		<-r.done
		if c.stopped() {
			return
		}
		if s.Restart == nil {
			s.exited <- c
			return
		}
		wait = s.Restart.Next(wait, time.Since(r.began))
		s.Logger.Error(c.Name+" exited on its own: starting it again", "pid", r.cmd.Process.Pid,
			"exit", exitText(r.err), "restart_in", wait, "log", c.LogPath)
		for {
			select {
			case <-c.stop:
				return
			case <-time.After(wait):
			}
			// Under the lock, so that a Stop either comes first or finds the new process.
			c.mu.Lock()
			if c.asked {
				c.mu.Unlock()
				return
			}
			next, err := s.launch(c)
			if err == nil {
				c.run = next
			}
			c.mu.Unlock()
			if err == nil {
				break
			}
			wait = s.Restart.Next(wait, 0)
			s.Logger.Error("could not start "+c.Name+" again", "error", err, "restart_in", wait)
		}
	}
}

// Run runs a one-shot child to its end and fails unless it exits 0; ctx's end kills it.
func (s *Supervisor) Run(ctx context.Context, name string, env []string, bin string, args ...string) error {
	c, err := s.spawn(name, env, bin, args...)
	if err != nil {
		return err
	}
	select {
	case <-c.run.done:
	case <-ctx.Done():
		c.Stop(10 * time.Second)
		return ctx.Err()
	}
	if c.run.err != nil {
		return fmt.Errorf("%s: %w (log: %s)\n%s", name, c.run.err, c.LogPath, tailFile(c.LogPath, 15))
	}
	return nil
}

func (s *Supervisor) spawn(name string, env []string, bin string, args ...string) (*Child, error) {
	if err := os.MkdirAll(s.LogDir, 0o755); err != nil {
		return nil, err
	}
	c := &Child{Name: name, LogPath: filepath.Join(s.LogDir, name+".log"), env: env, bin: bin, args: args,
		stop: make(chan struct{})}
	r, err := s.launch(c)
	if err != nil {
		return nil, err
	}
	c.run = r
	return c, nil
}

// launch starts one process of c.
func (s *Supervisor) launch(c *Child) (*run, error) {
	f, err := os.OpenFile(c.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "---- %s: start %s %s\n", time.Now().UTC().Format(time.RFC3339Nano), c.bin, strings.Join(c.args, " "))
	cmd := exec.Command(c.bin, c.args...)
	cmd.Env, cmd.Stdout, cmd.Stderr = c.env, f, f
	// Its own process group, so that a terminal's Ctrl-C reaches only the supervisor, which stops
	// the children in order; and killed with the supervisor should that die without stopping them.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s (%s): %w", c.Name, c.bin, err)
	}
	r := &run{cmd: cmd, began: time.Now(), done: make(chan struct{})}
	go func() {
		r.err = cmd.Wait()
		fmt.Fprintf(f, "---- %s: %s exited: %v\n", time.Now().UTC().Format(time.RFC3339Nano), c.Name, exitText(r.err))
		f.Close()
		close(r.done)
	}()
	s.Logger.Info("started "+c.Name, "pid", cmd.Process.Pid, "log", c.LogPath)
	return r, nil
}

func (c *Child) current() *run {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.run
}

func (c *Child) stopped() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.asked
}

// PID is the process id of the child's latest process.
func (c *Child) PID() int { return c.current().cmd.Process.Pid }

// Err is how the child's latest process exited, once it has (Done is closed).
func (c *Child) Err() error { r := c.current(); <-r.done; return r.err }

// Done is closed when the child's latest process has exited.
func (c *Child) Done() <-chan struct{} { return c.current().done }

// Stop asks the child to end (SIGTERM), for good, and waits; after timeout its whole process
// group is killed, so that nothing it started outlives it.
func (c *Child) Stop(timeout time.Duration) {
	c.mu.Lock()
	if !c.asked {
		c.asked = true
		close(c.stop)
	}
	r := c.run
	c.mu.Unlock()
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(timeout):
		_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
		<-r.done
	}
}

// StopAll stops the children in the given groups, one group after the other, the children of a
// group at once.
func (s *Supervisor) StopAll(timeout time.Duration, groups ...[]*Child) {
	for _, g := range groups {
		var wg sync.WaitGroup
		for _, c := range g {
			if c == nil {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.Stop(timeout)
				s.Logger.Info("stopped "+c.Name, "exit", exitText(c.Err()))
			}()
		}
		wg.Wait()
	}
}

// Tail is the end of the child's log, for an error message.
func (c *Child) Tail(n int) string { return tailFile(c.LogPath, n) }

func exitText(err error) string {
	if err == nil {
		return "status 0"
	}
	return err.Error()
}

// WaitHTTP waits until url answers 200, failing when the child exits first (even if it is to be
// restarted: one that dies before it is ever ready is misconfigured) or ctx ends.
func WaitHTTP(ctx context.Context, url string, c *Child) error {
	r := c.current()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s never answered 200: %w", url, ctx.Err())
		case <-r.done:
			return fmt.Errorf("%s exited (%v) before %s answered (log: %s)\n%s", c.Name, exitText(r.err), url, c.LogPath, c.Tail(15))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// FindTool looks for a binary the Makefile builds into ./bin: in the repository's ./bin, beside
// the running executable, then on PATH.
func FindTool(name, makeTarget string) (string, error) {
	var dirs []string
	if root, ok := repoRoot(); ok {
		dirs = append(dirs, filepath.Join(root, "bin"))
	}
	if exe, err := os.Executable(); err == nil {
		dirs = append(dirs, filepath.Dir(exe))
	}
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%s not found in ./bin, beside kasa or on PATH: run `make %s`", name, makeTarget)
}

// StartNATS runs nats-server with JetStream (its store under dir) on 127.0.0.1:port and waits
// until its health endpoint (on monitorPort) says JetStream is up.
func StartNATS(ctx context.Context, s *Supervisor, bin, dir string, port, monitorPort int) (*Child, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// JetStream fsyncs on a two-minute timer by default, so a power loss takes acknowledged
	// messages: every write is synced instead, as deploy/nats.conf does for compose.
	conf := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, "jetstream {\n  store_dir: %q\n  sync_interval: always\n}\n", dir), 0o644); err != nil {
		return nil, err
	}
	c, err := s.Start("nats", os.Environ(), bin, "-c", conf, "-a", "127.0.0.1", "-p", strconv.Itoa(port),
		"-m", strconv.Itoa(monitorPort))
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := WaitHTTP(wctx, fmt.Sprintf("http://127.0.0.1:%d/healthz", monitorPort), c); err != nil {
		c.Stop(5 * time.Second)
		return nil, errors.Join(errors.New("nats-server did not become ready"), err)
	}
	return c, nil
}
