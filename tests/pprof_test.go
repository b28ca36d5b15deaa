package tests

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

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

	pprof := fmt.Sprintf("http://127.0.0.1:%d/debug/pprof", pprofPort)
	p.waitHTTP(pprof + "/cmdline")
	cmdline := httpDo(t, "GET", pprof+"/cmdline", "", "")
	require.True(t, strings.HasSuffix(strings.TrimRight(string(cmdline.Body), "\x00"), "banksim"), "cmdline: %q", cmdline.Body)
	require.Equal(t, http.StatusOK, httpDo(t, "GET", pprof+"/heap?debug=1", "", "").Status)
	require.NotEqual(t, http.StatusOK, httpDo(t, "GET", sim+"/debug/pprof/cmdline", "", "").Status,
		"the simulator's own listener must not serve pprof")
}
