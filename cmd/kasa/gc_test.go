//go:build !production

package main

import (
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/tools/devenv"
)

// kasa dev and kasa bench collect garbage less often, unless the user set GOGC.
func TestRelaxGCLeavesAUsersGOGC(t *testing.T) {
	prev := debug.SetGCPercent(100)
	defer debug.SetGCPercent(prev)

	t.Setenv("GOGC", "100")
	relaxGC()
	require.Equal(t, 100, debug.SetGCPercent(100))

	require.NoError(t, os.Unsetenv("GOGC")) // t.Setenv restores it after the test
	relaxGC()
	require.Equal(t, devenv.RelaxedGOGC, debug.SetGCPercent(100))
}

// kasa dev leaves half the cores (at least one) to the PostgreSQL and Temporal it runs beside,
// unless the user set GOMAXPROCS.
func TestShareCoresLeavesAUsersGOMAXPROCS(t *testing.T) {
	prev := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(prev)
	t.Setenv("GOMAXPROCS", "") // restored after the test, as the unsetting below is not

	for _, tc := range []struct{ cpus, want int }{{1, 1}, {2, 1}, {3, 1}, {4, 2}, {16, 8}} {
		runtime.GOMAXPROCS(prev)
		require.NoError(t, os.Unsetenv("GOMAXPROCS"))
		shareCores(tc.cpus)
		require.Equal(t, tc.want, runtime.GOMAXPROCS(0), "%d cores", tc.cpus)
	}

	runtime.GOMAXPROCS(prev)
	t.Setenv("GOMAXPROCS", strconv.Itoa(prev))
	shareCores(16)
	require.Equal(t, prev, runtime.GOMAXPROCS(0), "the user's choice stands")
}
