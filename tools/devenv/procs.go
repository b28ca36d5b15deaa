package devenv

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Supervisor is the one way kasa's tools run processes (kasa dev's and kasa cluster's children,
// the soak's, the end-to-end tests', the benchmark's stack), with one rule for each event:
//   - start: the child runs in its own process group (a terminal's Ctrl-C reaches only the
//     parent, which stops the children in order), its output appended to LogDir/<name>.log;
//   - parent death: the child gets its stop signal when the parent dies, however it dies, and
//     stops as it would on Ctrl-C, its own children with it;
//   - exit nobody asked for: recorded (Exits), then reported on Exited or, with Restart set,
//     started again after a backoff;
//   - stop: its stop signal, and SIGKILL to its whole group after a timeout; for good;
//   - kill (or another signal that ends it, as a crash would): the child stays down until Resume.
type Supervisor struct {
	// LogDir holds <name>.log for every child; created when missing. Empty: output discarded.
	LogDir string
	// WorkDir is the children's working directory; empty: the parent's.
	WorkDir string
	// StopSignal asks a child to shut down; zero: SIGTERM. PostgreSQL's fast shutdown is SIGINT.
	StopSignal syscall.Signal
	// Credential, when set, is the OS user the children run as.
	Credential *syscall.Credential
	Logger     *slog.Logger
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
	sup     *Supervisor
	env     []string
	bin     string
	args    []string
	stop    chan struct{} // closed by Stop: no restart after it
	mu      sync.Mutex
	run     *run     // the latest process
	asked   bool     // Stop was called: its exit is expected
	down    bool     // Kill was called, Resume not yet: its exit is expected
	exits   []string // exits nobody asked for: "<time>: <status>"
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
	go s.watch(c, c.run)
	return c, nil
}

// watch follows r, c's process: it records an exit nobody asked for, then reports it or starts c
// again after the backoff. It ends when c is stopped or killed.
func (s *Supervisor) watch(c *Child, r *run) {
	var wait time.Duration
	for {
		<-r.done
		c.mu.Lock()
		// A process Resume replaced was killed, even if the kill was undone before this look.
		expected := c.asked || c.down || c.run != r
		if !expected {
			c.exits = append(c.exits, time.Now().UTC().Format(time.TimeOnly)+": "+exitText(r.err))
		}
		c.mu.Unlock()
		if expected {
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
			// Under the lock, so that a Stop or a Kill either comes first or finds the new process.
			// A Kill and a Resume during the wait started another process, watched on its own.
			c.mu.Lock()
			if c.asked || c.down || c.run != r {
				c.mu.Unlock()
				return
			}
			next, err := s.launch(c)
			if err == nil {
				c.run, r = next, next
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
		return fmt.Errorf("%s: %w (log: %s)\n%s", name, c.run.err, c.LogPath, c.Tail(15))
	}
	return nil
}

func (s *Supervisor) spawn(name string, env []string, bin string, args ...string) (*Child, error) {
	logPath := os.DevNull
	if s.LogDir != "" {
		if err := os.MkdirAll(s.LogDir, 0o755); err != nil {
			return nil, err
		}
		logPath = filepath.Join(s.LogDir, name+".log")
	}
	c := &Child{Name: name, LogPath: logPath, sup: s, env: env, bin: bin, args: args,
		stop: make(chan struct{})}
	r, err := s.launch(c)
	if err != nil {
		return nil, err
	}
	c.run = r
	return c, nil
}

// startLocked starts cmd in its own process group, as user (nil: this process's), to get sig if
// this process dies, and returns what its Wait returns. The kernel sends the parent-death signal
// when the thread that started the child ends, and Go ends a thread only when a goroutine locked
// to it returns: this one returns once the child has exited, so the signal comes when the parent
// process dies, and only then.
func startLocked(cmd *exec.Cmd, sig syscall.Signal, user *syscall.Credential) (<-chan error, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: sig, Credential: user}
	started, done := make(chan error, 1), make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		done <- cmd.Wait()
	}()
	return done, <-started
}

// launch starts one process of c.
func (s *Supervisor) launch(c *Child) (*run, error) {
	f, err := os.OpenFile(c.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "---- %s: start %s %s\n", time.Now().UTC().Format(time.RFC3339Nano), c.bin, strings.Join(c.args, " "))
	cmd := exec.Command(c.bin, c.args...)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = s.WorkDir, c.env, f, f
	done, err := startLocked(cmd, s.stopSignal(), s.Credential)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s (%s): %w", c.Name, c.bin, err)
	}
	r := &run{cmd: cmd, began: time.Now(), done: make(chan struct{})}
	go func() {
		r.err = <-done
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

// PID is the process id of the child's latest process.
func (c *Child) PID() int { return c.current().cmd.Process.Pid }

// Err is how the child's latest process exited, once it has (Done is closed).
func (c *Child) Err() error { r := c.current(); <-r.done; return r.err }

// Done is closed when the child's latest process has exited.
func (c *Child) Done() <-chan struct{} { return c.current().done }

// ErrKilled is a stop that had to kill: the child ignored its stop signal for its whole grace
// period, and whatever it was finishing was cut short.
var ErrKilled = errors.New("killed")

// Stop asks the child to end (its stop signal), for good, and waits; after timeout its whole
// process group is killed, so that nothing it started outlives it, and Stop fails with ErrKilled.
func (c *Child) Stop(timeout time.Duration) error {
	c.mu.Lock()
	if !c.asked {
		c.asked = true
		close(c.stop)
	}
	r := c.run
	c.mu.Unlock()
	_ = r.cmd.Process.Signal(c.sup.stopSignal())
	select {
	case <-r.done:
	case <-time.After(timeout):
		_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
		<-r.done
		return fmt.Errorf("%s (pid %d) did not stop within %v of its stop signal: %w", c.Name, r.cmd.Process.Pid, timeout, ErrKilled)
	}
	return nil
}

// stopClean is Stop, failing too when the child's exit status says it did not stop cleanly.
func (c *Child) stopClean(timeout time.Duration) error {
	if err := c.Stop(timeout); err != nil {
		return err
	}
	if err := c.Err(); err != nil {
		return fmt.Errorf("%s: %w", c.Name, err)
	}
	return nil
}

func (s *Supervisor) stopSignal() syscall.Signal { return cmp.Or(s.StopSignal, syscall.SIGTERM) }

// Kill is Down(SIGKILL): no deferred function, no graceful shutdown.
func (c *Child) Kill() error { return c.Down(syscall.SIGKILL) }

// Down sends the child's process sig, which is to end it as a crash would (SIGKILL; SIGQUIT for
// PostgreSQL's immediate shutdown), and waits until it is gone. It stays down, neither restarted
// nor reported, until Resume.
func (c *Child) Down(sig syscall.Signal) error {
	c.mu.Lock()
	c.down = true
	r := c.run
	c.mu.Unlock()
	if err := r.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-r.done:
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("%s did not end within 30s of %v", c.Name, sig)
	}
}

// Resume starts a killed child again; it does nothing to one that was not killed or was stopped.
func (c *Child) Resume() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.down || c.asked {
		return nil
	}
	r, err := c.sup.launch(c)
	if err != nil {
		return err
	}
	c.run, c.down = r, false
	go c.sup.watch(c, r)
	return nil
}

// Running says whether the child's latest process has not exited.
func (c *Child) Running() bool {
	select {
	case <-c.Done():
		return false
	default:
		return true
	}
}

// Exits lists the exits nobody asked for (neither Stop nor Kill), "<time>: <status>" each.
func (c *Child) Exits() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.exits)
}

// StopAll stops the children in the given groups, one group after the other, the children of a
// group at once; it fails naming each child that had to be killed.
func (s *Supervisor) StopAll(timeout time.Duration, groups ...[]*Child) error {
	var errs []error
	for _, g := range groups {
		stopped := make([]error, len(g))
		var wg sync.WaitGroup
		for i, c := range g {
			if c != nil {
				wg.Go(func() {
					stopped[i] = c.Stop(timeout)
					s.Logger.Info("stopped "+c.Name, "exit", exitText(c.Err()))
				})
			}
		}
		wg.Wait()
		errs = append(errs, stopped...)
	}
	return errors.Join(errs...)
}

// Tail is the last n lines of the child's log, for an error message.
func (c *Child) Tail(n int) string {
	b, _ := os.ReadFile(c.LogPath) // none yet: ""
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func exitText(err error) string {
	if err == nil {
		return "status 0"
	}
	return err.Error()
}

// WaitHTTP waits until url answers 200, failing when the child exits first (even if it is to be
// restarted: one that dies before it is ever ready is misconfigured) or ctx ends.
func WaitHTTP(ctx context.Context, url string, c *Child) error {
	probe := &http.Client{Timeout: time.Second} // a listener that never answers must not hold the wait
	return c.waitReady(ctx, url+" answered 200", func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := probe.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return nil
	})
}

// waitReady asks ready (each call given 10 s) every 100 ms until it succeeds, failing when the
// child exits first, or exited before the wait began, or ctx ends. An answer while the child is
// not running comes from another process on its address.
func (c *Child) waitReady(ctx context.Context, what string, ready func(context.Context) error) error {
	r := c.current()
	exited := func(status string) error {
		return fmt.Errorf("%s exited (%s) before %s (log: %s)\n%s", c.Name, status, what, c.LogPath, c.Tail(15))
	}
	for {
		if exits := c.Exits(); len(exits) > 0 {
			return exited(exits[0])
		}
		callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := ready(callCtx)
		cancel()
		if err == nil && c.Running() && len(c.Exits()) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: still waiting until %s: %w (last: %v; log: %s)\n%s", c.Name, what, ctx.Err(), err, c.LogPath, c.Tail(15))
		case <-r.done:
			return exited(exitText(r.err))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// FindTool looks for a binary the Makefile builds into ./bin (see findBin).
func FindTool(name, makeTarget string) (string, error) {
	if p := findBin(name); p != "" {
		return p, nil
	}
	return "", fmt.Errorf("%s not found in ./bin, beside kasa or on PATH: run `make %s`", name, makeTarget)
}

// findBin looks for name in dirs, the repository's ./bin, beside the running executable, then on
// PATH; "" when it is nowhere.
func findBin(name string, dirs ...string) string {
	if root := repoRoot(); root != "" {
		dirs = append(dirs, filepath.Join(root, "bin"))
	}
	if exe, err := os.Executable(); err == nil {
		dirs = append(dirs, filepath.Dir(exe))
	}
	for _, d := range dirs {
		if p := filepath.Join(d, name); isFile(p) {
			return p
		}
	}
	p, _ := exec.LookPath(name)
	return p
}

// repoRoot is the directory of kasa's go.mod above the working directory; "" when there is none.
func repoRoot() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.HasPrefix(b, []byte("module github.com/kasa-pay/kasa\n")) {
			return dir
		}
		if dir == filepath.Dir(dir) {
			return ""
		}
		dir = filepath.Dir(dir)
	}
}

func isFile(path string) bool {
	st, err := os.Stat(path)
	return err == nil && !st.IsDir()
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
	c, err := s.startServing(ctx, "nats", fmt.Sprintf("http://127.0.0.1:%d/healthz", monitorPort), bin,
		"-c", conf, "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-m", strconv.Itoa(monitorPort))
	if err != nil {
		return nil, fmt.Errorf("nats-server did not become ready: %w", err)
	}
	return c, nil
}

// startServing starts bin as name and waits up to 30 s until url answers 200; a child that does
// not is stopped.
func (s *Supervisor) startServing(ctx context.Context, name, url, bin string, args ...string) (*Child, error) {
	c, err := s.Start(name, os.Environ(), bin, args...)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := WaitHTTP(ctx, url, c); err != nil {
		c.Stop(5 * time.Second)
		return nil, err
	}
	return c, nil
}

// ProcessesMentioning lists the live processes (not this one, not zombies) whose command line
// contains s, as "<pid>: <command line>": what a test or a tool checks is left running.
func ProcessesMentioning(s string) []string {
	_, found := mentioning(s)
	return found
}

// PIDsMentioning is ProcessesMentioning's process ids.
func PIDsMentioning(s string) []int {
	pids, _ := mentioning(s)
	return pids
}

func mentioning(s string) (pids []int, lines []string) {
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, path := range cmdlines {
		dir := filepath.Dir(path)
		pid, _ := strconv.Atoi(filepath.Base(dir))
		b, _ := os.ReadFile(path)
		line := strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
		if pid == os.Getpid() || len(b) == 0 || !strings.Contains(line, s) {
			continue
		}
		if stat, _ := os.ReadFile(dir + "/stat"); strings.Contains(string(stat), ") Z ") {
			continue // a zombie already exited
		}
		pids, lines = append(pids, pid), append(lines, filepath.Base(dir)+": "+line)
	}
	return pids, lines
}

// Command is a one-shot program run through the same layer as a Supervisor's children (initdb,
// createdb, psql, pgbench, a kasa subcommand, go build): its own process group, the whole group
// killed when ctx ends, and SIGTERM if this process dies first.
type Command struct {
	Env        []string // nil: this process's
	Dir        string
	Stdin      []byte
	Credential *syscall.Credential // the OS user it runs as; nil: this process's
}

// Run runs bin to its end and returns its standard output; a failure's error ends with the last
// 4 KiB of its standard error.
func (c Command) Run(ctx context.Context, bin string, args ...string) (string, error) {
	var stdout, stderr strings.Builder
	cmd := exec.Command(bin, args...)
	cmd.Env, cmd.Dir, cmd.Stdin, cmd.Stdout, cmd.Stderr = c.Env, c.Dir, bytes.NewReader(c.Stdin), &stdout, &stderr
	done, err := startLocked(cmd, syscall.SIGTERM, c.Credential)
	if err != nil {
		return "", err
	}
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		return "", ctx.Err()
	}
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		return stdout.String(), fmt.Errorf("%s: %w: %s", filepath.Base(bin), err, msg[max(0, len(msg)-4<<10):])
	}
	return stdout.String(), nil
}
