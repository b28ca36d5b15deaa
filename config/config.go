// Package config loads kasa's configuration from one local viper instance: defaults for every key,
// an optional kasa.yaml, and KASA_<KEY> environment variables (dots become underscores).
package config

import (
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/viper"

	"github.com/kasa-pay/kasa/payment"
)

// Config is every setting kasa reads.
type Config struct {
	API struct {
		Addr     string        `mapstructure:"addr"`
		SyncWait time.Duration `mapstructure:"sync_wait"`
		// ShutdownDelay: how long a stopping API answers /readyz 503 while it still serves, so
		// that a load balancer takes it out of rotation before its listener closes.
		ShutdownDelay time.Duration `mapstructure:"shutdown_delay"`
		ReplayCache   int           `mapstructure:"replay_cache"` // completed records kept in memory per generation
		// What one client can hold of the API (slow and idle clients, floods): docs/operations.md.
		ReadTimeout  time.Duration `mapstructure:"read_timeout"`
		WriteTimeout time.Duration `mapstructure:"write_timeout"` // must outlast sync_wait
		IdleTimeout  time.Duration `mapstructure:"idle_timeout"`
		MaxConns     int           `mapstructure:"max_conns"`
		// MaxConnsPerClient: what one client address may hold of MaxConns (at most half of it).
		MaxConnsPerClient int `mapstructure:"max_conns_per_client"`
		MaxInFlight       int `mapstructure:"max_in_flight"`
		// MerchantShare is the part of max_in_flight, and of backlog.api_running, one merchant
		// may hold: one merchant's burst leaves room for the others.
		MerchantShare  float64  `mapstructure:"merchant_share"`
		TrustedProxies []string `mapstructure:"trusted_proxies"` // whose X-Forwarded-For names the client
		RateLimit      struct {
			PerIP       RateLimit `mapstructure:"per_ip"`
			PerMerchant RateLimit `mapstructure:"per_merchant"`
			// FailedAuth: wrong credentials per client address, far tighter than requests.
			FailedAuth RateLimit `mapstructure:"failed_auth"`
		} `mapstructure:"rate_limit"`
	} `mapstructure:"api"`
	Metrics struct {
		// Addr is where the API serves /metrics: an address of its own (empty: DefaultMetricsAddr),
		// or MetricsOnAPI. MetricsListen resolves it.
		Addr string `mapstructure:"addr"`
	} `mapstructure:"metrics"`
	Banksim struct {
		Addr string `mapstructure:"addr"`
	} `mapstructure:"banksim"`
	Admin struct {
		Token string `mapstructure:"token"`
		// TokenPrevious is accepted beside Token while a rotation overlaps: remove it once every
		// caller uses the new token.
		TokenPrevious string `mapstructure:"token_previous"`
	} `mapstructure:"admin"`
	Provider struct {
		Capability string        `mapstructure:"capability"`
		URL        string        `mapstructure:"url"`
		Timeout    time.Duration `mapstructure:"timeout"`
		// ChargeTimeout bounds one charge attempt in the workflow (a silent worker or provider);
		// ChargeBudget bounds all re-sends to an idempotent provider before the outcome is unknown.
		ChargeTimeout time.Duration `mapstructure:"charge_timeout"`
		ChargeBudget  time.Duration `mapstructure:"charge_budget"`
		// BookingWindow is how long the bank may take to book a charge after kasa stopped waiting:
		// an inquiry re-sends, and a settlement file releases, only after it has passed.
		BookingWindow time.Duration `mapstructure:"booking_window"`
	} `mapstructure:"provider"`
	Database struct {
		URL      string `mapstructure:"url"`
		MaxConns int32  `mapstructure:"max_conns"`
		// kasa migrate connects with MigrateURL (the tables' owner; empty: URL) and grants AppRole,
		// when set, exactly what the other processes need (schema/grants.sql).
		MigrateURL string `mapstructure:"migrate_url"`
		AppRole    string `mapstructure:"app_role"`
		// MigrateLockWait is how long kasa migrate keeps trying a migration that another
		// transaction's lock holds up before it gives up (exit 3).
		MigrateLockWait time.Duration `mapstructure:"migrate_lock_wait"`
	} `mapstructure:"database"`
	Postgres struct {
		Port int `mapstructure:"port"`
	} `mapstructure:"postgres"`
	Temporal struct {
		Address   string `mapstructure:"address"`
		Namespace string `mapstructure:"namespace"`
		TaskQueue string `mapstructure:"task_queue"`
		Port      int    `mapstructure:"port"`    // kasa dev's local dev server
		UIPort    int    `mapstructure:"ui_port"` // kasa dev's local Web UI
		// Gzip compresses gRPC requests to Temporal (the SDK's default). Payment payloads are a
		// few hundred bytes: on a LAN it only spends CPU on both ends, so it is off unless set.
		Gzip bool `mapstructure:"gzip"`
		// A secured cluster or Temporal Cloud: mTLS (PEM paths), the CA the frontend's certificate
		// chains to, the name to check it against, and an API key (which turns TLS on).
		TLSCert       string `mapstructure:"tls_cert"`
		TLSKey        string `mapstructure:"tls_key"`
		TLSCA         string `mapstructure:"tls_ca"`
		TLSServerName string `mapstructure:"tls_server_name"`
		APIKey        string `mapstructure:"api_key"`
		// RegisterSearchAttributes lets `kasa migrate` add the workflows' search attributes to the
		// namespace when missing; off where they are managed elsewhere (Temporal Cloud).
		RegisterSearchAttributes bool `mapstructure:"register_search_attributes"`
	} `mapstructure:"temporal"`
	Data struct {
		Dir string `mapstructure:"dir"`
	} `mapstructure:"data"`
	Secret struct {
		Key string `mapstructure:"key"` // 64 hex characters; encrypts webhook secrets at rest
		// KeyPrevious, during a rotation of Key, opens what it sealed (docs/deployment.md).
		KeyPrevious string `mapstructure:"key_previous"`
	} `mapstructure:"secret"`
	Log struct {
		Level string `mapstructure:"level"`
	} `mapstructure:"log"`
	NATS struct {
		URL string `mapstructure:"url"` // empty: an embedded JetStream server under the data dir
		// How kasa authenticates to an external broker (nats.url) and checks its certificate.
		Creds   string `mapstructure:"creds"`    // a .creds file (user JWT and nkey seed)
		TLSCA   string `mapstructure:"tls_ca"`   // PEM CA bundle the broker's certificate chains to
		TLSCert string `mapstructure:"tls_cert"` // PEM client certificate (with tls_key)
		TLSKey  string `mapstructure:"tls_key"`
	} `mapstructure:"nats"`
	Webhook struct {
		Timeout     time.Duration `mapstructure:"timeout"`      // one delivery attempt
		Concurrency int           `mapstructure:"concurrency"`  // attempts in flight per sender
		PerMerchant int           `mapstructure:"per_merchant"` // attempts in flight per merchant
		RetryFor    time.Duration `mapstructure:"retry_for"`    // how long a failing delivery is retried
		// AllowPrivate lets webhook URLs point at loopback, private and link-local addresses
		// (local development and tests); off, they are refused at registration and at dial time.
		AllowPrivate bool `mapstructure:"allow_private"`
		// OwnHosts are kasa's own public host names, addresses and networks (its load
		// balancer's): webhook URLs naming or resolving to them are refused under any policy.
		OwnHosts []string `mapstructure:"own_hosts"`
	} `mapstructure:"webhook"`
	Events struct {
		Retention time.Duration `mapstructure:"retention"` // published outbox, inbox and finished deliveries are kept this long
		// RedeliverAfter: an event the webhook consumer's inbox still lacks this long after the
		// broker acknowledged it is published again (a broker can lose what it acknowledged).
		RedeliverAfter time.Duration `mapstructure:"redeliver_after"`
	} `mapstructure:"events"`
	Relay struct {
		MetricsAddr string `mapstructure:"metrics_addr"` // `kasa relay`'s /metrics and /healthz; "off": none
	} `mapstructure:"relay"`
	Debug struct {
		PprofAddr string `mapstructure:"pprof_addr"` // Go's /debug/pprof/ for any kasa process; empty: off
	} `mapstructure:"debug"`
	// The worker's periodic ledger check and where it reports.
	Verify struct {
		Interval time.Duration `mapstructure:"interval"` // between the worker's ledger checks; 0: off
	} `mapstructure:"verify"`
	Worker struct {
		// MetricsAddr: `kasa worker`'s /metrics (kasa_ledger_violations among them) and /healthz;
		// "off": none.
		MetricsAddr string `mapstructure:"metrics_addr"`
	} `mapstructure:"worker"`
	// How long the idempotency record of a finished operation is kept: the retry window. Then
	// the worker deletes it, and a request with its key is a new request.
	Idempotency struct {
		Retention time.Duration `mapstructure:"retention"`
	} `mapstructure:"idempotency"`
	// The start backlog (docs/operations.md, "Payday"): payments accepted faster than their
	// workflows can start wait in it, and its drainer starts them at the cluster's pace.
	Backlog struct {
		APIRunning   int           `mapstructure:"api_running"`   // payments one API process runs at once; past it they queue; 0: never
		DrainRunning int           `mapstructure:"drain_running"` // payments the drainer keeps started and processing
		MaxQueued    int64         `mapstructure:"max_queued"`    // past it new payments get 503; 0: no bound
		MaxWait      time.Duration `mapstructure:"max_wait"`      // a backlog longer than this to drain refuses new payments; 0: no bound
	} `mapstructure:"backlog"`
	// CaptureWindow is how long a manual payment waits for its capture before kasa voids its
	// authorization (docs/api.md, "Authorize now, capture later").
	CaptureWindow time.Duration `mapstructure:"capture_window"`
}

// RateLimit is a token bucket: Rate requests a second, Burst at once; Rate 0 turns it off.
type RateLimit struct {
	Rate  float64 `mapstructure:"rate"`
	Burst int     `mapstructure:"burst"`
}

// Capabilities the provider may have; each picks a charge strategy (docs/operations.md).
var Capabilities = []string{"idempotent", "inquiry", "none"}

func setDefaults(v *viper.Viper) {
	v.SetDefault("api.addr", "127.0.0.1:8080")
	v.SetDefault("api.sync_wait", "5s")
	v.SetDefault("api.shutdown_delay", "0s")
	v.SetDefault("api.replay_cache", 50000)
	// API edge limits: timeouts, connection and in-flight caps, rate limits, metrics listener.
	v.SetDefault("api.read_timeout", "30s")
	v.SetDefault("api.write_timeout", "30s")
	v.SetDefault("api.idle_timeout", "120s")
	v.SetDefault("api.max_conns", 4096)
	v.SetDefault("api.max_conns_per_client", 256)
	v.SetDefault("api.max_in_flight", 1024)
	v.SetDefault("api.trusted_proxies", []string{})
	v.SetDefault("api.rate_limit.per_ip.rate", 1000)
	v.SetDefault("api.rate_limit.per_ip.burst", 2000)
	v.SetDefault("api.rate_limit.per_merchant.rate", 500)
	v.SetDefault("api.rate_limit.per_merchant.burst", 1000)
	v.SetDefault("api.rate_limit.failed_auth.rate", 1)
	v.SetDefault("api.rate_limit.failed_auth.burst", 20)
	v.SetDefault("metrics.addr", "")
	v.SetDefault("banksim.addr", "127.0.0.1:8090")
	v.SetDefault("admin.token", "")
	v.SetDefault("admin.token_previous", "")
	v.SetDefault("provider.capability", "idempotent")
	v.SetDefault("provider.url", "")
	v.SetDefault("provider.timeout", "5s")
	v.SetDefault("provider.charge_timeout", "30s")
	v.SetDefault("provider.charge_budget", "2m")
	v.SetDefault("provider.booking_window", "30s")
	v.SetDefault("database.url", "")
	v.SetDefault("database.max_conns", 32)
	v.SetDefault("postgres.port", 0)
	v.SetDefault("temporal.address", "")
	v.SetDefault("temporal.namespace", "default")
	v.SetDefault("temporal.task_queue", "payments")
	v.SetDefault("temporal.port", 7233)
	v.SetDefault("temporal.ui_port", 8233)
	v.SetDefault("temporal.gzip", false)
	v.SetDefault("data.dir", "./.data")
	v.SetDefault("secret.key", "")
	v.SetDefault("secret.key_previous", "")
	v.SetDefault("log.level", "info")
	v.SetDefault("nats.url", "")
	v.SetDefault("webhook.timeout", "10s")
	v.SetDefault("webhook.concurrency", 32)
	v.SetDefault("webhook.per_merchant", 4)
	v.SetDefault("webhook.retry_for", "72h")
	v.SetDefault("events.retention", "168h")
	v.SetDefault("events.redeliver_after", "1m")
	v.SetDefault("relay.metrics_addr", DefaultRelayMetricsAddr)
	v.SetDefault("debug.pprof_addr", "")
	// Database roles and ledger verification (docs/operations.md, "Database roles").
	v.SetDefault("database.migrate_url", "")
	v.SetDefault("database.app_role", "")
	v.SetDefault("database.migrate_lock_wait", "10m")
	v.SetDefault("verify.interval", "10m")
	v.SetDefault("worker.metrics_addr", DefaultWorkerMetricsAddr)
	// Hardening of the event pipeline: the broker's credentials and TLS, and the webhook URLs
	// kasa refuses to call.
	v.SetDefault("nats.creds", "")
	v.SetDefault("nats.tls_ca", "")
	v.SetDefault("nats.tls_cert", "")
	v.SetDefault("nats.tls_key", "")
	v.SetDefault("webhook.allow_private", false)
	v.SetDefault("webhook.own_hosts", []string{})
	// Production Temporal: TLS, API key and search attribute registration (docs/deployment.md).
	v.SetDefault("temporal.tls_cert", "")
	v.SetDefault("temporal.tls_key", "")
	v.SetDefault("temporal.tls_ca", "")
	v.SetDefault("temporal.tls_server_name", "")
	v.SetDefault("temporal.api_key", "")
	v.SetDefault("temporal.register_search_attributes", true)
	// Idempotency-record retention (docs/operations.md).
	v.SetDefault("idempotency.retention", "72h")
	// The start backlog and each merchant's share (docs/operations.md, "Payday").
	v.SetDefault("api.merchant_share", 0.5)
	v.SetDefault("backlog.api_running", 64)
	v.SetDefault("backlog.drain_running", 64)
	v.SetDefault("backlog.max_queued", 100000)
	v.SetDefault("backlog.max_wait", "10m")
	v.SetDefault("capture_window", payment.DefaultCaptureWindow.String())
}

// Load reads defaults, then kasa.yaml (or the file named by KASA_CONFIG) if present, then KASA_* env.
func Load() (Config, error) {
	v := viper.New()
	setDefaults(v)
	v.SetEnvPrefix("KASA")
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_"))
	v.AutomaticEnv()
	// Name the file exactly: a bare config name would also match the `kasa` binary itself.
	f := v.GetString("config")
	if f == "" {
		if _, err := os.Stat("kasa.yaml"); err == nil {
			f = "kasa.yaml"
		}
	}
	if f != "" {
		v.SetConfigFile(f)
		if err := v.ReadInConfig(); err != nil {
			return Config{}, fmt.Errorf("read config %s: %w", f, err)
		}
	}
	var c Config
	// A key kasa does not know (a misspelling in the file) is refused, never left at its default.
	strict := func(dc *mapstructure.DecoderConfig) {
		dc.ErrorUnused = true
		dc.DecodeHook = mapstructure.ComposeDecodeHookFunc(durationWithUnit, dc.DecodeHook)
	}
	if err := v.Unmarshal(&c, strict); err != nil {
		return Config{}, fmt.Errorf("parse config: %w", withVariables(err, v.AllKeys()))
	}
	if err := misspeltVariables(os.Environ(), v.AllKeys()); err != nil {
		return Config{}, err
	}
	// An empty variable reads as unset (its default), and so does an empty value in the file, so
	// a listener is turned off by name only.
	for addr, def := range map[*string]string{&c.Worker.MetricsAddr: DefaultWorkerMetricsAddr, &c.Relay.MetricsAddr: DefaultRelayMetricsAddr} {
		if *addr == "" {
			*addr = def
		}
	}
	for _, addr := range []*string{&c.Worker.MetricsAddr, &c.Relay.MetricsAddr, &c.Debug.PprofAddr} {
		if *addr == MetricsOff {
			*addr = ""
		}
	}
	// The bank's URL is a base the paths are appended to: "https://bank/" means "https://bank",
	// where "//v1/charges" would be answered with a redirect, never with the charge.
	c.Provider.URL = strings.TrimRight(c.Provider.URL, "/")
	return c, c.Validate()
}

// misspeltVariables refuses a KASA_ variable that names no setting but nearly names one (two
// edits or fewer): viper reads only the settings' own names, so a typo would leave its setting at
// the default, as a misspelt key in the file would. Others (the compose file's passwords) pass.
func misspeltVariables(environ, keys []string) error {
	settings := make([]string, 0, len(keys))
	for _, k := range keys {
		settings = append(settings, "KASA_"+strings.ToUpper(strings.ReplaceAll(k, ".", "_")))
	}
	slices.Sort(settings)
	var errs []error
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "KASA_") || name == "KASA_CONFIG" {
			continue
		}
		if _, known := slices.BinarySearch(settings, name); known {
			continue
		}
		for _, s := range settings {
			if editDistance(name, s) <= 2 {
				errs = append(errs, fmt.Errorf("%s is not a setting: did you mean %s? (docs/operations.md lists them)", name, s))
				break
			}
		}
	}
	return errors.Join(errs...)
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(sub, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// withVariables names each setting the decoder's error quotes by its variable too: the key
// ('api.sync_wait') is the file's spelling, and most deployments set the variable.
func withVariables(err error, keys []string) error {
	msg := err.Error()
	for _, k := range keys {
		msg = strings.ReplaceAll(msg, "'"+k+"'", fmt.Sprintf("'%s' (KASA_%s)", k, strings.ToUpper(strings.ReplaceAll(k, ".", "_"))))
	}
	return errors.New(msg)
}

// durationWithUnit refuses a bare number for a duration: a YAML number would otherwise be read as
// nanoseconds (a booking window of 30 ns). 0 needs none. A text that is no duration is refused
// with the text itself, which the decoder's own error leaves out ("time: unknown unit").
func durationWithUnit(from, to reflect.Type, data any) (any, error) {
	if to != reflect.TypeFor[time.Duration]() || data == nil || reflect.ValueOf(data).IsZero() {
		return data, nil
	}
	if from.Kind() == reflect.String {
		d, err := time.ParseDuration(reflect.ValueOf(data).String())
		if err != nil {
			return nil, fmt.Errorf("%w: a duration is a number and its unit (30s, 5m, 72h)", err)
		}
		return d, nil
	}
	return nil, fmt.Errorf("a duration needs its unit (30s, 5m, 72h), got %v", data)
}

// WorkerStopTimeout is how long a stopping worker (SIGTERM) lets its in-flight activities finish,
// a bank call among them, before it ends them (worker.StopTimeout): within the 30 s an
// orchestrator gives a process to stop (docs/deployment.md).
const WorkerStopTimeout = 25 * time.Second

// LogLevels are the values of log.level.
var LogLevels = []string{"debug", "info", "warn", "error"}

// Validate reports every setting that cannot work.
func (c Config) Validate() error {
	var errs []error
	if !slices.Contains(LogLevels, strings.ToLower(c.Log.Level)) {
		errs = append(errs, fmt.Errorf("log.level (KASA_LOG_LEVEL) must be one of %v, got %q", LogLevels, c.Log.Level))
	}
	ok := false
	for _, cap := range Capabilities {
		ok = ok || c.Provider.Capability == cap
	}
	if !ok {
		errs = append(errs, fmt.Errorf("provider.capability (KASA_PROVIDER_CAPABILITY) must be one of %v, got %q", Capabilities, c.Provider.Capability))
	}
	if c.Provider.Timeout <= 0 || c.Provider.ChargeTimeout <= c.Provider.Timeout {
		errs = append(errs, fmt.Errorf("provider.charge_timeout (%s) must be longer than provider.timeout (%s), which must be positive: an attempt must outlive its HTTP call", c.Provider.ChargeTimeout, c.Provider.Timeout))
	}
	if 2*c.Provider.Timeout >= WorkerStopTimeout {
		// Cut by a stopping worker, a call the bank may still book would be an unanswered one;
		// a capture or void may ask the bank first, so two calls must fit in the bound.
		errs = append(errs, fmt.Errorf("provider.timeout (KASA_PROVIDER_TIMEOUT) must be shorter than half a worker's stop bound (%s), got %s: a capture may ask the bank before it sends, and a bank call still running when a stopping worker ends its activities is cut and its outcome unknown", WorkerStopTimeout, c.Provider.Timeout))
	}
	if c.Provider.ChargeBudget < c.Provider.ChargeTimeout {
		errs = append(errs, fmt.Errorf("provider.charge_budget (%s) must be at least provider.charge_timeout (%s)", c.Provider.ChargeBudget, c.Provider.ChargeTimeout))
	}
	if err := checkProviderURL(c.Provider.URL); err != nil {
		errs = append(errs, err)
	}
	if c.Provider.BookingWindow <= 0 {
		errs = append(errs, fmt.Errorf("provider.booking_window (KASA_PROVIDER_BOOKING_WINDOW) must be positive, got %s", c.Provider.BookingWindow))
	}
	if c.Webhook.RetryFor < 24*time.Hour {
		errs = append(errs, fmt.Errorf("webhook.retry_for must be at least 24h (docs/webhooks.md), got %s", c.Webhook.RetryFor))
	}
	if c.Webhook.Timeout <= 0 || c.Webhook.Concurrency < 1 || c.Webhook.PerMerchant < 1 {
		errs = append(errs, errors.New("webhook.timeout, webhook.concurrency and webhook.per_merchant must be positive"))
	}
	if (c.NATS.TLSCert == "") != (c.NATS.TLSKey == "") {
		errs = append(errs, errors.New("nats.tls_cert (KASA_NATS_TLS_CERT) and nats.tls_key (KASA_NATS_TLS_KEY) go together"))
	}
	if (c.Temporal.TLSCert == "") != (c.Temporal.TLSKey == "") {
		errs = append(errs, errors.New("temporal.tls_cert (KASA_TEMPORAL_TLS_CERT) and temporal.tls_key (KASA_TEMPORAL_TLS_KEY) go together"))
	}
	if c.Events.Retention < time.Hour {
		errs = append(errs, fmt.Errorf("events.retention must be at least 1h, got %s", c.Events.Retention))
	}
	// The relay looks only at events published longer ago than this, so it must exceed the
	// relay's longest transaction (its publish timeout and commit, 15s): a row it marks
	// published then cannot commit behind what was checked.
	// Redelivery is given up at half the retention (before the rows go): it must come before that.
	if c.Events.RedeliverAfter < 30*time.Second || c.Events.RedeliverAfter > c.Events.Retention/4 {
		errs = append(errs, fmt.Errorf("events.redeliver_after (KASA_EVENTS_REDELIVER_AFTER) must be between 30s and a quarter of events.retention (%s), got %s",
			c.Events.Retention/4, c.Events.RedeliverAfter))
	}
	if c.API.ReplayCache < 0 {
		errs = append(errs, fmt.Errorf("api.replay_cache must be 0 (off) or more, got %d", c.API.ReplayCache))
	}
	if c.API.SyncWait < 0 || c.API.SyncWait > time.Minute {
		errs = append(errs, fmt.Errorf("api.sync_wait must be between 0 and 1m, got %s", c.API.SyncWait))
	}
	if c.API.ShutdownDelay < 0 || c.API.ShutdownDelay > time.Minute {
		errs = append(errs, fmt.Errorf("api.shutdown_delay must be between 0 and 1m, got %s", c.API.ShutdownDelay))
	}
	errs = append(errs, c.validateEdge()...)
	if c.CaptureWindow < 10*time.Second {
		errs = append(errs, fmt.Errorf("capture_window must be at least 10s, got %s", c.CaptureWindow))
	}
	if b := c.Backlog; b.APIRunning < 0 || b.DrainRunning < 1 || b.MaxQueued < 0 || b.MaxWait < 0 {
		errs = append(errs, fmt.Errorf("backlog: api_running (%d) and max_queued (%d) must be 0 or more, drain_running (%d) at least 1, max_wait (%s) not negative",
			b.APIRunning, b.MaxQueued, b.DrainRunning, b.MaxWait))
	}
	if sh := c.API.MerchantShare; !(sh > 0 && sh <= 1) { // NaN too
		errs = append(errs, fmt.Errorf("api.merchant_share must be more than 0 and at most 1, got %v", sh))
	}
	if c.Temporal.Namespace == "" || c.Temporal.TaskQueue == "" {
		errs = append(errs, errors.New("temporal.namespace and temporal.task_queue must not be empty"))
	}
	if c.Database.MaxConns < 1 {
		errs = append(errs, errors.New("database.max_conns must be at least 1"))
	}
	if c.Secret.KeyPrevious != "" {
		if b, err := hex.DecodeString(c.Secret.KeyPrevious); err != nil || len(b) != 32 {
			errs = append(errs, errors.New("secret.key_previous (KASA_SECRET_KEY_PREVIOUS) must be 64 hex characters (32 bytes)"))
		} else if c.Secret.Key == "" || strings.EqualFold(c.Secret.Key, c.Secret.KeyPrevious) {
			errs = append(errs, errors.New("secret.key_previous (KASA_SECRET_KEY_PREVIOUS) is the key being replaced: set KASA_SECRET_KEY to the new one"))
		}
	}
	if c.Secret.Key != "" {
		if b, err := hex.DecodeString(c.Secret.Key); err != nil || len(b) != 32 {
			errs = append(errs, errors.New("secret.key (KASA_SECRET_KEY) must be 64 hex characters (32 bytes)"))
		}
	}
	if c.Database.MigrateLockWait <= 0 {
		errs = append(errs, fmt.Errorf("database.migrate_lock_wait (KASA_DATABASE_MIGRATE_LOCK_WAIT) must be more than 0, got %s", c.Database.MigrateLockWait))
	}
	if c.Verify.Interval < 0 {
		errs = append(errs, fmt.Errorf("verify.interval must be 0 (off) or more, got %s", c.Verify.Interval))
	}
	errs = append(errs, c.validateListeners()...)
	if c.Data.Dir == "" {
		errs = append(errs, errors.New("data.dir must not be empty"))
	}
	if c.Idempotency.Retention < MinIdempotencyRetention {
		errs = append(errs, fmt.Errorf("idempotency.retention (KASA_IDEMPOTENCY_RETENTION) must be at least %s, got %s", MinIdempotencyRetention, c.Idempotency.Retention))
	}
	return errors.Join(errs...)
}

// checkProviderURL refuses a provider.url kasa cannot call: a worker would start and find every
// charge ambiguous, parking each payment unknown. Unset is checked where it matters (CheckProvider).
func checkProviderURL(raw string) error {
	if raw == "" {
		return nil
	}
	u, err := url.Parse(raw)
	if err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && u.RawQuery == "" && !u.ForceQuery && u.Fragment == "" {
		return nil
	}
	// A password, a query string (an API key) or a fragment stays out of the logs.
	shown := "(an unparsable URL)"
	if err == nil {
		if u.RawQuery != "" || u.ForceQuery {
			u.RawQuery, u.ForceQuery = "…", false
		}
		u.Fragment, u.RawFragment = "", ""
		shown = u.Redacted()
	}
	return fmt.Errorf("provider.url (KASA_PROVIDER_URL) must be the bank's http or https base URL, such as https://bank.example/api, got %q", shown)
}

// validateListeners checks the ports and addresses kasa's processes listen on, so that a bad one
// is refused at start rather than after PostgreSQL, Temporal or the database were reached.
func (c Config) validateListeners() []error {
	var errs []error
	for _, p := range []struct {
		key, env string
		port     int
	}{
		{"postgres.port", "KASA_POSTGRES_PORT", c.Postgres.Port},
		{"temporal.port", "KASA_TEMPORAL_PORT", c.Temporal.Port},
		{"temporal.ui_port", "KASA_TEMPORAL_UI_PORT", c.Temporal.UIPort},
	} {
		if p.port < 0 || p.port > 65535 {
			errs = append(errs, fmt.Errorf("%s (%s) must be a port from 0 to 65535, got %d", p.key, p.env, p.port))
		}
	}
	for _, a := range []struct {
		key, env, addr string
		off            bool // "" turns it off
	}{
		{"api.addr", "KASA_API_ADDR", c.API.Addr, false},
		{"banksim.addr", "KASA_BANKSIM_ADDR", c.Banksim.Addr, false},
		{"metrics.addr", "KASA_METRICS_ADDR", c.MetricsListen(), true},
		{"worker.metrics_addr", "KASA_WORKER_METRICS_ADDR", c.Worker.MetricsAddr, true},
		{"relay.metrics_addr", "KASA_RELAY_METRICS_ADDR", c.Relay.MetricsAddr, true},
		{"debug.pprof_addr", "KASA_DEBUG_PPROF_ADDR", c.Debug.PprofAddr, true},
	} {
		if a.addr == "" && a.off {
			continue
		}
		_, port, err := net.SplitHostPort(a.addr)
		if err == nil {
			_, err = net.LookupPort("tcp", port)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s (%s) must be host:port, such as 127.0.0.1:8080, got %q", a.key, a.env, a.addr))
		}
	}
	return errs
}

// MinIdempotencyRetention is the shortest idempotency-record retention: below a second a key
// could expire before its client's first retry arrives.
const MinIdempotencyRetention = time.Second

// MinAdminTokenLen is the shortest KASA_ADMIN_TOKEN a long-running `kasa api` accepts: the token
// moves money (deposits) and mints merchant keys, so it must not be guessable.
// `openssl rand -hex 24` gives 48 characters; `kasa dev` makes its own random one.
const MinAdminTokenLen = 32

// CheckAdminToken reports why the admin tokens cannot guard a deployed API: unset, or shorter than
// MinAdminTokenLen.
func (c Config) CheckAdminToken() error {
	switch {
	case c.Admin.Token == "":
		return errors.New("KASA_ADMIN_TOKEN is not set: at least 32 random characters (e.g. `openssl rand -hex 24`)")
	case len(c.Admin.Token) < MinAdminTokenLen:
		return fmt.Errorf("KASA_ADMIN_TOKEN must be at least %d characters, got %d (e.g. `openssl rand -hex 24`)", MinAdminTokenLen, len(c.Admin.Token))
	case c.Admin.TokenPrevious != "" && len(c.Admin.TokenPrevious) < MinAdminTokenLen:
		return fmt.Errorf("KASA_ADMIN_TOKEN_PREVIOUS, accepted beside KASA_ADMIN_TOKEN, must be at least %d characters too, got %d", MinAdminTokenLen, len(c.Admin.TokenPrevious))
	}
	return nil
}

// ErrNoProvider is a worker's refusal to start without provider.url: no address is a safe
// default for the bank that moves the money (docs/operations.md).
var ErrNoProvider = errors.New("KASA_PROVIDER_URL is not set: the bank kasa worker charges (kasa dev and kasa cluster default it to their simulator)")

// CheckProvider reports ErrNoProvider when provider.url is unset.
func (c Config) CheckProvider() error {
	if c.Provider.URL == "" {
		return ErrNoProvider
	}
	return nil
}

// SimulatorURL is the provider URL of the bank simulator on banksim.addr, which the developer
// launchers (kasa dev, kasa cluster) charge when provider.url is unset.
func (c Config) SimulatorURL() string { return "http://" + c.Banksim.Addr }

// writeMargin is how much longer than sync_wait an answer may take to write: the work before
// the wait (the database, the workflow start) and after it (reading the record).
const writeMargin = 10 * time.Second

// validateEdge checks the API's timeouts and limits.
func (c Config) validateEdge() []error {
	var errs []error
	a := c.API
	if a.ReadTimeout <= 0 || a.IdleTimeout <= 0 {
		errs = append(errs, fmt.Errorf("api.read_timeout (%s) and api.idle_timeout (%s) must be positive: a slow or idle client would hold its connection for ever", a.ReadTimeout, a.IdleTimeout))
	}
	if a.WriteTimeout < a.SyncWait+writeMargin {
		errs = append(errs, fmt.Errorf("api.write_timeout (%s) must be at least api.sync_wait (%s) + %s, or a payment waiting for its outcome is cut off", a.WriteTimeout, a.SyncWait, writeMargin))
	}
	if a.MaxConnsPerClient < 0 {
		errs = append(errs, fmt.Errorf("api.max_conns_per_client must be 0 (no cap) or positive, got %d", a.MaxConnsPerClient))
	}
	if a.MaxConns < 1 || a.MaxInFlight < 1 || a.MaxInFlight > a.MaxConns {
		errs = append(errs, fmt.Errorf("api.max_conns (%d) and api.max_in_flight (%d) must be positive, with no more requests than connections", a.MaxConns, a.MaxInFlight))
	}
	for name, r := range map[string]RateLimit{"per_ip": a.RateLimit.PerIP, "per_merchant": a.RateLimit.PerMerchant, "failed_auth": a.RateLimit.FailedAuth} {
		if !(r.Rate >= 0) || math.IsInf(r.Rate, 1) || (r.Rate > 0 && r.Burst < 1) { // NaN fails every comparison: refuse it, not skip it
			errs = append(errs, fmt.Errorf("api.rate_limit.%s: rate (%g) must be 0 (off) or a positive number, with a burst of at least 1 (got %d)", name, r.Rate, r.Burst))
		}
	}
	for _, h := range c.Webhook.OwnHosts {
		_, perr := netip.ParsePrefix(h)
		_, aerr := netip.ParseAddr(h)
		if perr != nil && aerr != nil && !hostName.MatchString(h) {
			errs = append(errs, fmt.Errorf("webhook.own_hosts (KASA_WEBHOOK_OWN_HOSTS): %q is neither a host name, an address nor a CIDR network", h))
		}
	}
	for _, p := range a.TrustedProxies {
		if _, err := netip.ParsePrefix(p); err != nil {
			if _, err := netip.ParseAddr(p); err != nil {
				errs = append(errs, fmt.Errorf("api.trusted_proxies: %q is neither an address nor a CIDR", p))
			}
		}
	}
	if c.MetricsListen() == a.Addr {
		errs = append(errs, fmt.Errorf("metrics.addr (KASA_METRICS_ADDR) must differ from api.addr (%s); set it to %q to serve /metrics on the API's port", a.Addr, MetricsOnAPI))
	}
	return errs
}

// hostName is a DNS name as KASA_WEBHOOK_OWN_HOSTS takes it.
var hostName = regexp.MustCompile(`^(?i)[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*\.?$`)

// MetricsOff, as worker.metrics_addr or relay.metrics_addr, serves no /metrics; as
// debug.pprof_addr, no /debug/pprof/.
const MetricsOff = "off"

// MetricsOnAPI, as metrics.addr, serves the API's /metrics on api.addr beside the merchants'
// routes, as kasa dev and kasa cluster do on a developer's machine.
const MetricsOnAPI = "api"

// DefaultMetricsAddr is where `kasa api` serves /metrics unless told otherwise: off the port
// merchants reach, since a scrape shows the business's figures and runs database queries.
const DefaultMetricsAddr = "127.0.0.1:8091"

// DefaultWorkerMetricsAddr and DefaultRelayMetricsAddr are where `kasa worker` and `kasa relay`
// serve /metrics and /healthz unless told otherwise ("off": nowhere).
const (
	DefaultWorkerMetricsAddr = "127.0.0.1:8093"
	DefaultRelayMetricsAddr  = "127.0.0.1:8092"
)

// MetricsListen is the address of the API's own /metrics listener, or "" when /metrics is
// served on api.addr.
func (c Config) MetricsListen() string {
	switch c.Metrics.Addr {
	case "":
		return DefaultMetricsAddr
	case MetricsOnAPI:
		return ""
	}
	return c.Metrics.Addr
}

// SecretKeyPrevious returns the decoded previous secret key, or nil when none is configured.
func (c Config) SecretKeyPrevious() []byte {
	if c.Secret.KeyPrevious == "" {
		return nil
	}
	b, _ := hex.DecodeString(c.Secret.KeyPrevious)
	return b
}

// SecretKey returns the decoded secret key, or nil when none is configured.
func (c Config) SecretKey() []byte {
	b, _ := hex.DecodeString(c.Secret.Key)
	if len(b) != 32 {
		return nil
	}
	return b
}

// EnvVars lists the environment variable of every setting (KASA_<KEY>, dots as underscores).
func EnvVars() []string {
	v := viper.New()
	setDefaults(v)
	var out []string
	for _, k := range v.AllKeys() {
		out = append(out, "KASA_"+strings.ToUpper(strings.ReplaceAll(k, ".", "_")))
	}
	sort.Strings(out)
	return out
}
