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
