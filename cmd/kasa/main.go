// Command kasa runs kasa's processes: `kasa dev` (everything, locally), or one of api, worker,
// banksim, migrate and verify.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.temporal.io/sdk/client"

	"github.com/kasa-pay/kasa/activities"
	"github.com/kasa-pay/kasa/api"
	"github.com/kasa-pay/kasa/config"
	"github.com/kasa-pay/kasa/outbox"
	"github.com/kasa-pay/kasa/provider"
	"github.com/kasa-pay/kasa/reconcile"
	"github.com/kasa-pay/kasa/schema"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/sweeper"
	"github.com/kasa-pay/kasa/worker"
	"github.com/kasa-pay/kasa/workflows"
)

const usageFormat = `kasa — exactly-once payments on Temporal and PostgreSQL

usage: kasa <command>

commands:
%s  api       run the REST API (needs KASA_DATABASE_URL, KASA_TEMPORAL_ADDRESS, KASA_ADMIN_TOKEN, KASA_SECRET_KEY);
            /metrics on KASA_METRICS_ADDR (default 127.0.0.1:8091)
  worker [--change-money-settings]
            run the Temporal worker (needs KASA_DATABASE_URL, KASA_TEMPORAL_ADDRESS, KASA_PROVIDER_URL, KASA_SECRET_KEY);
            verifies the ledger every KASA_VERIFY_INTERVAL; /metrics on KASA_WORKER_METRICS_ADDR;
            --change-money-settings makes its KASA_PROVIDER_* money settings the deployment's
            (docs/deployment.md, "Money settings")
  relay     run the event pipeline: outbox -> NATS JetStream (embedded unless KASA_NATS_URL) -> signed
            merchant webhooks, with retention; /metrics on KASA_RELAY_METRICS_ADDR (needs KASA_DATABASE_URL, KASA_SECRET_KEY)
  migrate   apply database migrations as KASA_DATABASE_MIGRATE_URL (default KASA_DATABASE_URL), grant
            KASA_DATABASE_APP_ROLE the application's privileges when set, register the search attributes
            on the Temporal namespace when KASA_TEMPORAL_ADDRESS is set, and exit; a migration that
            another transaction's lock holds up is tried again for KASA_DATABASE_MIGRATE_LOCK_WAIT,
            then exit 3 (it is not recorded as applied: run it again)
  verify    check the ledger and balance invariants; exit 1 listing every violation
  rotate-secret-key  a KASA_SECRET_KEY rotation's last step: re-seal every webhook secret under
            KASA_SECRET_KEY, opening it with KASA_SECRET_KEY_PREVIOUS, as KASA_DATABASE_MIGRATE_URL
            (default KASA_DATABASE_URL), and make it the deployment's key (docs/deployment.md)
  reconcile [flags] <settlement.csv>
            match a provider settlement file to payments, settle unknown ones, report mismatches
            (exit 0 no unresolved mismatch, 1 mismatches, 2 invalid file or usage, 3 could not run:
            run it again); "kasa reconcile -h" lists the flags; see docs/reconciliation.md
%s
configuration: kasa.yaml and KASA_* environment variables (docs/operations.md).
`

// command runs one subcommand until ctx ends.
type command func(context.Context, config.Config, *slog.Logger) error

// commands are what production runs. A build without the production tag adds the developer
// tools (tools.go): the production binary and image carry none of their code.
var commands = map[string]command{
	"api": runAPI, "worker": runWorker, "relay": runRelay,
	"migrate": runMigrate, "verify": runVerify, "reconcile": runReconcile, "rotate-secret-key": runRotateSecretKey,
}

// takesArgs are the commands that read arguments of their own; the others refuse any.
var takesArgs = map[string]bool{"reconcile": true, "worker": true, "bench": true, "soak": true}

// toolUsage and toolHeadUsage are the tools' lines of the usage text, empty in a production build.
var toolHeadUsage, toolUsage string

func usage() string { return fmt.Sprintf(usageFormat, toolHeadUsage, toolUsage) }

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		fmt.Print(usage())
		return
	}
	// A command kasa does not have is named as such, whatever follows it or the configuration.
	run, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "kasa: unknown command %q\n\n%s", os.Args[1], usage())
		os.Exit(2)
	}
	if len(os.Args) > 2 && !takesArgs[os.Args[1]] {
		if os.Args[2] == "-h" || os.Args[2] == "--help" {
			fmt.Print(usage())
			return
		}
		fmt.Fprintf(os.Stderr, "kasa %s takes no arguments (its settings are KASA_* variables), got %q\n\n%s", os.Args[1], os.Args[2:], usage())
		os.Exit(2)
	}
	cfg, err := config.Load()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kasa: config:", err)
		os.Exit(2)
	}
	log := newLogger(cfg.Log.Level)
	slog.SetDefault(log)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // a second signal ends the process at once; its children stop with it (parent-death signal)
	}()

	if cfg.Debug.PprofAddr != "" {
		// Profiles on demand (go tool pprof http://ADDR/debug/pprof/profile): off unless asked for,
		// and never on the API's own listener.
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		stopPprof, err := serve(ctx, "pprof", cfg.Debug.PprofAddr, mux, log)
		if err != nil {
			fmt.Fprintln(os.Stderr, "kasa:", err)
			os.Exit(2)
		}
		defer stopPprof()
	}
	if err := run(ctx, cfg, log); err != nil {
		var exit exitError
		if errors.As(err, &exit) {
			os.Exit(int(exit))
		}
		log.Error("kasa "+os.Args[1]+" failed", "error", err)
		os.Exit(1)
	}
}

type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit %d", int(e)) }

func newLogger(level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
}

func openStore(ctx context.Context, cfg config.Config, migrate bool) (*store.Store, error) {
	if cfg.Database.URL == "" {
		return nil, errors.New("KASA_DATABASE_URL is not set (or use `kasa dev`, which starts PostgreSQL)")
	}
	key := cfg.SecretKey()
	if key == nil {
		return nil, errors.New("KASA_SECRET_KEY is not set: 64 hex characters, shared by api and worker (e.g. `openssl rand -hex 32`)")
	}
	if migrate {
		if err := migrateDatabase(ctx, cfg, key); err != nil {
			return nil, err
		}
	}
	return store.Open(ctx, store.Options{URL: cfg.Database.URL, MaxConns: cfg.Database.MaxConns, SecretKey: key, PreviousSecretKey: cfg.SecretKeyPrevious(),
		AppName: sessionName()})
}

// sessionName names this process's database sessions after its command ("kasa worker"), so
// pg_stat_activity tells the processes apart.
func sessionName() string {
	if len(os.Args) < 2 {
		return "kasa"
	}
	return "kasa " + os.Args[1]
}

// migrateDatabase applies the migrations as the tables' owner (database.migrate_url, else
// database.url) and, when database.app_role is set, grants that role the application's
// privileges. The other processes never migrate: as the application role they could not.
func migrateDatabase(ctx context.Context, cfg config.Config, key []byte) error {
	url := cfg.Database.MigrateURL
	if url == "" {
		url = cfg.Database.URL
	}
	if url == "" {
		return errors.New("KASA_DATABASE_MIGRATE_URL or KASA_DATABASE_URL must name the database to migrate")
	}
	st, err := store.Open(ctx, store.Options{URL: url, MaxConns: 2, SecretKey: key, Migrate: true, MigrateLockWait: cfg.Database.MigrateLockWait,
		AppRole: cfg.Database.AppRole, AppName: sessionName()})
	if err != nil {
		return err
	}
	st.Close()
	return nil
}

// waitStore opens the store, waiting for a database that cannot be reached yet (restarting, or
// not up before kasa) or not yet migrated to this build's schema: a long-running process comes
// up when the database does, instead of exiting and leaving a supervisor to retry.
// Configuration errors still end it at once.
// keyed says the process seals or opens webhook secrets: its key must be the deployment's (the
// first to ask records its own). One that touches no secret (kasa reconcile) neither records a
// key nor needs one.
func waitStore(ctx context.Context, cfg config.Config, log *slog.Logger, keyed bool) (*store.Store, error) {
	return waitFor(ctx, log, 10*time.Second, func() (*store.Store, string, error) {
		st, err := openChecked(ctx, cfg, keyed)
		switch {
		case err == nil:
			return st, "", nil
		case errors.Is(err, store.ErrSchemaBehind):
			return nil, "waiting for kasa migrate", err
		case errors.Is(err, store.ErrUnavailable):
			return nil, "waiting for the database", err
		}
		return nil, "", err
	})
}

// openChecked opens the store once, migrated to this build's schema and, when keyed (see
// waitStore), with the deployment's key. A command that ends uses it as it is: it reports a
// database that is down or behind and is run again, where a long-running process waits
// (waitStore).
func openChecked(ctx context.Context, cfg config.Config, keyed bool) (*store.Store, error) {
	st, err := openStore(ctx, cfg, false)
	if err != nil {
		return nil, err
	}
	if err = st.CheckSchema(ctx); err == nil && keyed {
		err = st.CheckSecretKey(ctx)
	}
	if err != nil {
		st.Close()
		return nil, err
	}
	return st, nil
}

// waitFor calls try until it succeeds, fails for good, or ctx ends. try says why waiting may
// help (logged with its error, then the next try after a backoff from 500 ms up to most), or ""
// when it cannot, and its error ends the wait.
func waitFor[T any](ctx context.Context, log *slog.Logger, most time.Duration, try func() (T, string, error)) (T, error) {
	wait := 500 * time.Millisecond
	for {
		v, why, err := try()
		if err == nil || why == "" || ctx.Err() != nil {
			return v, err
		}
		log.Warn(why, "error", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(wait):
		}
		wait = min(2*wait, most)
	}
}

// How a process gets its Temporal client.
type temporalDial int

const (
	// temporalLazy connects on first use: `kasa api` starts anyway, answers 503 while Temporal
	// is away and recovers on its own when it returns.
	temporalLazy temporalDial = iota
	// temporalWait waits for the frontend and the namespace (a long-running worker).
	temporalWait
	// temporalOnce dials once and fails if Temporal is away, and opens the database once too:
	// a command that ends (kasa reconcile) says so and is run again, never waits (openChecked).
	temporalOnce
)

// connect opens the store and a Temporal client, the two things api and worker share (keyed:
// see waitStore).
func connect(ctx context.Context, cfg config.Config, log *slog.Logger, how temporalDial, keyed bool) (*store.Store, client.Client, error) {
	// Settings that can never work fail before any wait.
	if _, err := temporalOptions(cfg, log); err != nil {
		return nil, nil, err
	}
	var st *store.Store
	var err error
	if how == temporalOnce {
		st, err = openChecked(ctx, cfg, keyed)
	} else {
		st, err = waitStore(ctx, cfg, log, keyed)
	}
	if err != nil {
		return nil, nil, err
	}
	var tc client.Client
	switch how {
	case temporalWait:
		tc, err = waitTemporal(ctx, cfg, log)
	default:
		tc, err = dialTemporal(ctx, cfg, log, how == temporalLazy)
		if err != nil {
			err = fmt.Errorf("temporal at %s: %w", temporalAddress(cfg), err)
		}
	}
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	return st, tc, nil
}

func chargePolicy(cfg config.Config) workflows.ChargePolicy {
	return workflows.ChargePolicy{
		Capability: workflows.Capability(cfg.Provider.Capability),
		Budget:     cfg.Provider.ChargeBudget, Timeout: cfg.Provider.ChargeTimeout,
		BookingWindow: cfg.Provider.BookingWindow,
	}
}

// workerBank is the bank a worker charges when KASA_PROVIDER_URL is unset: none in the
// production build, whose worker then refuses to start (config.ErrNoProvider); the full build's
// is the bank simulator on KASA_BANKSIM_ADDR (tools.go), the one setting of the bank the
// contract names for it.
var workerBank = func(cfg config.Config) config.Config { return cfg }

// policyLive is how long after its last report a worker's policy counts as a live worker's.
const policyLive = 3 * worker.PolicyReportInterval

// workerPolicy is chargePolicy as the store records it.
func workerPolicy(cfg config.Config) store.WorkerPolicy {
	c := chargePolicy(cfg)
	return store.WorkerPolicy{Capability: string(c.Capability), BookingWindow: c.BookingWindow, ChargeBudget: c.Budget, ChargeTimeout: c.Timeout}
}

// startPolicyReport reports the worker's policy in the background until the returned stop is
// called. A report that finds the deployment's money settings changed since this worker's last
// (it was stalled meanwhile) calls changed with that error: the worker must stop.
func startPolicyReport(ctx context.Context, cfg config.Config, st *store.Store, log *slog.Logger, changed func(error)) (stop func()) {
	var after time.Time
	report := func(ctx context.Context) error {
		seen, err := st.ReportWorkerPolicy(ctx, cfg.Temporal.TaskQueue, workerPolicy(cfg), after)
		var change *store.PolicyChangeError
		if errors.As(err, &change) && claimPolicy {
			changed(err)
			return nil
		}
		if err == nil {
			after = seen
		}
		return err
	}
	return background(ctx, func(ctx context.Context) { worker.ReportPolicy(ctx, worker.PolicyReportInterval, report, log) })
}

// background runs fn in a goroutine until the returned stop is called, which waits for it.
func background(ctx context.Context, fn func(context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); fn(ctx) }()
	return func() { cancel(); <-done }
}

// levelFloor drops records below min: the SDK logs every poll at info.
type levelFloor struct {
	slog.Handler
	min slog.Level
}

func (h *levelFloor) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func newActivities(cfg config.Config, st *store.Store) *activities.Activities {
	return &activities.Activities{Store: st, Provider: provider.New(cfg.Provider.URL, cfg.Provider.Timeout), Policy: chargePolicy(cfg)}
}

// newAPI builds the API. localWorker: the payment worker runs in this process on st, so the API
// learns outcomes from st and need not ask Temporal for each workflow's result.
func newAPI(cfg config.Config, st *store.Store, tc client.Client, reg *prometheus.Registry, log *slog.Logger, localWorker bool) *api.Server {
	var outcomes api.Outcomes
	if localWorker {
		outcomes = st
	}
	return api.New(api.Options{
		Outcomes: outcomes,
		Registry: reg,
		Store:    st, Workflows: workflows.Starter{Client: tc, TaskQueue: cfg.Temporal.TaskQueue, Namespace: cfg.Temporal.Namespace},
		AdminToken: cfg.Admin.Token, AdminTokenPrevious: cfg.Admin.TokenPrevious, SyncWait: cfg.API.SyncWait, CaptureWindow: cfg.CaptureWindow, AllowPrivateWebhooks: cfg.Webhook.AllowPrivate, OwnHosts: outbox.NewOwnHosts(cfg.Webhook.OwnHosts),
		Logger: log, ReplayCache: cfg.API.ReplayCache, Retention: cfg.Idempotency.Retention,
		SeparateMetrics: cfg.MetricsListen() != "", Limits: apiLimits(cfg),
		Backlog:          api.Backlog{State: st, MaxRunning: cfg.Backlog.APIRunning, MaxQueued: cfg.Backlog.MaxQueued, MaxWait: cfg.Backlog.MaxWait},
		SearchAttributes: searchAttributes{client: tc, namespace: cfg.Temporal.Namespace},
		Reconciler: &reconcile.Reconciler{Store: st, Settler: workflows.Starter{Client: tc, TaskQueue: cfg.Temporal.TaskQueue}, Workers: st,
			BookingWindow: cfg.Provider.BookingWindow, Logger: log, Runs: st, Source: "api"},
	})
}

// apiLimits are the API's timeouts, caps and rate limits from cfg.
func apiLimits(cfg config.Config) api.Limits {
	a := cfg.API
	return api.Limits{
		ReadTimeout: a.ReadTimeout, WriteTimeout: a.WriteTimeout, IdleTimeout: a.IdleTimeout,
		MaxConns: a.MaxConns, MaxConnsPerClient: min(a.MaxConnsPerClient, max(1, a.MaxConns/2)), MaxInFlight: a.MaxInFlight, MerchantShare: a.MerchantShare, TrustedProxies: a.TrustedProxies,
		PerIP:       api.Rate{PerSecond: a.RateLimit.PerIP.Rate, Burst: a.RateLimit.PerIP.Burst},
		PerMerchant: api.Rate{PerSecond: a.RateLimit.PerMerchant.Rate, Burst: a.RateLimit.PerMerchant.Burst},
		FailedAuth:  api.Rate{PerSecond: a.RateLimit.FailedAuth.Rate, Burst: a.RateLimit.FailedAuth.Burst},
	}
}

// serveAPI serves srv on api.addr with its limits, and its /metrics where metrics.addr says.
func serveAPI(ctx context.Context, cfg config.Config, srv *api.Server, log *slog.Logger) (stop func(), err error) {
	stopAPI, err := serveWith("api", cfg.API.Addr, srv.HTTPServer(), srv.Listener, log)
	if err != nil || cfg.MetricsListen() == "" {
		return stopAPI, err
	}
	stopMetrics, err := serve(ctx, "metrics", cfg.MetricsListen(), srv.MetricsHandler(), log)
	if err != nil {
		stopAPI()
		return nil, err
	}
	return func() { stopAPI(); stopMetrics() }, nil
}

// startSweeper starts stranded operations, and drains the start backlog when this process leads,
// in the background until the returned stop is called.
func startSweeper(ctx context.Context, cfg config.Config, st *store.Store, tc client.Client, reg prometheus.Registerer, log *slog.Logger) (stop func()) {
	starter := workflows.Starter{Client: tc, TaskQueue: cfg.Temporal.TaskQueue}
	sw := &sweeper.Sweeper{Store: st, Starter: starter, Logger: log}
	dr := &sweeper.Drainer{Store: st, Starter: starter, MaxRunning: cfg.Backlog.DrainRunning, Logger: log, Registerer: reg}
	stopSweep, stopDrain := background(ctx, sw.Run), background(ctx, dr.Run)
	return func() { stopDrain(); stopSweep() }
}

// serve runs an HTTP server until stop is called, then drains it.
func serve(_ context.Context, name, addr string, h http.Handler, log *slog.Logger) (stop func(), err error) {
	return serveWith(name, addr, &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}, nil, log)
}

// serveWith runs srv on addr, its listener wrapped by wrap when not nil, until stop is called.
func serveWith(name, addr string, srv *http.Server, wrap func(net.Listener) net.Listener, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: listen on %s: %w", name, addr, err)
	}
	if wrap != nil {
		ln = wrap(ln)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(name+" server", "error", err)
		}
	}()
	log.Info(name+" listening", "addr", "http://"+ln.Addr().String())
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-done
	}, nil
}

func runAPI(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	if err := cfg.CheckAdminToken(); err != nil {
		return err
	}
	st, tc, err := connect(ctx, cfg, log, temporalLazy, true)
	if err != nil {
		return stoppedOr(ctx, log, err)
	}
	defer st.Close()
	defer tc.Close()
	srv := newAPI(cfg, st, tc, nil, log, false)
	stop, err := serveAPI(ctx, cfg, srv, log)
	if err != nil {
		return err
	}
	stopSweeper, stopFollow := startSweeper(ctx, cfg, st, tc, srv.Registry, log), followRetentions(ctx, srv, st)
	<-ctx.Done()
	if d := cfg.API.ShutdownDelay; d > 0 {
		srv.NotReady()
		log.Info("stopping api: /readyz answers 503 while it still serves", "for", d)
		time.Sleep(d)
	}
	log.Info("shutting down api")
	stop()
	stopFollow()
	stopSweeper()
	return nil
}

// followRetentions bounds srv's replay cache by the workers' shortest idempotency retention in
// the background (docs/deployment.md), until the returned stop is called.
func followRetentions(ctx context.Context, srv *api.Server, st *store.Store) (stop func()) {
	return background(ctx, func(ctx context.Context) {
		srv.FollowRetentions(ctx, st, worker.RetentionLive, worker.RetentionFollowInterval)
	})
}

// stoppedOr is err, unless the process was told to stop while it waited for the database or
// Temporal: then it ends cleanly.
func stoppedOr(ctx context.Context, log *slog.Logger, err error) error {
	if err != nil && ctx.Err() != nil {
		log.Info("stopped while waiting", "reason", err)
		return nil
	}
	return err
}

func runWorker(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	change := fs.Bool("change-money-settings", false, "")
	if err := fs.Parse(os.Args[2:]); err != nil || fs.NArg() > 0 {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Print(usage())
			return nil
		}
		fmt.Fprintf(os.Stderr, "kasa worker: takes only --change-money-settings, got %q\n\n%s", os.Args[2:], usage())
		return exitError(2)
	}
	if cfg = workerBank(cfg); cfg.CheckProvider() != nil {
		return cfg.CheckProvider()
	}
	st, tc, err := connect(ctx, cfg, log, temporalWait, true)
	if err != nil {
		return stoppedOr(ctx, log, err)
	}
	defer st.Close()
	defer tc.Close()
	// The metrics listener first: a port taken by another worker on the host ends this one
	// before it recorded its settings or polled anything.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if cfg.Worker.MetricsAddr != "" {
		stop, err := serve(ctx, "worker metrics", cfg.Worker.MetricsAddr, metricsMux(reg), log)
		if err != nil {
			return fmt.Errorf("%w (KASA_WORKER_METRICS_ADDR: give each worker on a host its own, or off)", err)
		}
		defer stop()
	}
	// The workers' money settings are the deployment's: one that disagrees with a live worker
	// on its queue, or with the settings last reported unless told to change them, never polls;
	// one that finds them changed while it was silent stops.
	claim := st.ClaimWorkerPolicy
	if *change {
		claim = st.ChangeWorkerPolicy
	}
	if err := claim(ctx, cfg.Temporal.TaskQueue, workerPolicy(cfg), policyLive); err != nil && claimPolicy {
		return stoppedOr(ctx, log, err)
	}
	ctx, changed := context.WithCancelCause(ctx)
	defer changed(nil)
	stopReport := startPolicyReport(ctx, cfg, st, log, changed)
	defer stopReport()
	w := worker.New(tc, cfg.Temporal.TaskQueue, newActivities(cfg, st), func(err error) {
		changed(fmt.Errorf("%w: %w", errWorkerStopped, err))
	})
	if err := w.Start(); err != nil {
		return err
	}
	// A bank may take basic authentication from the URL: its password stays out of the log.
	log.Info("worker polling", "task_queue", cfg.Temporal.TaskQueue, "provider", outbox.RedactURL(cfg.Provider.URL), "capability", cfg.Provider.Capability)
	stopCheck := startLedgerCheck(ctx, cfg, st, reg, log)
	stopRetention := startRecordRetention(ctx, cfg, st, reg, log)
	<-ctx.Done()
	var changedMeanwhile *store.PolicyChangeError
	stoppedBy := context.Cause(ctx)
	failed := errors.Is(stoppedBy, errWorkerStopped)
	switch {
	case errors.As(stoppedBy, &changedMeanwhile):
		failed = true
		log.Error("stopping: the deployment's money settings changed while this worker did not report", "error", stoppedBy)
	case failed:
		log.Error("stopping: the worker no longer polls", "error", stoppedBy)
	default:
		log.Info("shutting down worker")
	}
	stopRetention()
	stopCheck()
	w.Stop()
	if failed {
		return stoppedBy
	}
	return nil
}

// errWorkerStopped: the SDK stopped the worker for good (its namespace is gone, say). The
// process exits non-zero rather than run on polling nothing, so that its supervisor sees it and
// starts it again, to wait for Temporal as any worker starting does.
var errWorkerStopped = errors.New("temporal stopped the worker")

// startLedgerCheck verifies the ledger every verify.interval in the background, exporting the
// result on reg, until the returned stop is called.
func startLedgerCheck(ctx context.Context, cfg config.Config, st *store.Store, reg prometheus.Registerer, log *slog.Logger) (stop func()) {
	check := worker.NewLedgerCheck(st, cfg.Verify.Interval, reg, log)
	return background(ctx, func(ctx context.Context) { _ = check.Run(ctx) })
}

// startRecordRetention deletes expired idempotency records in the background, exporting its
// metrics on reg, until the returned stop is called.
func startRecordRetention(ctx context.Context, cfg config.Config, st *store.Store, reg prometheus.Registerer, log *slog.Logger) (stop func()) {
	r := worker.NewRecordRetention(st, cfg.Idempotency.Retention, worker.RetentionInterval, worker.RetentionBatch, reg, log)
	return background(ctx, func(ctx context.Context) { _ = r.Run(ctx) })
}

// metricsMux serves a process's /metrics and /healthz on a listener of their own.
func metricsMux(reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"status":"ok"}`)) })
	return mux
}

func runMigrate(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	// Migrations never touch secrets: any key opens the store.
	if err := migrateDatabase(ctx, cfg, make([]byte, 32)); err != nil {
		if errors.Is(err, schema.ErrLockWait) {
			// Nothing half-applied: the deploy can simply run it again, later.
			log.Error("kasa migrate failed", "error", err)
			return exitError(3)
		}
		return err
	}
	if cfg.Database.AppRole != "" {
		log.Info("migrations applied; application role granted", "app_role", cfg.Database.AppRole)
	} else {
		log.Info("migrations applied")
	}
	return migrateSearchAttributes(ctx, cfg, log)
}

// runRotateSecretKey is `kasa rotate-secret-key`: it re-seals the webhook secrets under the new
// key and makes it the deployment's, as the tables' owner (the application role may not change
// the deployment's key).
func runRotateSecretKey(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	if cfg.SecretKey() == nil || cfg.SecretKeyPrevious() == nil {
		return errors.New("KASA_SECRET_KEY (the new key) and KASA_SECRET_KEY_PREVIOUS (the key it replaces) must both be set")
	}
	if cfg.Database.MigrateURL != "" {
		cfg.Database.URL = cfg.Database.MigrateURL
	}
	cfg.Database.MaxConns = 2
	st, err := openChecked(ctx, cfg, false) // a database behind this build lacks the key's table
	if err != nil {
		return err
	}
	defer st.Close()
	n, err := st.RotateSecretKey(ctx)
	if err != nil && strings.Contains(err.Error(), "permission denied") {
		return fmt.Errorf("rotate the secret key: %w (run it as the tables' owner: set KASA_DATABASE_MIGRATE_URL)", err)
	}
	if err != nil {
		return fmt.Errorf("rotate the secret key: %w", err)
	}
	fmt.Printf("rotate-secret-key: re-sealed the webhook secrets of %d merchant(s) under KASA_SECRET_KEY; "+
		"it is the deployment's key now: remove KASA_SECRET_KEY_PREVIOUS from every process\n", n)
	return nil
}

func runVerify(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	if cfg.Secret.Key == "" {
		cfg.Secret.Key = strings.Repeat("0", 64) // verify never touches secrets
	}
	// Checked against this build's schema: an unmigrated database says "run kasa migrate", not
	// which table is missing.
	st, err := openChecked(ctx, cfg, false)
	if err != nil {
		return err
	}
	defer st.Close()
	problems, err := st.Verify(ctx)
	if err != nil {
		return err
	}
	if len(problems) == 0 {
		fmt.Println("verify: ok — ledger balanced, balances match the ledger, reservations and payments consistent")
		return nil
	}
	fmt.Printf("verify: %d problem(s):\n", len(problems))
	for _, p := range problems {
		fmt.Println("  -", p)
	}
	return exitError(1)
}
