package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/tools/testkit"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testkit.RemoveKasaBinary()
	os.Exit(code)
}

// kasaEnv is the environment of a kasa process a test runs: the test's settings (pairs), never
// the developer's KASA_* variables.
func kasaEnv(vars ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KASA_") {
			out = append(out, kv)
		}
	}
	for i := 0; i+1 < len(vars); i += 2 {
		out = append(out, vars[i]+"="+vars[i+1])
	}
	return out
}

// kasa reconcile is a command that ends: with its database down it exits 3 ("could not run:
// nothing is lost, run it again", docs/reconciliation.md) at once, rather than wait for it as
// the long-running processes do.
func TestReconcileExits3WhenTheDatabaseIsDown(t *testing.T) {
	bin, dir := testkit.KasaBinary(t), t.TempDir()
	csv := filepath.Join(dir, "s.csv")
	require.NoError(t, os.WriteFile(csv, []byte("settlement_date,provider_charge_id,reference,amount,currency,status\n"), 0o600))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "reconcile", "--all-merchants", csv)
	cmd.Dir = dir
	cmd.Env = kasaEnv("KASA_DATABASE_URL", "postgres://kasa@127.0.0.1:1/kasa?sslmode=disable",
		"KASA_TEMPORAL_ADDRESS", "127.0.0.1:1", "KASA_DATA_DIR", dir)
	out, err := cmd.CombinedOutput()
	require.NoError(t, ctx.Err(), "kasa reconcile still waiting after 30 s:\n%s", out)
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "%s", out)
	require.Equal(t, 3, exit.ExitCode(), "%s", out)
	require.Contains(t, string(out), "database", "%s", out)
}
