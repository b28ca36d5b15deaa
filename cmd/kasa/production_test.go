package main

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/tools/testkit"
)

// The production build (-tags production, as the Docker image is built) runs exactly the
// production subcommands and links none of the developer tools' packages.
func TestProductionBuildCarriesNoTools(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-tags", "production", ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, pkg := range strings.Fields(string(out)) {
		require.NotContains(t, pkg, "github.com/kasa-pay/kasa/tools/", "the production build links a developer tool")
		require.NotContains(t, pkg, "toxiproxy", "the production build links the fault proxy")
	}

	bin := filepath.Join(t.TempDir(), "kasa")
	out, err = exec.Command("go", "build", "-tags", "production", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	help, err := exec.Command(bin, "help").Output()
	require.NoError(t, err)
	for _, tool := range []string{"dev", "cluster", "banksim", "bench", "soak"} {
		require.NotContains(t, string(help), "\n  "+tool+" ", "help lists %s", tool)
		out, err := exec.Command(bin, tool).CombinedOutput()
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "%s: %s", tool, out)
		require.Equal(t, 2, exit.ExitCode())
		require.Contains(t, string(out), `kasa: unknown command "`+tool+`"`)
	}
	for _, cmd := range []string{"api", "worker", "relay", "migrate", "verify", "reconcile", "rotate-secret-key"} {
		require.Contains(t, string(help), "\n  "+cmd+" ", "help lists %s", cmd)
	}

	// It has no simulator to charge: a worker without KASA_PROVIDER_URL refuses at once, before
	// it waits for the database or charges whatever answers on KASA_BANKSIM_ADDR.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	worker := exec.CommandContext(ctx, bin, "worker")
	worker.Env = kasaEnv("KASA_DATA_DIR", t.TempDir(), "KASA_DATABASE_URL", "postgres://kasa_app:x@127.0.0.1:1/kasa?sslmode=disable",
		"KASA_SECRET_KEY", strings.Repeat("0", 63)+"1", "KASA_TEMPORAL_ADDRESS", "127.0.0.1:1")
	out, err = worker.CombinedOutput()
	require.NoError(t, ctx.Err(), "the worker waited instead of refusing:\n%s", out)
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "%s", out)
	require.NotZero(t, exit.ExitCode())
	require.Contains(t, string(out), "KASA_PROVIDER_URL", "%s", out)
}

// A command that reads no arguments refuses them rather than ignore them: `kasa dev --help`
// prints the usage, and does not start a whole system on the default ports.
func TestCommandsWithoutArgumentsRefuseThem(t *testing.T) {
	bin := testkit.KasaBinary(t)
	run := func(args ...string) (string, int) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = kasaEnv("KASA_DATA_DIR", t.TempDir())
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return string(out), exit.ExitCode()
		}
		require.NoError(t, err, "%s", out)
		return string(out), 0
	}
	for _, c := range []string{"dev", "api", "migrate"} {
		out, code := run(c, "--help")
		require.Equal(t, 0, code, "%s --help: %s", c, out)
		require.Contains(t, out, "usage: kasa <command>", c)
		out, code = run(c, "--bogus")
		require.Equal(t, 2, code, "%s --bogus: %s", c, out)
		require.Contains(t, out, "kasa "+c+" takes no arguments", c)
	}
}

// A setting kasa cannot use ends every command at once with status 2, naming it, before the
// command waits for or starts anything; a command kasa does not have is named as such first,
// whatever its arguments or the configuration.
func TestBadSettingsAndUnknownCommandsExit2(t *testing.T) {
	bin := testkit.KasaBinary(t)
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"worker with a bank URL it cannot call", []string{"worker"}, []string{"KASA_PROVIDER_URL", "bank.example"}, "KASA_PROVIDER_URL"},
		{"api on an address without a port", []string{"api"}, []string{"KASA_API_ADDR", "localhost"}, "KASA_API_ADDR"},
		{"dev with Temporal's port out of range", []string{"dev"}, []string{"KASA_TEMPORAL_PORT", "70000"}, "KASA_TEMPORAL_PORT"},
		{"unknown command with arguments", []string{"nosuch", "--flag"}, nil, `kasa: unknown command "nosuch"`},
		{"unknown command with a bad setting", []string{"nosuch"}, []string{"KASA_LOG_LEVEL", "verbose"}, `kasa: unknown command "nosuch"`},
		// Its APIs would refuse the token, after the whole cluster started around them.
		{"cluster with an admin token its APIs refuse", []string{"cluster"}, []string{"KASA_ADMIN_TOKEN", "short"}, "KASA_ADMIN_TOKEN must be at least 32 characters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			dir := t.TempDir()
			cmd := exec.CommandContext(ctx, bin, tc.args...)
			cmd.Env = kasaEnv(append([]string{"KASA_DATA_DIR", dir,
				"KASA_DATABASE_URL", "postgres://kasa@127.0.0.1:1/kasa?sslmode=disable", "KASA_TEMPORAL_ADDRESS", "127.0.0.1:1",
				"KASA_SECRET_KEY", strings.Repeat("0", 63) + "1", "KASA_ADMIN_TOKEN", strings.Repeat("a", 40)}, tc.env...)...)
			out, err := cmd.CombinedOutput()
			require.NoError(t, ctx.Err(), "still running after 20 s:\n%s", out)
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "%s", out)
			require.NotZero(t, exit.ExitCode(), "%s", out)
			if !strings.HasPrefix(tc.name, "cluster") {
				require.Equal(t, 2, exit.ExitCode(), "%s", out)
			}
			require.Contains(t, string(out), tc.want)
			require.NoDirExists(t, filepath.Join(dir, "postgres"), "nothing started")
			require.NoDirExists(t, filepath.Join(dir, "cluster", "logs"), "nothing started")
		})
	}
}
