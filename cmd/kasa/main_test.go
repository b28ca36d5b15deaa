package main

import (
	"log/slog"
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
		o := temporalOptions(cfg, slog.Default())
		require.Equal(t, tc.want, o.ConnectionOptions.GrpcCompression, "gzip=%t", tc.gzip)
		require.Equal(t, "default", o.Namespace)
	}
}
