package tests

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/tools/devenv"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// TestDevRestartsAfterKill: `kasa dev` and every process of its group are SIGKILLed (PostgreSQL's
// lock files, the Temporal server's SQLite file and the NATS store stay as they were), and a new
// `kasa dev` on the same data directory, started at once, becomes ready with the first one's data.
func TestDevRestartsAfterKill(t *testing.T) {
	t.Parallel()
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
	logPath := filepath.Join(dir, "dev.log")

	start := func() *exec.Cmd {
		log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		require.NoError(t, err)
		cmd := exec.Command(bin, "dev")
		cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, env, log, log
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its children too, for the SIGKILL
		require.NoError(t, cmd.Start())
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); log.Close(); close(done) }()
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(60 * time.Second):
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				<-done
			}
		})
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
			if r, err := httpCall("GET", apiURL+"/readyz", "", ""); err == nil && r.Status == http.StatusOK {
				return cmd
			}
			select {
			case <-done:
				t.Fatalf("kasa dev exited before it was ready:\n%s", testkit.Tail(logPath, 30))
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("kasa dev not ready within 2 minutes:\n%s", testkit.Tail(logPath, 30))
			}
		}
	}

	first := start()
	var st devState
	require.Eventually(t, func() bool { // written once the demo merchant is seeded, after /readyz
		b, _ := os.ReadFile(filepath.Join(dir, "data", "dev.json"))
		return json.Unmarshal(b, &st) == nil && st.DemoAPIKey != ""
	}, 30*time.Second, 50*time.Millisecond, "kasa dev's dev.json")
	r := httpDo(t, "POST", apiURL+"/v1/payments", st.DemoAPIKey, payBody("restart-1", "100.00", "TRY", st.DemoAccountID), "Idempotency-Key", "restart-1")
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)

	require.NoError(t, syscall.Kill(-first.Process.Pid, syscall.SIGKILL))
	start()
	r = httpDo(t, "GET", apiURL+"/v1/accounts/"+st.DemoAccountID, st.DemoAPIKey, "")
	require.Contains(t, string(r.Body), `"balance":"9900.00"`, "the payment made before the kill")
}
