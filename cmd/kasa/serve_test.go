package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/api"
	"github.com/kasa-pay/kasa/config"
	"github.com/kasa-pay/kasa/tools/devenv"
)

// TestServeAPIMetricsAddress: with metrics.addr set, /metrics is served there and only there.
func TestServeAPIMetricsAddress(t *testing.T) {
	for _, separate := range []bool{false, true} {
		t.Run(fmt.Sprint("separate=", separate), func(t *testing.T) {
			t.Chdir(t.TempDir())
			cfg, err := config.Load()
			require.NoError(t, err)
			port, err := devenv.FreePort()
			require.NoError(t, err)
			cfg.API.Addr = fmt.Sprintf("127.0.0.1:%d", port)
			if separate {
				port, err := devenv.FreePort()
				require.NoError(t, err)
				cfg.Metrics.Addr = fmt.Sprintf("127.0.0.1:%d", port)
			}
			log := slog.New(slog.DiscardHandler)
			srv := api.New(api.Options{Logger: log, SeparateMetrics: cfg.Metrics.Addr != "", Limits: apiLimits(cfg)})
			stop, err := serveAPI(context.Background(), cfg, srv, log)
			require.NoError(t, err)
			defer stop()

			get := func(addr, path string) (int, string) {
				c := &http.Client{Timeout: 5 * time.Second}
				resp, err := c.Get("http://" + addr + path)
				require.NoError(t, err)
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, string(b)
			}
			code, _ := get(cfg.API.Addr, "/healthz")
			require.Equal(t, http.StatusOK, code)
			code, body := get(cfg.API.Addr, "/metrics")
			if !separate {
				require.Equal(t, http.StatusOK, code)
				require.Contains(t, body, "kasa_http_request_duration_seconds")
				return
			}
			require.Equal(t, http.StatusNotFound, code, "not on the merchant port")
			code, body = get(cfg.Metrics.Addr, "/metrics")
			require.Equal(t, http.StatusOK, code)
			require.Contains(t, body, `kasa_http_request_duration_seconds_count{method="GET",route="/healthz",status="200"} 1`)
		})
	}
}

func TestAPILimitsFromConfig(t *testing.T) {
	t.Chdir(t.TempDir())
	cfg, err := config.Load()
	require.NoError(t, err)
	require.Equal(t, api.Limits{
		ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 120 * time.Second,
		MaxConns: 4096, MaxConnsPerClient: 256, MaxInFlight: 1024, MerchantShare: 0.5, TrustedProxies: []string{},
		PerIP: api.Rate{PerSecond: 1000, Burst: 2000}, PerMerchant: api.Rate{PerSecond: 500, Burst: 1000},
		FailedAuth: api.Rate{PerSecond: 1, Burst: 20},
	}, apiLimits(cfg))
}
