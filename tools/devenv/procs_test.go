package devenv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSupervisor(t *testing.T) {
	sh := "/bin/sh"
	for _, c := range []struct {
		name   string
		script string
		// stop the child (true) or let it exit on its own (false)
		stop bool
		// reported on Exited: an exit nobody asked for
		reported bool
		exit     string
	}{
		{name: "exits on its own", script: "exit 3", reported: true, exit: "exit status 3"},
		{name: "stopped by SIGTERM", script: "exec sleep 60", stop: true, exit: "signal: terminated"},
		{name: "ignores SIGTERM: killed", script: "trap '' TERM; sleep 60 & wait; sleep 60", stop: true, exit: "signal: killed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			s := NewSupervisor(dir, nil)
			child, err := s.Start("child", os.Environ(), sh, "-c", c.script)
			require.NoError(t, err)
			if c.stop {
				time.Sleep(200 * time.Millisecond) // the shell has set its trap
				began := time.Now()
				err := s.StopAll(time.Second, []*Child{child})
				require.Less(t, time.Since(began), 5*time.Second)
				if c.exit == "signal: killed" { // a stop that had to kill fails, naming the child
					require.ErrorIs(t, err, ErrKilled)
					require.Contains(t, err.Error(), "child (pid "+strconv.Itoa(child.PID())+") did not stop within 1s")
				} else {
					require.NoError(t, err)
				}
			}
			require.EqualError(t, child.Err(), c.exit)
			select {
			case got := <-s.Exited():
				require.True(t, c.reported, "a stopped child is not reported")
				require.Same(t, child, got)
			case <-time.After(500 * time.Millisecond):
				require.False(t, c.reported, "an exit nobody asked for is reported")
			}
			log, err := os.ReadFile(filepath.Join(dir, "child.log"))
			require.NoError(t, err)
			require.Contains(t, string(log), "child exited: "+c.exit)
			require.ErrorIs(t, syscall.Kill(child.PID(), 0), syscall.ESRCH, "the child is gone")
			if c.stop {
				require.Eventually(t, func() bool { return errors.Is(syscall.Kill(-child.PID(), 0), syscall.ESRCH) },
					5*time.Second, 10*time.Millisecond, "and so is every process of its group")
			}
		})
	}
}

func TestSupervisorRun(t *testing.T) {
	s := NewSupervisor(t.TempDir(), nil)
	require.NoError(t, s.Run(context.Background(), "ok", os.Environ(), "/bin/sh", "-c", "exit 0"))
	err := s.Run(context.Background(), "fails", os.Environ(), "/bin/sh", "-c", "echo broken; exit 1")
	require.ErrorContains(t, err, "exit status 1")
	require.ErrorContains(t, err, "broken", "the end of its log")
}

func TestBackoff(t *testing.T) {
	b := Backoff{Initial: time.Second, Max: 30 * time.Second, Reset: time.Minute}
	for _, c := range []struct {
		name     string
		prev, up time.Duration
		want     time.Duration
	}{
		{name: "first exit", prev: 0, up: time.Second, want: time.Second},
		{name: "quick exits double", prev: time.Second, up: time.Second, want: 2 * time.Second},
		{name: "again", prev: 8 * time.Second, up: 0, want: 16 * time.Second},
		{name: "up to the cap", prev: 16 * time.Second, up: 0, want: 30 * time.Second},
		{name: "at the cap", prev: 30 * time.Second, up: 59 * time.Second, want: 30 * time.Second},
		{name: "a long run resets", prev: 30 * time.Second, up: time.Minute, want: time.Second},
	} {
		t.Run(c.name, func(t *testing.T) { require.Equal(t, c.want, b.Next(c.prev, c.up)) })
	}
}

// TestSupervisorRestarts: with Restart set, a child that dies (SIGKILL) is logged and started
// again with the same command; one that keeps dying is started again after waits that double up
// to the cap; StopAll ends it for good, even during a wait.
func TestSupervisorRestarts(t *testing.T) {
	t.Run("killed: started again", func(t *testing.T) {
		dir := t.TempDir()
		var logs syncBuffer
		s := NewSupervisor(dir, slog.New(slog.NewTextHandler(&logs, nil)))
		s.Restart = &Backoff{Initial: 50 * time.Millisecond, Max: time.Second, Reset: time.Minute}
		child, err := s.Start("child", os.Environ(), "/bin/sh", "-c", "exec sleep 60")
		require.NoError(t, err)
		first := child.PID()
		require.NoError(t, syscall.Kill(first, syscall.SIGKILL))
		require.Eventually(t, func() bool { return child.PID() != first }, 5*time.Second, 10*time.Millisecond)
		require.Regexp(t, fmt.Sprintf(`child exited on its own.* pid=%d exit="signal: killed" restart_in=50ms`, first), logs.String())
		require.Contains(t, logs.String(), fmt.Sprintf(`msg="started child" pid=%d`, child.PID()))
		require.NoError(t, syscall.Kill(child.PID(), 0), "the new process runs")
		s.StopAll(time.Second, []*Child{child})
		require.EqualError(t, child.Err(), "signal: terminated")
		select {
		case <-s.Exited():
			t.Fatal("a restarted child is not reported on Exited")
		default:
		}
		b, err := os.ReadFile(filepath.Join(dir, "child.log"))
		require.NoError(t, err)
		require.Equal(t, 2, strings.Count(string(b), ": start /bin/sh"), "one log across restarts:\n%s", b)
	})

	t.Run("keeps dying: waits double to the cap", func(t *testing.T) {
		dir := t.TempDir()
		s := NewSupervisor(dir, nil)
		s.Restart = &Backoff{Initial: 100 * time.Millisecond, Max: 400 * time.Millisecond, Reset: time.Minute}
		starts := filepath.Join(dir, "starts")
		child, err := s.Start("child", os.Environ(), "/bin/sh", "-c", "date +%s%N >> "+starts+"; exit 1")
		require.NoError(t, err)
		var at []time.Time
		require.Eventually(t, func() bool {
			b, _ := os.ReadFile(starts)
			at = at[:0]
			for _, line := range strings.Fields(string(b)) {
				if ns, err := strconv.ParseInt(line, 10, 64); err == nil {
					at = append(at, time.Unix(0, ns))
				}
			}
			return len(at) >= 6
		}, 10*time.Second, 10*time.Millisecond)
		s.StopAll(time.Second, []*Child{child})
		for i, want := range []time.Duration{100, 200, 400, 400, 400} {
			gap := at[i+1].Sub(at[i])
			require.GreaterOrEqual(t, gap, want*time.Millisecond, "wait %d", i+1)
			require.Less(t, gap, want*time.Millisecond+time.Second, "wait %d", i+1)
		}
		b, _ := os.ReadFile(starts)
		time.Sleep(600 * time.Millisecond)
		after, _ := os.ReadFile(starts)
		require.Equal(t, string(b), string(after), "no start after StopAll")
	})

	t.Run("stopped during a wait", func(t *testing.T) {
		s := NewSupervisor(t.TempDir(), nil)
		s.Restart = &Backoff{Initial: time.Minute, Max: time.Minute, Reset: time.Minute}
		child, err := s.Start("child", os.Environ(), "/bin/sh", "-c", "exit 2")
		require.NoError(t, err)
		require.EqualError(t, child.Err(), "exit status 2")
		began := time.Now()
		s.StopAll(time.Second, []*Child{child})
		require.Less(t, time.Since(began), time.Second)
	})
}

// syncBuffer is a log that the supervisor's goroutines write while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A killed child stays down, is neither restarted nor counted as an exit nobody asked for, and
// Resume starts it again; an exit of its own is recorded.
func TestSupervisorKillResume(t *testing.T) {
	dir := t.TempDir()
	s := NewSupervisor(dir, nil)
	s.WorkDir = dir
	s.Restart = &Backoff{Initial: 50 * time.Millisecond, Max: time.Second, Reset: time.Minute}
	child, err := s.Start("child", os.Environ(), "/bin/sh", "-c", "pwd > where; exec sleep 60")
	require.NoError(t, err)
	require.Eventually(t, func() bool { b, _ := os.ReadFile(filepath.Join(dir, "where")); return len(b) > 0 }, 5*time.Second, 10*time.Millisecond)
	where, _ := os.ReadFile(filepath.Join(dir, "where"))
	require.Equal(t, dir, strings.TrimSpace(string(where)), "the child runs in WorkDir")

	first := child.PID()
	require.NoError(t, child.Kill())
	require.EqualError(t, child.Err(), "signal: killed")
	time.Sleep(300 * time.Millisecond) // six restart waits
	require.False(t, child.Running(), "a killed child stays down")
	require.Equal(t, first, child.PID())
	require.Empty(t, child.Exits())

	require.NoError(t, child.Resume())
	require.True(t, child.Running())
	require.NotEqual(t, first, child.PID())
	second := child.PID()
	require.NoError(t, syscall.Kill(second, syscall.SIGKILL)) // not through Kill: an exit of its own
	require.Eventually(t, func() bool { return child.PID() != second && child.Running() }, 5*time.Second, 10*time.Millisecond)
	exits := child.Exits()
	require.Len(t, exits, 1)
	require.Contains(t, exits[0], "signal: killed")
	s.StopAll(time.Second, []*Child{child})
	require.NoError(t, child.Resume(), "a stopped child is not resumed")
	require.False(t, child.Running())
}

// A child killed while it waits to be started again after an exit of its own, and resumed
// before that wait ends, runs once: the wait ends with the kill, and the process Resume started
// is the only one, which Stop then ends.
func TestSupervisorKillDuringARestartWait(t *testing.T) {
	dir := t.TempDir()
	s := NewSupervisor(dir, nil)
	s.WorkDir = dir
	s.Restart = &Backoff{Initial: 300 * time.Millisecond, Max: time.Second, Reset: time.Minute}
	// The first run exits at once; every later one records its pid and stays.
	child, err := s.Start("child", os.Environ(), "/bin/sh", "-c", "if [ -e ran ]; then echo $$ >> pids; exec sleep 60; fi; touch ran; exit 1")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(child.Exits()) == 1 }, 5*time.Second, time.Millisecond)
	require.NoError(t, child.Kill())
	require.NoError(t, child.Resume())
	time.Sleep(time.Second) // past the restart wait

	b, _ := os.ReadFile(filepath.Join(dir, "pids"))
	pids := strings.Fields(string(b))
	require.Equal(t, []string{strconv.Itoa(child.PID())}, pids, "one process: the one Resume started")
	require.NoError(t, s.StopAll(time.Second, []*Child{child}))
	for _, p := range pids {
		pid, _ := strconv.Atoi(p)
		require.True(t, syscall.Kill(pid, 0) != nil || zombie(pid), "process %d outlived Stop", pid)
	}
}

// A kill undone at once (Kill, then Resume) is no exit nobody asked for, however late the
// supervisor looks at the killed process: it is not recorded, and nothing is started beside the
// process Resume started.
func TestSupervisorKillResumeAtOnce(t *testing.T) {
	dir := t.TempDir()
	s := NewSupervisor(dir, nil)
	s.WorkDir = dir
	s.Restart = &Backoff{Initial: 10 * time.Millisecond, Max: time.Second, Reset: time.Minute}
	child, err := s.Start("child", os.Environ(), "/bin/sh", "-c", "echo $$ >> pids; exec sleep 60")
	require.NoError(t, err)
	for range 300 {
		require.NoError(t, child.Kill())
		require.NoError(t, child.Resume())
	}
	time.Sleep(200 * time.Millisecond) // past the restart wait

	require.Empty(t, child.Exits())
	b, _ := os.ReadFile(filepath.Join(dir, "pids"))
	for _, p := range strings.Fields(string(b)) {
		pid, _ := strconv.Atoi(p)
		require.True(t, pid == child.PID() || syscall.Kill(pid, 0) != nil || zombie(pid), "process %d runs beside %d", pid, child.PID())
	}
	require.NoError(t, s.StopAll(time.Second, []*Child{child}))
}

// When the parent dies, however it dies, its children get SIGTERM: a supervisor in a helper
// process (this test binary again) starts a child, and the helper is SIGKILLed.
func TestSupervisorChildDiesWithItsParent(t *testing.T) {
	if pidFile := os.Getenv("DEVENV_PARENT_DEATH_HELPER"); pidFile != "" {
		s := NewSupervisor(filepath.Dir(pidFile), nil)
		c, err := s.Start("orphan", os.Environ(), "/bin/sh", "-c", "trap 'echo terminated > "+pidFile+".term; exit 0' TERM; while :; do sleep 0.1; done")
		if err != nil {
			os.Exit(3)
		}
		time.Sleep(200 * time.Millisecond) // the shell has set its trap
		_ = os.WriteFile(pidFile, []byte(strconv.Itoa(c.PID())), 0o644)
		time.Sleep(time.Minute)
		return
	}
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child.pid")
	helper := exec.Command(os.Args[0], "-test.run", "^TestSupervisorChildDiesWithItsParent$")
	helper.Env = append(os.Environ(), "DEVENV_PARENT_DEATH_HELPER="+pidFile)
	require.NoError(t, helper.Start())
	var pid int
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(string(b))
		return pid > 0
	}, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, syscall.Kill(pid, 0), "the child runs")
	require.NoError(t, helper.Process.Kill())
	_ = helper.Wait()
	require.Eventually(t, func() bool { return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) || zombie(pid) },
		10*time.Second, 10*time.Millisecond, "the child outlived its parent")
	b, err := os.ReadFile(pidFile + ".term")
	require.NoError(t, err, "the child got SIGTERM")
	require.Equal(t, "terminated\n", string(b))
}

func zombie(pid int) bool {
	stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	return strings.Contains(string(stat), ") Z ")
}

// A one-shot command: its output, its stdin, its standard error in a failure, and its whole
// group killed when ctx ends.
func TestCommand(t *testing.T) {
	ctx := context.Background()
	out, err := Command{Stdin: []byte("in")}.Run(ctx, "/bin/sh", "-c", "cat; echo out; echo noise >&2")
	require.NoError(t, err)
	require.Equal(t, "inout\n", out)

	_, err = Command{}.Run(ctx, "/bin/sh", "-c", "echo why >&2; exit 3")
	require.ErrorContains(t, err, "exit status 3: why")
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)

	dir := t.TempDir()
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	began := time.Now()
	_, err = Command{Dir: dir}.Run(short, "/bin/sh", "-c", "sleep 60 & echo $! > child; wait")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(began), 5*time.Second)
	b, err := os.ReadFile(filepath.Join(dir, "child"))
	require.NoError(t, err)
	child, err := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return errors.Is(syscall.Kill(child, 0), syscall.ESRCH) || zombie(child) },
		5*time.Second, 10*time.Millisecond, "the group dies with it")
}

// A child that dies before it is ready is not called ready because another process answers 200
// on the address it was to serve, nor waited for while a silent listener holds that address.
func TestWaitHTTPSeesTheChildsDeath(t *testing.T) {
	foreign := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer foreign.Close()
	silent, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers
	require.NoError(t, err)
	defer silent.Close()
	for _, url := range []string{foreign.URL + "/readyz", "http://" + silent.Addr().String() + "/readyz"} {
		s := NewSupervisor(t.TempDir(), nil)
		c, err := s.Start("dies", nil, "/bin/false")
		require.NoError(t, err)
		<-c.Done() // it died while the launcher started another child
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		began := time.Now()
		err = WaitHTTP(ctx, url, c)
		cancel()
		require.ErrorContains(t, err, "dies exited", url)
		require.Less(t, time.Since(began), 5*time.Second, url)
	}
}

// A launcher refuses an address another process holds, naming the setting, before starting the
// child that would fail to bind it.
func TestCheckAddrFree(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	require.ErrorContains(t, CheckAddrFree(ln.Addr().String(), "KASA_API_ADDR"), ln.Addr().String()+" (KASA_API_ADDR) is taken by another process")
	free, err := FreePort()
	require.NoError(t, err)
	require.NoError(t, CheckAddrFree("127.0.0.1:"+strconv.Itoa(free), "KASA_API_ADDR"))
}
