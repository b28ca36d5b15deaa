package devenv

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The dev server is run by the same process layer as every other child: when the process that
// started it dies, however it dies, the dev server goes too, and does not hold its port and
// database file for the next start. A helper process (this test binary again) starts one and is
// SIGKILLed.
func TestTemporalDevServerDiesWithItsParent(t *testing.T) {
	if dbFile := os.Getenv("DEVENV_TEMPORAL_HELPER"); dbFile != "" {
		// Its log in a file, as kasa dev's and the soak's: no pipe to break when the parent dies.
		if _, err := StartTemporal(context.Background(), TemporalOptions{DBFile: dbFile, LogDir: filepath.Dir(dbFile)}); err != nil {
			os.Exit(3)
		}
		_ = os.WriteFile(dbFile+".ready", nil, 0o644)
		time.Sleep(time.Minute)
		return
	}
	if _, err := FindTemporalCLI(); err != nil {
		t.Skip(err)
	}
	dbFile := filepath.Join(t.TempDir(), "temporal.db")
	helper := exec.Command(os.Args[0], "-test.run", "^TestTemporalDevServerDiesWithItsParent$")
	helper.Env = append(os.Environ(), "DEVENV_TEMPORAL_HELPER="+dbFile)
	require.NoError(t, helper.Start())
	t.Cleanup(func() {
		for _, pid := range PIDsMentioning(dbFile) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	require.Eventually(t, func() bool { _, err := os.Stat(dbFile + ".ready"); return err == nil }, time.Minute, 50*time.Millisecond)
	pids := PIDsMentioning(dbFile)
	require.Len(t, pids, 1, "the dev server")
	require.NoError(t, helper.Process.Kill())
	_ = helper.Wait()
	require.Eventually(t, func() bool { return errors.Is(syscall.Kill(pids[0], 0), syscall.ESRCH) || zombie(pids[0]) },
		30*time.Second, 50*time.Millisecond, "the dev server outlived the process that started it")
}
