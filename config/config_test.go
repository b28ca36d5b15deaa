package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/workflows"
)

func TestLoadDefaults(t *testing.T) {
	t.Chdir(t.TempDir())
	c, err := Load()
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:8080", c.API.Addr)
	require.Equal(t, "127.0.0.1:8090", c.Banksim.Addr)
	require.Empty(t, c.Provider.URL, "no bank by default: kasa worker refuses to start, kasa dev and kasa cluster use their simulator")
	require.Equal(t, "http://127.0.0.1:8090", c.SimulatorURL())
	require.Equal(t, "idempotent", c.Provider.Capability)
	require.Equal(t, "default", c.Temporal.Namespace)
	require.Equal(t, "./.data", c.Data.Dir)
	require.Equal(t, 5*time.Second, c.API.SyncWait)
	require.Equal(t, 30*time.Second, c.Provider.ChargeTimeout)
	require.Equal(t, 2*time.Minute, c.Provider.ChargeBudget)
	require.Equal(t, 30*time.Second, c.Provider.BookingWindow)
	require.False(t, c.Temporal.Gzip)
}

func TestLoadFileThenEnv(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kasa.yaml"), []byte("api:\n  addr: 0.0.0.0:9000\nprovider:\n  capability: none\n"), 0o644))
	t.Setenv("KASA_PROVIDER_CAPABILITY", "inquiry")
	t.Setenv("KASA_DATABASE_URL", "postgres://x/y")
	t.Setenv("KASA_API_SYNC_WAIT", "250ms")
	t.Setenv("KASA_TEMPORAL_GZIP", "true")
	c, err := Load()
	require.NoError(t, err)
	require.Equal(t, "0.0.0.0:9000", c.API.Addr)
	require.Equal(t, "inquiry", c.Provider.Capability, "env overrides the file")
	require.Equal(t, "postgres://x/y", c.Database.URL)
	require.Equal(t, 250*time.Millisecond, c.API.SyncWait)
	require.True(t, c.Temporal.Gzip)
}

func TestLoadEdgeLimits(t *testing.T) {
	t.Chdir(t.TempDir())
	c, err := Load()
	require.NoError(t, err)
	require.Equal(t, 30*time.Second, c.API.ReadTimeout)
	require.Equal(t, 30*time.Second, c.API.WriteTimeout)
	require.Equal(t, 120*time.Second, c.API.IdleTimeout)
	require.Equal(t, 4096, c.API.MaxConns)
	require.Equal(t, 1024, c.API.MaxInFlight)
	require.Equal(t, RateLimit{Rate: 1000, Burst: 2000}, c.API.RateLimit.PerIP)
	require.Equal(t, RateLimit{Rate: 500, Burst: 1000}, c.API.RateLimit.PerMerchant)
	require.Empty(t, c.API.TrustedProxies)
	require.Equal(t, "127.0.0.1:8091", c.MetricsListen(), "off the merchants' port, on loopback")
	require.Equal(t, "127.0.0.1:8093", c.Worker.MetricsAddr, "the ledger check's kasa_ledger_violations is served by default")
	require.Equal(t, "127.0.0.1:8092", c.Relay.MetricsAddr)

	t.Setenv("KASA_API_TRUSTED_PROXIES", "10.0.0.0/8,192.0.2.7")
	t.Setenv("KASA_API_RATE_LIMIT_PER_IP_RATE", "0")
	t.Setenv("KASA_API_RATE_LIMIT_PER_MERCHANT_RATE", "2.5")
	t.Setenv("KASA_METRICS_ADDR", "127.0.0.1:9100")
	t.Setenv("KASA_WEBHOOK_OWN_HOSTS", "api.kasa.example,203.0.113.7,2001:db8::/48")
	c, err = Load()
	require.NoError(t, err)
	require.Equal(t, []string{"10.0.0.0/8", "192.0.2.7"}, c.API.TrustedProxies)
	require.Equal(t, RateLimit{Rate: 0, Burst: 2000}, c.API.RateLimit.PerIP, "0 turns it off")
	require.Equal(t, RateLimit{Rate: 2.5, Burst: 1000}, c.API.RateLimit.PerMerchant)
	require.Equal(t, "127.0.0.1:9100", c.MetricsListen())
	require.Equal(t, []string{"api.kasa.example", "203.0.113.7", "2001:db8::/48"}, c.Webhook.OwnHosts)

	t.Setenv("KASA_METRICS_ADDR", "api")
	t.Setenv("KASA_WORKER_METRICS_ADDR", "off")
	t.Setenv("KASA_RELAY_METRICS_ADDR", "off")
	c, err = Load()
	require.NoError(t, err)
	require.Empty(t, c.MetricsListen(), "served on the API's port")
	require.Empty(t, c.Worker.MetricsAddr, "off")
	require.Empty(t, c.Relay.MetricsAddr, "off")
}

func TestValidateRejectsBadCapability(t *testing.T) {
	t.Chdir(t.TempDir())
	t.Setenv("KASA_PROVIDER_CAPABILITY", "maybe")
	_, err := Load()
	require.ErrorContains(t, err, "KASA_PROVIDER_CAPABILITY")
}

func TestValidateRejectsBadSettings(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		env        map[string]string
	}{
		{"charge timeout within the http timeout", "provider.charge_timeout", map[string]string{"KASA_PROVIDER_TIMEOUT": "10s", "KASA_PROVIDER_CHARGE_TIMEOUT": "10s"}},
		// A bank call still running when a stopping worker ends its activities is cut, its outcome unknown.
		// A capture may ask the bank about its authorization first: two calls after a SIGTERM.
		{"two http timeouts past the worker's stop bound", "provider.timeout (KASA_PROVIDER_TIMEOUT) must be shorter than half a worker's stop bound (25s), got 13s", map[string]string{"KASA_PROVIDER_TIMEOUT": "13s"}},
		{"http timeout at the worker's stop bound", "provider.timeout (KASA_PROVIDER_TIMEOUT) must be shorter than half a worker's stop bound (25s), got 25s", map[string]string{"KASA_PROVIDER_TIMEOUT": "25s"}},
		{"http timeout past the worker's stop bound", "provider.timeout (KASA_PROVIDER_TIMEOUT) must be shorter than half a worker's stop bound (25s), got 40s", map[string]string{"KASA_PROVIDER_TIMEOUT": "40s", "KASA_PROVIDER_CHARGE_TIMEOUT": "1m"}},
		{"budget shorter than one attempt", "provider.charge_budget", map[string]string{"KASA_PROVIDER_CHARGE_TIMEOUT": "1m", "KASA_PROVIDER_CHARGE_BUDGET": "30s"}},
		{"no booking window", "KASA_PROVIDER_BOOKING_WINDOW", map[string]string{"KASA_PROVIDER_BOOKING_WINDOW": "0s"}},
		{"negative sync wait", "api.sync_wait", map[string]string{"KASA_API_SYNC_WAIT": "-1s"}},
		{"shutdown delay over a minute", "api.shutdown_delay", map[string]string{"KASA_API_SHUTDOWN_DELAY": "61s"}},
		{"webhooks retried for less than a day", "webhook.retry_for", map[string]string{"KASA_WEBHOOK_RETRY_FOR": "2h"}},
		{"no webhook concurrency", "webhook.concurrency", map[string]string{"KASA_WEBHOOK_CONCURRENCY": "0"}},
		{"retention shorter than an hour", "events.retention", map[string]string{"KASA_EVENTS_RETENTION": "5m"}},
		{"redelivery within the relay's transaction", "events.redeliver_after", map[string]string{"KASA_EVENTS_REDELIVER_AFTER": "10s"}},
		{"redelivery after it is given up", "events.redeliver_after", map[string]string{"KASA_EVENTS_RETENTION": "1h", "KASA_EVENTS_REDELIVER_AFTER": "45m"}},
		{"write timeout within the sync wait", "api.write_timeout", map[string]string{"KASA_API_SYNC_WAIT": "30s", "KASA_API_WRITE_TIMEOUT": "35s"}},
		{"no read timeout", "api.read_timeout", map[string]string{"KASA_API_READ_TIMEOUT": "0s"}},
		{"no idle timeout", "api.idle_timeout", map[string]string{"KASA_API_IDLE_TIMEOUT": "0s"}},
		{"in flight above the connections", "api.max_in_flight", map[string]string{"KASA_API_MAX_CONNS": "100", "KASA_API_MAX_IN_FLIGHT": "200"}},
		{"no connections", "api.max_conns", map[string]string{"KASA_API_MAX_CONNS": "0"}},
		{"negative rate", "api.rate_limit.per_ip", map[string]string{"KASA_API_RATE_LIMIT_PER_IP_RATE": "-1"}},
		{"rate without burst", "api.rate_limit.per_merchant", map[string]string{"KASA_API_RATE_LIMIT_PER_MERCHANT_BURST": "0"}},
		{"rate not a number", "api.rate_limit.per_ip", map[string]string{"KASA_API_RATE_LIMIT_PER_IP_RATE": "NaN"}},
		{"failed-auth rate not a number", "api.rate_limit.failed_auth", map[string]string{"KASA_API_RATE_LIMIT_FAILED_AUTH_RATE": "nan"}},
		{"infinite rate", "api.rate_limit.per_merchant", map[string]string{"KASA_API_RATE_LIMIT_PER_MERCHANT_RATE": "+Inf"}},
		{"merchant share not a number", "api.merchant_share", map[string]string{"KASA_API_MERCHANT_SHARE": "NaN"}},
		{"bad trusted proxy", "api.trusted_proxies", map[string]string{"KASA_API_TRUSTED_PROXIES": "10.0.0.0/8,not-an-address"}},
		{"metrics on the API's address", "metrics.addr", map[string]string{"KASA_API_ADDR": "127.0.0.1:8080", "KASA_METRICS_ADDR": "127.0.0.1:8080"}},
		{"API on the metrics' default address", "metrics.addr", map[string]string{"KASA_API_ADDR": "127.0.0.1:8091"}},
		{"own host that is a URL", "KASA_WEBHOOK_OWN_HOSTS", map[string]string{"KASA_WEBHOOK_OWN_HOSTS": "api.kasa.example,https://api.kasa.example"}},
		{"own network badly written", "KASA_WEBHOOK_OWN_HOSTS", map[string]string{"KASA_WEBHOOK_OWN_HOSTS": "10.0.0.0/33"}},
		{"previous secret key not hex", "KASA_SECRET_KEY_PREVIOUS", map[string]string{"KASA_SECRET_KEY": strings.Repeat("ab", 32), "KASA_SECRET_KEY_PREVIOUS": "xyz"}},
		{"previous secret key is the key", "KASA_SECRET_KEY_PREVIOUS", map[string]string{"KASA_SECRET_KEY": strings.Repeat("ab", 32), "KASA_SECRET_KEY_PREVIOUS": strings.Repeat("AB", 32)}},
		{"previous secret key without a key", "KASA_SECRET_KEY_PREVIOUS", map[string]string{"KASA_SECRET_KEY_PREVIOUS": strings.Repeat("ab", 32)}},
		// A bank URL kasa cannot call would start a worker whose every charge is ambiguous.
		{"provider url without a scheme", "KASA_PROVIDER_URL", map[string]string{"KASA_PROVIDER_URL": "bank.example"}},
		{"provider url not http", "KASA_PROVIDER_URL", map[string]string{"KASA_PROVIDER_URL": "ftp://bank.example"}},
		{"provider url without a host", "KASA_PROVIDER_URL", map[string]string{"KASA_PROVIDER_URL": "http:///v1"}},
		{"provider url with a query", "KASA_PROVIDER_URL", map[string]string{"KASA_PROVIDER_URL": "https://bank.example/api?v=2"}},
		// A port out of range would start PostgreSQL before Temporal's port failed to bind.
		{"postgres port out of range", "KASA_POSTGRES_PORT", map[string]string{"KASA_POSTGRES_PORT": "65536"}},
		{"negative postgres port", "KASA_POSTGRES_PORT", map[string]string{"KASA_POSTGRES_PORT": "-1"}},
		{"temporal port out of range", "KASA_TEMPORAL_PORT", map[string]string{"KASA_TEMPORAL_PORT": "70000"}},
		{"temporal ui port negative", "KASA_TEMPORAL_UI_PORT", map[string]string{"KASA_TEMPORAL_UI_PORT": "-8233"}},
		// An address no listener can take is refused at start, not after the database is reached.
		{"api address without a port", "KASA_API_ADDR", map[string]string{"KASA_API_ADDR": "localhost"}},
		{"simulator port out of range", "KASA_BANKSIM_ADDR", map[string]string{"KASA_BANKSIM_ADDR": "127.0.0.1:99999"}},
		{"metrics address a URL", "KASA_METRICS_ADDR", map[string]string{"KASA_METRICS_ADDR": "http://127.0.0.1:9100"}},
		{"worker metrics address without a port", "KASA_WORKER_METRICS_ADDR", map[string]string{"KASA_WORKER_METRICS_ADDR": "127.0.0.1"}},
		{"relay metrics address badly written", "KASA_RELAY_METRICS_ADDR", map[string]string{"KASA_RELAY_METRICS_ADDR": "127.0.0.1:80:80"}},
		{"pprof address without a port", "KASA_DEBUG_PPROF_ADDR", map[string]string{"KASA_DEBUG_PPROF_ADDR": "6060"}},
		{"capture window under 10s", "capture_window", map[string]string{"KASA_CAPTURE_WINDOW": "9999ms"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Chdir(t.TempDir())
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			_, err := Load()
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// A provider timeout just under half a worker's stop bound is accepted: every bank call in
// flight at SIGTERM, and one a capture sends after its inquiry, ends on its own before the worker
// ends its activities.
func TestValidateAcceptsAProviderTimeoutWithinTheStopBound(t *testing.T) {
	t.Chdir(t.TempDir())
	t.Setenv("KASA_PROVIDER_TIMEOUT", "12s")
	c, err := Load()
	require.NoError(t, err)
	require.Equal(t, 12*time.Second, c.Provider.Timeout)
}

// Every setting is documented in the configuration table of docs/operations.md.
func TestEveryEnvVarIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/operations.md")
	require.NoError(t, err)
	for _, k := range EnvVars() {
		require.Contains(t, string(doc), "`"+k+"`", "docs/operations.md's configuration table misses %s", k)
	}
}

// The configuration accepts exactly the capabilities the workflow knows (and the bench reports).
func TestCapabilitiesMatchTheWorkflows(t *testing.T) {
	want := make([]string, len(workflows.Capabilities))
	for i, c := range workflows.Capabilities {
		want[i] = string(c)
	}
	require.Equal(t, want, Capabilities)
}

func TestCheckAdminToken(t *testing.T) {
	long := strings.Repeat("a", MinAdminTokenLen)
	for _, tc := range []struct {
		token, previous string
		ok              bool
	}{
		{"", "", false},
		{"adm_test_token", "", false},
		{strings.Repeat("a", MinAdminTokenLen-1), "", false},
		{long, "", true},
		{"adm_" + strings.Repeat("0f", 16), "", true}, // what kasa dev makes
		{long, "old_short", false},                    // the previous one guards the API as well
		{long, strings.Repeat("b", MinAdminTokenLen), true},
	} {
		var c Config
		c.Admin.Token, c.Admin.TokenPrevious = tc.token, tc.previous
		err := c.CheckAdminToken()
		require.Equal(t, tc.ok, err == nil, "token %q: %v", tc.token, err)
		if !tc.ok {
			require.ErrorContains(t, err, "KASA_ADMIN_TOKEN")
		}
	}
}

func TestCheckProvider(t *testing.T) {
	for _, tc := range []struct {
		url     string
		wantErr error
	}{
		{"", ErrNoProvider},
		{"https://bank.example/api", nil},
		{"http://127.0.0.1:8090", nil}, // a simulator named on purpose
	} {
		var c Config
		c.Provider.URL = tc.url
		require.ErrorIs(t, c.CheckProvider(), tc.wantErr, "url %q", tc.url)
	}
	require.ErrorContains(t, ErrNoProvider, "KASA_PROVIDER_URL")
}

// The broker's credentials and TLS, and the private-webhook switch, come from KASA_* variables;
// webhooks to private addresses are refused unless asked for.
func TestLoadBrokerAuthAndWebhookPolicy(t *testing.T) {
	t.Chdir(t.TempDir())
	c, err := Load()
	require.NoError(t, err)
	require.False(t, c.Webhook.AllowPrivate, "private webhook addresses are refused by default")
	require.Empty(t, c.NATS.Creds)

	t.Setenv("KASA_NATS_CREDS", "/etc/kasa/nats.creds")
	t.Setenv("KASA_NATS_TLS_CA", "/etc/kasa/ca.pem")
	t.Setenv("KASA_NATS_TLS_CERT", "/etc/kasa/client.pem")
	t.Setenv("KASA_NATS_TLS_KEY", "/etc/kasa/client-key.pem")
	t.Setenv("KASA_WEBHOOK_ALLOW_PRIVATE", "true")
	c, err = Load()
	require.NoError(t, err)
	require.Equal(t, "/etc/kasa/nats.creds", c.NATS.Creds)
	require.Equal(t, "/etc/kasa/ca.pem", c.NATS.TLSCA)
	require.Equal(t, "/etc/kasa/client.pem", c.NATS.TLSCert)
	require.Equal(t, "/etc/kasa/client-key.pem", c.NATS.TLSKey)
	require.True(t, c.Webhook.AllowPrivate)

	t.Setenv("KASA_NATS_TLS_KEY", "")
	_, err = Load()
	require.ErrorContains(t, err, "KASA_NATS_TLS_KEY")
}

// TestLoadTemporalSecurity: the Temporal TLS and API key settings come from KASA_TEMPORAL_*, the
// search attributes are registered unless turned off, and a certificate needs its key.
func TestLoadTemporalSecurity(t *testing.T) {
	t.Chdir(t.TempDir())
	c, err := Load()
	require.NoError(t, err)
	require.True(t, c.Temporal.RegisterSearchAttributes, "kasa migrate registers search attributes by default")
	require.Empty(t, c.Temporal.APIKey)

	t.Setenv("KASA_TEMPORAL_TLS_CERT", "/etc/kasa/temporal.pem")
	t.Setenv("KASA_TEMPORAL_TLS_KEY", "/etc/kasa/temporal-key.pem")
	t.Setenv("KASA_TEMPORAL_TLS_CA", "/etc/kasa/temporal-ca.pem")
	t.Setenv("KASA_TEMPORAL_TLS_SERVER_NAME", "temporal.internal")
	t.Setenv("KASA_TEMPORAL_API_KEY", "key-123")
	t.Setenv("KASA_TEMPORAL_REGISTER_SEARCH_ATTRIBUTES", "false")
	c, err = Load()
	require.NoError(t, err)
	require.Equal(t, "/etc/kasa/temporal.pem", c.Temporal.TLSCert)
	require.Equal(t, "/etc/kasa/temporal-key.pem", c.Temporal.TLSKey)
	require.Equal(t, "/etc/kasa/temporal-ca.pem", c.Temporal.TLSCA)
	require.Equal(t, "temporal.internal", c.Temporal.TLSServerName)
	require.Equal(t, "key-123", c.Temporal.APIKey)
	require.False(t, c.Temporal.RegisterSearchAttributes)

	t.Setenv("KASA_TEMPORAL_TLS_KEY", "")
	_, err = Load()
	require.ErrorContains(t, err, "KASA_TEMPORAL_TLS_KEY")
}

// Idempotency records are kept 72h unless told otherwise, and never less than a second.
func TestIdempotencyRetention(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want time.Duration
		err  bool
	}{
		{"", 72 * time.Hour, false},
		{"1s", time.Second, false},
		{"24h", 24 * time.Hour, false},
		{"999ms", 0, true},
		{"0s", 0, true},
		{"-1h", 0, true},
	} {
		t.Run(tc.env, func(t *testing.T) {
			t.Chdir(t.TempDir())
			if tc.env != "" {
				t.Setenv("KASA_IDEMPOTENCY_RETENTION", tc.env)
			}
			c, err := Load()
			if tc.err {
				require.ErrorContains(t, err, "idempotency.retention (KASA_IDEMPOTENCY_RETENTION) must be at least 1s, got "+tc.env)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, c.Idempotency.Retention)
		})
	}
}

// A retention that is no duration at all (a unit Go does not know, none, or past what a duration
// holds) is refused with the setting and the value it was given, and what a duration looks like.
func TestIdempotencyRetentionNotADuration(t *testing.T) {
	for _, env := range []string{"3d", "abc", "3600", "1h1", "2562048h", " 72h"} {
		t.Run(env, func(t *testing.T) {
			t.Chdir(t.TempDir())
			t.Setenv("KASA_IDEMPOTENCY_RETENTION", env)
			_, err := Load()
			require.Error(t, err)
			require.ErrorContains(t, err, "idempotency.retention")
			require.ErrorContains(t, err, "KASA_IDEMPOTENCY_RETENTION", "the variable set, beside the file's key")
			require.ErrorContains(t, err, strconv.Quote(env), "the value given")
			require.ErrorContains(t, err, "30s, 5m, 72h", "what a duration looks like")
		})
	}
}

// writeConfigFile makes body the kasa.yaml of a fresh working directory.
func writeConfigFile(t *testing.T, body string) {
	t.Helper()
	dir := t.TempDir()
	t.Chdir(dir)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kasa.yaml"), []byte(body), 0o644))
}

// Every setting of Config has a default, so that its KASA_ variable is read: viper's environment
// lookup only knows the keys it was told of.
func TestEverySettingHasADefault(t *testing.T) {
	var keys []string
	var walk func(prefix string, typ reflect.Type)
	walk = func(prefix string, typ reflect.Type) {
		for f := range typ.Fields() {
			tag, _, _ := strings.Cut(f.Tag.Get("mapstructure"), ",")
			if tag == "" || tag == "-" {
				continue
			}
			if f.Type.Kind() == reflect.Struct {
				walk(prefix+tag+".", f.Type)
				continue
			}
			keys = append(keys, "KASA_"+strings.ToUpper(strings.ReplaceAll(prefix+tag, ".", "_")))
		}
	}
	walk("", reflect.TypeFor[Config]())
	require.NotEmpty(t, keys)
	require.Subset(t, EnvVars(), keys)

	t.Chdir(t.TempDir())
	t.Setenv("KASA_ADMIN_TOKEN", strings.Repeat("n", 40))
	t.Setenv("KASA_ADMIN_TOKEN_PREVIOUS", strings.Repeat("o", 40))
	c, err := Load()
	require.NoError(t, err)
	require.Equal(t, strings.Repeat("o", 40), c.Admin.TokenPrevious)
}

// A duration needs its unit: a bare number in kasa.yaml would be read as nanoseconds (a booking
// window of 30 ns), so it is refused, as the same number in the environment is.
func TestLoadRefusesADurationWithoutUnit(t *testing.T) {
	writeConfigFile(t, "provider:\n  booking_window: 30\n")
	c, err := Load()
	require.Error(t, err, "booking_window: 30 loaded as %s", c.Provider.BookingWindow)
	require.Contains(t, err.Error(), "booking_window")
}

// A misspelt key in kasa.yaml is refused, never left to its default: `capabilty: none` must not
// leave a bank without idempotency treated as idempotent.
func TestLoadRefusesAnUnknownKeyInTheFile(t *testing.T) {
	writeConfigFile(t, "provider:\n  capabilty: none\n")
	c, err := Load()
	require.Error(t, err, "capability is %q", c.Provider.Capability)
	require.Contains(t, err.Error(), "capabilty")
}

// A misspelt variable is refused as a misspelt key in the file is: KASA_PROVIDER_CAPABILTY=none
// must not leave a bank without idempotency treated as idempotent. Variables that are no setting
// and near none (the compose file's passwords, the tests' own) are left alone.
func TestLoadRefusesAMisspeltVariable(t *testing.T) {
	for _, tc := range []struct{ env, want string }{
		{"KASA_PROVIDER_CAPABILTY", "KASA_PROVIDER_CAPABILITY"},
		{"KASA_IDEMPOTENCY_RETENTON", "KASA_IDEMPOTENCY_RETENTION"},
		{"KASA_PROVIDER_BOOKINGWINDOW", "KASA_PROVIDER_BOOKING_WINDOW"},
		{"KASA_DATABASE_ULR", "KASA_DATABASE_URL"},
		{"KASA_CAPTURE_WINDWO", "KASA_CAPTURE_WINDOW"},
	} {
		t.Run(tc.env, func(t *testing.T) {
			t.Chdir(t.TempDir())
			t.Setenv(tc.env, "none")
			_, err := Load()
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.env)
			require.Contains(t, err.Error(), tc.want)
		})
	}
	t.Run("not settings", func(t *testing.T) {
		t.Chdir(t.TempDir())
		for _, env := range []string{"KASA_DB_APP_PASSWORD", "KASA_DB_OWNER_PASSWORD", "KASA_TEMPORAL_DB_PASSWORD", "KASA_POSTGRES_PASSWORD",
			"KASA_UI_PASSWORD", "KASA_GRAFANA_PASSWORD", "KASA_PUBLISH_IP", "KASA_TEMPORAL_CLI", "KASA_TEMPORAL_SERVER",
			"KASA_TEST_DATABASE_URL", "KASA_TEST_TEMPORAL_ADDRESS", "KASA_HOT_ACCOUNT_BENCH", "KASA_UI_SCREENSHOT", "KASA_CONFIG"} {
			t.Setenv(env, "x")
		}
		t.Setenv("KASA_CONFIG", "")
		_, err := Load()
		require.NoError(t, err)
	})
}

func TestValidateRefusesABadLogLevel(t *testing.T) {
	t.Chdir(t.TempDir())
	t.Setenv("KASA_LOG_LEVEL", "verbose")
	_, err := Load()
	require.Error(t, err)
	require.Contains(t, err.Error(), "KASA_LOG_LEVEL")
	t.Setenv("KASA_LOG_LEVEL", "debug")
	_, err = Load()
	require.NoError(t, err)
}

// "off" turns the pprof listener a file names off, as the launchers do for their children (an
// empty variable reads as unset, and the file's address would come back).
func TestPprofOffOverridesTheFile(t *testing.T) {
	writeConfigFile(t, "debug:\n  pprof_addr: 127.0.0.1:6060\n")
	t.Setenv("KASA_DEBUG_PPROF_ADDR", MetricsOff)
	c, err := Load()
	require.NoError(t, err)
	require.Empty(t, c.Debug.PprofAddr)
}

// An empty listener address in the file is its default, as an empty variable is: only "off"
// turns a worker's or relay's /metrics off, so a blank line in kasa.yaml cannot silently drop
// the ledger check's kasa_ledger_violations (docs/deployment.md, "Settings that changed meaning").
func TestEmptyMetricsAddressInTheFileIsTheDefault(t *testing.T) {
	writeConfigFile(t, "metrics:\n  addr: \"\"\nworker:\n  metrics_addr: \"\"\nrelay:\n  metrics_addr: \"\"\n")
	c, err := Load()
	require.NoError(t, err)
	require.Equal(t, DefaultMetricsAddr, c.MetricsListen())
	require.Equal(t, "127.0.0.1:8093", c.Worker.MetricsAddr)
	require.Equal(t, "127.0.0.1:8092", c.Relay.MetricsAddr)

	writeConfigFile(t, "worker:\n  metrics_addr: \"off\"\nrelay:\n  metrics_addr: \"off\"\n")
	c, err = Load()
	require.NoError(t, err)
	require.Empty(t, c.Worker.MetricsAddr, "off")
	require.Empty(t, c.Relay.MetricsAddr, "off")
}

// 0 needs no unit: the settings whose 0 turns them off take it from the file too.
func TestLoadTakesAZeroDurationFromTheFile(t *testing.T) {
	writeConfigFile(t, "verify:\n  interval: 0\nbacklog:\n  max_wait: 0\n")
	c, err := Load()
	require.NoError(t, err)
	require.Zero(t, c.Verify.Interval)
	require.Zero(t, c.Backlog.MaxWait)
}

// The bank's URL is a base: a trailing slash would make every path kasa calls start with "//",
// which the simulator (like many servers) answers with a redirect, never with the charge.
func TestLoadProviderURL(t *testing.T) {
	for _, tc := range []struct{ env, want string }{
		{"", ""},
		{"http://127.0.0.1:8090", "http://127.0.0.1:8090"},
		{"http://127.0.0.1:8090/", "http://127.0.0.1:8090"},
		{"https://bank.example/api//", "https://bank.example/api"},
	} {
		t.Run(tc.env, func(t *testing.T) {
			t.Chdir(t.TempDir())
			t.Setenv("KASA_PROVIDER_URL", tc.env)
			c, err := Load()
			require.NoError(t, err)
			require.Equal(t, tc.want, c.Provider.URL)
		})
	}
}

// The ports and addresses that take a 0 (a free port) or a special value accept them.
func TestLoadAcceptsPortsAndAddresses(t *testing.T) {
	t.Chdir(t.TempDir())
	for k, v := range map[string]string{
		"KASA_POSTGRES_PORT": "0", "KASA_TEMPORAL_PORT": "65535", "KASA_TEMPORAL_UI_PORT": "0",
		"KASA_API_ADDR": ":0", "KASA_BANKSIM_ADDR": "[::1]:8090", "KASA_METRICS_ADDR": "localhost:9100",
		"KASA_WORKER_METRICS_ADDR": "off", "KASA_RELAY_METRICS_ADDR": "0.0.0.0:8092", "KASA_DEBUG_PPROF_ADDR": "127.0.0.1:6060",
	} {
		t.Setenv(k, v)
	}
	c, err := Load()
	require.NoError(t, err)
	require.Equal(t, "[::1]:8090", c.Banksim.Addr)
	require.Empty(t, c.Worker.MetricsAddr)
}

// A refused bank URL is named in the error kasa exits with, but not its secrets: a password or
// an API key in its query string stays out of the logs.
func TestRefusedProviderURLHidesItsSecrets(t *testing.T) {
	for _, raw := range []string{
		"https://bank.example/api?api_key=s3cret",
		"https://kasa:s3cret@bank.example/api?v=2",
		"https://bank.example/api#s3cret",
		"ftp://kasa:s3cret@bank.example/api",
		"https://kasa:s3cret@bank.example/%zz", // unparsable
	} {
		t.Run(raw, func(t *testing.T) {
			t.Chdir(t.TempDir())
			t.Setenv("KASA_PROVIDER_URL", raw)
			_, err := Load()
			require.ErrorContains(t, err, "KASA_PROVIDER_URL")
			require.NotContains(t, err.Error(), "s3cret")
		})
	}
}

// KASA_CAPTURE_WINDOW takes any duration from 10s (docs/api.md, "Authorize now, capture later").
func TestCaptureWindowFromTenSeconds(t *testing.T) {
	t.Chdir(t.TempDir())
	c, err := Load()
	require.NoError(t, err)
	require.Equal(t, 168*time.Hour, c.CaptureWindow, "the default")
	t.Setenv("KASA_CAPTURE_WINDOW", "10s")
	c, err = Load()
	require.NoError(t, err)
	require.Equal(t, 10*time.Second, c.CaptureWindow)
}
