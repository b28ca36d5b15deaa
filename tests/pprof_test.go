package tests

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/tools/testkit"
)

// TestPprofOnlyWhenAsked: KASA_DEBUG_PPROF_ADDR serves Go's profiles on its own listener, and
// the process's other listener never does.
func TestPprofOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := kasaBinary(t, dir)
	simAddr, pprofAddr := testkit.FreeAddr(t), testkit.FreeAddr(t)
	sim := "http://" + simAddr
	p := startProc(t, dir, bin, "banksim", kasaEnv(map[string]string{
		"KASA_BANKSIM_ADDR": simAddr, "KASA_DATA_DIR": dir, "KASA_DEBUG_PPROF_ADDR": pprofAddr,
	}), "banksim")

	pprof := "http://" + pprofAddr + "/debug/pprof"
	// The two listeners come up one after the other: wait for both.
	p.waitHTTP(pprof + "/cmdline")
	p.waitHTTP(sim + "/_sim/healthz")
	cmdline := httpDo(t, "GET", pprof+"/cmdline", "", "")
	require.True(t, strings.HasSuffix(strings.TrimRight(string(cmdline.Body), "\x00"), "banksim"), "cmdline: %q", cmdline.Body)
	require.Equal(t, http.StatusOK, httpDo(t, "GET", pprof+"/heap?debug=1", "", "").Status)
	require.NotEqual(t, http.StatusOK, httpDo(t, "GET", sim+"/debug/pprof/cmdline", "", "").Status,
		"the simulator's own listener must not serve pprof")
}
