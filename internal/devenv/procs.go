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

// Supervisor runs long-lived child processes, each logging to a file of its own, tells when one
// exits without being asked to, and stops them all.
type Supervisor struct {
	// LogDir holds <name>.log for every child; created when missing.
	LogDir string
	Logger *slog.Logger

	mu       sync.Mutex
	children []*Child
	exited   chan *Child
}

// Child is one process a Supervisor started.
type Child struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error // set before done is closed
	mu      sync.Mutex
	asked   bool // Stop was called: its exit is expected
}

// NewSupervisor returns a supervisor logging to dir.
func NewSupervisor(dir string, log *slog.Logger) *Supervisor {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Supervisor{LogDir: dir, Logger: log, exited: make(chan *Child, 64)}
}

// Exited delivers every child that exited though nobody stopped it.
func (s *Supervisor) Exited() <-chan *Child { return s.exited }

// Start runs bin with args and env, its output appended to LogDir/<name>.log.
func (s *Supervisor) Start(name string, env []string, bin string, args ...string) (*Child, error) {
	c, err := s.spawn(name, env, bin, args...)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.children = append(s.children, c)
	s.mu.Unlock()
	go func() {
		<-c.done
		c.mu.Lock()
		asked := c.asked
		c.mu.Unlock()
		if !asked {
			s.exited <- c
		}
	}()
	return c, nil
}

// Run runs a one-shot child to its end and fails unless it exits 0; ctx's end kills it.
func (s *Supervisor) Run(ctx context.Context, name string, env []string, bin string, args ...string) error {
	c, err := s.spawn(name, env, bin, args...)
	if err != nil {
		return err
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		c.Stop(10 * time.Second)
		return ctx.Err()
	}
	if c.err != nil {
		return fmt.Errorf("%s: %w (log: %s)\n%s", name, c.err, c.LogPath, tailFile(c.LogPath, 15))
	}
	return nil
}

func (s *Supervisor) spawn(name string, env []string, bin string, args ...string) (*Child, error) {
	if err := os.MkdirAll(s.LogDir, 0o755); err != nil {
		return nil, err
	}
	path := filepath.Join(s.LogDir, name+".log")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "---- %s: start %s %s\n", time.Now().UTC().Format(time.RFC3339Nano), bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, f, f
	// Its own process group, so that a terminal's Ctrl-C reaches only the supervisor, which stops
	// the children in order; and killed with the supervisor should that die without stopping them.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	c := &Child{Name: name, LogPath: path, cmd: cmd, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		fmt.Fprintf(f, "---- %s: %s exited: %v\n", time.Now().UTC().Format(time.RFC3339Nano), name, exitText(c.err))
		f.Close()
		close(c.done)
	}()
	s.Logger.Info("started "+name, "pid", cmd.Process.Pid, "log", path)
	return c, nil
}

// PID is the child's process id.
func (c *Child) PID() int { return c.cmd.Process.Pid }

// Err is how the child exited; valid once it has (Done is closed).
func (c *Child) Err() error { <-c.done; return c.err }

// Done is closed when the child has exited.
func (c *Child) Done() <-chan struct{} { return c.done }

// Stop asks the child to end (SIGTERM) and waits; after timeout its whole process group is
// killed, so that nothing it started outlives it.
func (c *Child) Stop(timeout time.Duration) {
	c.mu.Lock()
	c.asked = true
	c.mu.Unlock()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(timeout):
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		<-c.done
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
				s.Logger.Info("stopped "+c.Name, "exit", exitText(c.err))
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

// WaitHTTP waits until url answers 200, failing when the child exits first or ctx ends.
func WaitHTTP(ctx context.Context, url string, c *Child) error {
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
		case <-c.done:
			return fmt.Errorf("%s exited (%v) before %s answered (log: %s)\n%s", c.Name, exitText(c.err), url, c.LogPath, c.Tail(15))
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
	c, err := s.Start("nats", os.Environ(), bin, "-a", "127.0.0.1", "-p", strconv.Itoa(port),
		"-m", strconv.Itoa(monitorPort), "-js", "-sd", dir)
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
