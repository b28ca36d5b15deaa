package tests

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/internal/devenv"
)

// TestPprofOnlyWhenAsked: KASA_DEBUG_PPROF_ADDR serves Go's profiles on its own listener, and
// the process's other listener never does.
func TestPprofOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := kasaBinary(t, dir)
	simPort, err := devenv.FreePort()
	require.NoError(t, err)
	pprofPort, err := devenv.FreePort()
	require.NoError(t, err)
	sim := fmt.Sprintf("http://127.0.0.1:%d", simPort)
	p := startProc(t, dir, bin, "banksim", kasaEnv(map[string]string{
		"KASA_BANKSIM_ADDR": fmt.Sprintf("127.0.0.1:%d", simPort), "KASA_DATA_DIR": dir,
		"KASA_DEBUG_PPROF_ADDR": fmt.Sprintf("127.0.0.1:%d", pprofPort),
	}), "banksim")

	get := func(url string) (int, string) {
		resp, err := http.Get(url)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		p.requireRunning(t, "waiting for pprof")
		if code, body := get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/cmdline", pprofPort)); code == http.StatusOK {
			require.True(t, strings.HasSuffix(strings.TrimRight(body, "\x00"), "banksim"), "cmdline: %q", body)
			break
		}
		require.True(t, time.Now().Before(deadline), "no pprof on its address within 20s")
		time.Sleep(100 * time.Millisecond)
	}
	code, _ := get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/heap?debug=1", pprofPort))
	require.Equal(t, http.StatusOK, code)
	code, _ = get(sim + "/debug/pprof/cmdline")
	require.NotEqual(t, http.StatusOK, code, "the simulator's own listener must not serve pprof")
}
