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

// TestServeAPIMetricsAddress: by default `kasa api` serves /metrics on a listener of its own
// (127.0.0.1:8091) and the merchants' port answers 404 for it; KASA_METRICS_ADDR moves it, and
// "api" puts it on the API's port (as kasa dev does).
func TestServeAPIMetricsAddress(t *testing.T) {
	for _, tc := range []struct{ name, setting string }{
		{"default", ""},
		{"on the API", config.MetricsOnAPI},
		{"own address", "free"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Chdir(t.TempDir())
			port, err := devenv.FreePort()
			require.NoError(t, err)
			t.Setenv("KASA_API_ADDR", fmt.Sprintf("127.0.0.1:%d", port))
			if tc.setting == "free" {
				port, err := devenv.FreePort()
				require.NoError(t, err)
				tc.setting = fmt.Sprintf("127.0.0.1:%d", port)
			}
			t.Setenv("KASA_METRICS_ADDR", tc.setting)
			cfg, err := config.Load()
			require.NoError(t, err)
			if tc.setting == "" {
				// The default is a listener of its own on loopback (config TestLoadEdgeLimits); it
				// is served here on a free port, which a kasa api running on this host cannot hold.
				require.Equal(t, "127.0.0.1:8091", cfg.MetricsListen())
				port, err := devenv.FreePort()
				require.NoError(t, err)
				tc.setting = fmt.Sprintf("127.0.0.1:%d", port)
				cfg.Metrics.Addr = tc.setting
			}
			log := slog.New(slog.DiscardHandler)
			srv := api.New(api.Options{Logger: log, SeparateMetrics: cfg.MetricsListen() != "", Limits: apiLimits(cfg)})
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
			if tc.setting == config.MetricsOnAPI {
				require.Equal(t, http.StatusOK, code)
				require.Contains(t, body, "kasa_http_request_duration_seconds")
				return
			}
			require.Equal(t, http.StatusNotFound, code, "not on the merchant port")
			code, body = get(tc.setting, "/metrics")
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
