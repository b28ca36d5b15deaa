package devenv

import (
	"context"
	"errors"
	"os"
	"path/filepath"
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
				s.StopAll(time.Second, []*Child{child})
				require.Less(t, time.Since(began), 5*time.Second)
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
