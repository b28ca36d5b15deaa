package main

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/kasa-pay/kasa/config"
)

func TestTemporalOptionsCompression(t *testing.T) {
	for _, tc := range []struct {
		gzip bool
		want client.GrpcCompression
	}{
		{gzip: false, want: &client.GrpcCompressionNone{}},
		{gzip: true, want: nil}, // nil is the SDK's default: gzip
	} {
		var cfg config.Config
		cfg.Temporal.Namespace, cfg.Temporal.Gzip = "default", tc.gzip
		o, err := temporalOptions(cfg, slog.Default())
		require.NoError(t, err)
		require.Equal(t, tc.want, o.ConnectionOptions.GrpcCompression, "gzip=%t", tc.gzip)
		require.Equal(t, "default", o.Namespace)
	}
}

// kasa api refuses an admin token anyone could guess before it connects to anything.
func TestAPIRefusesAShortAdminToken(t *testing.T) {
	for _, tc := range []struct{ token, want string }{
		{"", "KASA_ADMIN_TOKEN is not set"},
		{"adm_test_token", "KASA_ADMIN_TOKEN must be at least 32 characters"},
		{strings.Repeat("x", 31), "KASA_ADMIN_TOKEN must be at least 32 characters"},
	} {
		var cfg config.Config
		cfg.Admin.Token = tc.token
		cfg.Database.URL = "postgres://127.0.0.1:1/never" // never reached
		err := runAPI(context.Background(), cfg, slog.New(slog.DiscardHandler))
		require.ErrorContains(t, err, tc.want, "token %q", tc.token)
	}
}

// kasa worker charges only the bank it is told to: with KASA_PROVIDER_URL unset it refuses to
// start, rather than charge whatever answers on the simulator's address (docs/operations.md).
func TestWorkerRefusesWithoutProviderURL(t *testing.T) {
	t.Chdir(t.TempDir()) // no kasa.yaml of the developer's
	t.Setenv("KASA_PROVIDER_URL", "")
	t.Setenv("KASA_DATABASE_URL", "postgres://kasa_app:x@127.0.0.1:1/kasa?sslmode=disable")
	t.Setenv("KASA_SECRET_KEY", strings.Repeat("0", 63)+"1")
	t.Setenv("KASA_TEMPORAL_ADDRESS", "127.0.0.1:1")
	args := os.Args
	os.Args = []string{"kasa", "worker"} // runWorker reads its flags from os.Args, not the test binary's
	t.Cleanup(func() { os.Args = args })
	cfg, err := config.Load()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	err = runWorker(ctx, cfg, slog.New(slog.DiscardHandler))
	require.ErrorContains(t, err, "KASA_PROVIDER_URL")
	require.NoError(t, ctx.Err(), "refused at once, without waiting for the database")
}

// kasa help's reconcile lines agree with `kasa reconcile -h`: they point at it for the flags and
// list every exit status it does.
func TestUsageReconcileAgreesWithReconcileUsage(t *testing.T) {
	for _, want := range []string{
		"reconcile [flags] <settlement.csv>",
		"kasa reconcile -h",
		"0 no unresolved mismatch", "1 mismatches", "2 invalid file or usage", "3 could not run",
	} {
		require.Contains(t, usage(), want)
		if !strings.HasPrefix(want, "reconcile ") && want != "kasa reconcile -h" {
			require.Contains(t, reconcileUsage, want, "kasa reconcile -h says it too")
		}
	}
}
