package tests

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/tools/devenv"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// devStarter gives a test's `kasa dev` its directory, its API's URL, and a start that waits
// until it is ready; each start runs on the same data directory and ports.
func devStarter(t *testing.T) (string, string, func() *proc) {
	t.Helper()
	dir, apiURL, launch := devLauncher(t)
	return dir, apiURL, func() *proc {
		p := launch()
		p.waitHTTP(apiURL + "/readyz")
		return p
	}
}

// devLauncher is devStarter's start without the wait for /readyz.
func devLauncher(t *testing.T) (string, string, func() *proc) {
	t.Helper()
	dir := crashDir(t)
	bin := kasaBinary(t, dir)
	cli, err := devenv.FindTemporalCLI()
	require.NoError(t, err)
	temporalPort, err := devenv.FreePort()
	require.NoError(t, err)
	apiURL := "http://" + testkit.FreeAddr(t)
	env := kasaEnv(map[string]string{
		"KASA_DATA_DIR": filepath.Join(dir, "data"), "KASA_TEMPORAL_CLI": cli,
		"KASA_API_ADDR": apiURL[len("http://"):], "KASA_BANKSIM_ADDR": testkit.FreeAddr(t),
		"KASA_TEMPORAL_PORT": strconv.Itoa(temporalPort), "KASA_TEMPORAL_UI_PORT": "0",
	})
	return dir, apiURL, func() *proc { return startProc(t, dir, bin, "dev", env, "dev") }
}

// TestDevRestartsAfterKill: `kasa dev` and every process it started are SIGKILLed at once (PostgreSQL's
// lock files, the Temporal server's SQLite file and the NATS store stay as they were), and a new
// `kasa dev` on the same data directory, started at once, becomes ready with the first one's data.
func TestDevRestartsAfterKill(t *testing.T) {
	t.Parallel()
	dir, apiURL, start := devStarter(t)

	start()
	var st devState
	require.Eventually(t, func() bool { // written once the demo merchant is seeded, after /readyz
		b, _ := os.ReadFile(filepath.Join(dir, "data", "dev.json"))
		return json.Unmarshal(b, &st) == nil && st.DemoAPIKey != ""
	}, 30*time.Second, 50*time.Millisecond, "kasa dev's dev.json")
	r := httpDo(t, "POST", apiURL+"/v1/payments", st.DemoAPIKey, payBody("restart-1", "100.00", "TRY", st.DemoAccountID), "Idempotency-Key", "restart-1")
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)

	// It and its children at once, as a power loss would: each runs in a group of its own, and
	// every one names the test's directory.
	for _, pid := range pidsMentioning(dir + "/") {
		require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	}
	require.Eventually(t, func() bool { return len(pidsMentioning(dir+"/")) == 0 }, 10*time.Second, 10*time.Millisecond)
	start()
	r = httpDo(t, "GET", apiURL+"/v1/accounts/"+st.DemoAccountID, st.DemoAPIKey, "")
	require.Contains(t, string(r.Body), `"balance":"9900.00"`, "the payment made before the kill")
}

// TestDevKilledAloneLeavesNothingRunning: `kasa dev` alone is SIGKILLed (the OOM killer, kill -9),
// and every process it started goes with it: PostgreSQL, the Temporal dev server. A dev server
// left running would hold its port and database file against the next `kasa dev`.
func TestDevKilledAloneLeavesNothingRunning(t *testing.T) {
	t.Parallel()
	dir, _, start := devStarter(t)
	p := start()
	temporal := pidsMentioning(filepath.Join(dir, "data", "temporal") + "/")
	require.Len(t, temporal, 1, "the Temporal dev server: %v", processesMentioning(dir+"/"))

	require.NoError(t, syscall.Kill(p.pid(), syscall.SIGKILL))
	require.Eventually(t, func() bool { return len(processesMentioning(dir+"/")) == 0 }, 60*time.Second, 100*time.Millisecond,
		"left running after kasa dev was killed: %v", processesMentioning(dir+"/"))
}

// A SIGTERM while kasa dev is still starting (its PostgreSQL up, its Temporal starting) is a
// clean stop: exit status 0, and nothing of it left running.
func TestDevStoppedWhileStarting(t *testing.T) {
	t.Parallel()
	dir, _, launch := devLauncher(t)
	p := launch()
	p.waitLog("PostgreSQL ready", 2*time.Minute)
	p.stopCleanly(30 * time.Second)
	require.Eventually(t, func() bool { return len(processesMentioning(dir+"/")) == 0 }, 10*time.Second, 100*time.Millisecond,
		"left running: %v", processesMentioning(dir+"/"))
}

// A second kasa dev on a data directory in use is refused at once, naming the first: its
// PostgreSQL would refuse the directory, but not the Temporal dev server's file, the bank's
// records or the NATS store, nor anything with KASA_DATABASE_URL set.
func TestSecondDevOnADataDirectoryIsRefused(t *testing.T) {
	t.Parallel()
	_, _, launch := devLauncher(t)
	first := launch()
	first.waitLog("PostgreSQL ready", 2*time.Minute)
	second := launch()
	select {
	case <-second.c.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the second kasa dev kept running")
	}
	second.waitLog("another kasa dev runs on", time.Second)
	first.requireRunning(t, "the first kasa dev")
}

// `kasa dev` alone is SIGKILLed and started again at once on its data directory, as a supervisor
// would: its PostgreSQL and Temporal are still on their way out (they stop on their parent's
// death), and the new start waits for them rather than refusing the directory.
func TestDevStartsAgainAtOnceAfterItAloneIsKilled(t *testing.T) {
	t.Parallel()
	_, _, start := devStarter(t)
	p := start()
	p.kill()
	start() // fails when the new kasa dev exits before it is ready
}
