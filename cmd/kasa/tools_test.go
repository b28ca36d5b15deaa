//go:build !production

package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The full build (make build) keeps every subcommand of the contract.
func TestFullBuildRunsTheTools(t *testing.T) {
	for _, name := range []string{"api", "worker", "relay", "migrate", "verify", "reconcile", "dev", "cluster", "banksim", "bench", "soak"} {
		require.Contains(t, commands, name)
		require.Contains(t, usage(), "\n  "+name+" ")
	}
}
