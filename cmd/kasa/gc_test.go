package main

import (
	"os"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/internal/devenv"
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
