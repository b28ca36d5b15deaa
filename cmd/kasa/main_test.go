package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"

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

// Without KASA_PROVIDER_URL the full build's worker charges the bank simulator on
// KASA_BANKSIM_ADDR, as kasa dev's does; the production build's refuses to start
// (TestProductionBuildCarriesNoTools). A URL given is kept.
func TestWorkerBankWithoutProviderURL(t *testing.T) {
	var cfg config.Config
	cfg.Banksim.Addr = "127.0.0.1:18090"
	require.ErrorIs(t, cfg.CheckProvider(), config.ErrNoProvider)
	require.Equal(t, "http://127.0.0.1:18090", workerBank(cfg).Provider.URL)
	cfg.Provider.URL = "https://bank.example"
	require.Equal(t, "https://bank.example", workerBank(cfg).Provider.URL)
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
