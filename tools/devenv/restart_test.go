package devenv_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/devenv"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// With these set, the test binary is a helper: it starts a cluster in the directory on the port,
// prints its URL and waits to be killed.
const (
	helperDirEnv  = "DEVENV_TEST_POSTGRES_DIR"
	helperPortEnv = "DEVENV_TEST_POSTGRES_PORT"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(helperDirEnv); dir != "" {
		port, _ := strconv.Atoi(os.Getenv(helperPortEnv))
		pg, err := devenv.StartPostgres(context.Background(), devenv.PostgresOptions{Dir: dir, Port: port})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(pg.URL)
		time.Sleep(time.Hour)
	}
	os.Exit(m.Run())
}

// TestPostgresRestartsAfterKill: a postmaster SIGKILLed and not reaped (its parent, a helper
// process, is stopped, so it stays a zombie) leaves its lock files behind; a new server on the
// same directory and port starts at once and finds what was committed before the kill.
func TestPostgresRestartsAfterKill(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tmp := t.TempDir()
	dir := filepath.Join(tmp, "pg")
	port, err := devenv.FreePort()
	require.NoError(t, err)

	helper := exec.Command(os.Args[0], "-test.run=^$")
	helper.Env = append(os.Environ(), helperDirEnv+"="+dir, helperPortEnv+"="+strconv.Itoa(port))
	logs, err := os.Create(filepath.Join(tmp, "helper.log"))
	require.NoError(t, err)
	helper.Stderr = logs
	out, err := helper.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, helper.Start())
	t.Cleanup(func() { _ = helper.Process.Kill(); _ = helper.Wait(); logs.Close() })
	url, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, "the helper's cluster: %s", testkit.Tail(logs.Name(), 20))

	// The store stays open: its backend outlives the postmaster for a moment.
	m := testkit.NewMerchant(t, openStore(t, strings.TrimSpace(url)), testkit.MerchantOptions{Deposit: 12_345})

	pid := postmasterPID(t, dir)
	require.NoError(t, helper.Process.Signal(syscall.SIGSTOP))
	// kill(2) returns before every thread has stopped; a thread still in wait4 would reap the
	// postmaster, so the kill waits for the whole helper to be stopped.
	require.Eventually(t, func() bool { return allStopped(helper.Process.Pid) }, 5*time.Second, 5*time.Millisecond,
		"the helper stops")
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		return strings.Contains(string(b), ") Z ")
	}, 5*time.Second, 10*time.Millisecond, "the killed postmaster is a zombie")

	pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: dir, Port: port})
	require.NoError(t, err, "a start right after the kill")
	t.Cleanup(func() { _ = pg.Stop() })
	a, err := openStore(t, pg.URL).Account(ctx, m.Account)
	require.NoError(t, err)
	require.Equal(t, int64(12_345), a.Balance, "the deposit committed before the kill")
}

// TestPostgresRefusesALiveDirectory: a second start on a running cluster's directory fails and
// says why, and leaves the running server and its lock file alone.
func TestPostgresRefusesALiveDirectory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "pg")
	pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: dir, Ephemeral: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pg.Stop() })
	lock, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	require.NoError(t, err)

	_, err = devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: dir, Ephemeral: true})
	require.ErrorContains(t, err, fmt.Sprintf("PostgreSQL (pid %d) is already running on %s", postmasterPID(t, dir), dir))

	after, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	require.NoError(t, err)
	require.Equal(t, string(lock), string(after))
	require.NoError(t, openStore(t, pg.URL).Ping(ctx), "the running server still answers")
}

func openStore(t *testing.T, url string) *store.Store {
	t.Helper()
	db, err := store.Open(context.Background(), store.Options{URL: url, SecretKey: testkit.SecretKey, Migrate: true})
	require.NoError(t, err)
	t.Cleanup(db.Close)
	return db
}

// allStopped reports whether every thread of the process is in the stopped state.
func allStopped(pid int) bool {
	stats, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	for _, f := range stats {
		b, err := os.ReadFile(f)
		_, rest, _ := strings.Cut(string(b), ") ")
		if err != nil || !strings.HasPrefix(rest, "T") && !strings.HasPrefix(rest, "t") {
			return false
		}
	}
	return len(stats) > 0
}

// postmasterPID is the first line of the cluster's postmaster.pid.
func postmasterPID(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	require.NoError(t, err)
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(first)
	require.NoError(t, err)
	return pid
}

// TestPostgresStartsAfterAnInterruptedInit: a first start stopped while initdb writes the
// cluster (kasa dev killed on its first run) leaves nothing a later start takes for a cluster:
// the next start on the same directory initialises it and comes up.
func TestPostgresStartsAfterAnInterruptedInit(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "pg")
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan error, 1)
	go func() {
		pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: dir, Ephemeral: true})
		if err == nil {
			_ = pg.Stop()
		}
		started <- err
	}()
	// initdb has begun: it writes PG_VERSION first, wherever it initialises.
	require.Eventually(t, func() bool {
		m, _ := filepath.Glob(filepath.Join(filepath.Dir(dir), "*", "PG_VERSION"))
		return len(m) > 0
	}, time.Minute, time.Millisecond)
	cancel()
	require.Error(t, <-started, "the interrupted start")

	pg, err := devenv.StartPostgres(context.Background(), devenv.PostgresOptions{Dir: dir, Ephemeral: true})
	require.NoError(t, err, "a start after the interrupted one")
	require.NoError(t, pg.Stop())
}
