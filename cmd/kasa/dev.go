//go:build !production

package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kasa-pay/kasa/config"
	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/banksim"
	"github.com/kasa-pay/kasa/tools/devenv"
	"github.com/kasa-pay/kasa/worker"
	"github.com/kasa-pay/kasa/workflows"
)

// devState is what `kasa dev` keeps between runs so that a restart finds the same credentials.
type devState struct {
	AdminToken     string    `json:"admin_token"`
	SecretKey      string    `json:"secret_key"`
	PostgresPort   int       `json:"postgres_port"`
	DemoMerchantID uuid.UUID `json:"demo_merchant_id"`
	DemoAPIKey     string    `json:"demo_api_key"`
	DemoAccountID  uuid.UUID `json:"demo_account_id"`
	// Where this run's servers are (rewritten at every start; `kasa bench` reads them).
	DatabaseURL     string `json:"database_url"`
	TemporalAddress string `json:"temporal_address"`
}

// loadState reads what a launcher kept at path into s; no file leaves s as it is.
func loadState(path string, s any) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err == nil {
		err = json.Unmarshal(b, s)
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	return nil
}

func saveState(path string, s any) error {
	b, _ := json.MarshalIndent(s, "", "  ")
	return os.WriteFile(path, b, 0o600)
}

// credentials fills cfg's admin token and secret key, unless set, with the ones kept, made at the
// first run.
func (s *devState) credentials(cfg *config.Config) {
	if cfg.Admin.Token == "" {
		if s.AdminToken == "" {
			s.AdminToken = "adm_" + randomHex(16)
		}
		cfg.Admin.Token = s.AdminToken
	}
	if cfg.Secret.Key == "" {
		if s.SecretKey == "" {
			s.SecretKey = randomHex(32)
		}
		cfg.Secret.Key = s.SecretKey
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// lockLauncherDir makes dir and takes its lock at dir/name (one launcher per directory), then
// waits until the addresses (each with its setting) are free: a process on one would answer in
// place of the child that fails to bind it, which would fail late.
func lockLauncherDir(ctx context.Context, dir, name, what string, addrSetting ...string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if unlock, err = devenv.LockDir(filepath.Join(dir, name), what); err != nil {
		return nil, err
	}
	if err := devenv.WaitAddrFree(ctx, addrSetting...); err != nil {
		unlock()
		return nil, err
	}
	return unlock, nil
}

// keptPort is last, a port kept from the last run, when it is still free, so that bookmarks keep
// working; else a free one.
func keptPort(last int) (int, error) {
	if last != 0 && devenv.CheckAddrFree("127.0.0.1:"+strconv.Itoa(last), "") == nil {
		return last, nil
	}
	return devenv.FreePort()
}

// runDev starts the whole system on embedded defaults and stops every child on SIGINT/SIGTERM;
// a child killed on stop fails the run.
func runDev(ctx context.Context, cfg config.Config, log *slog.Logger) (err error) {
	cfg = onSimulator(cfg)
	relaxGC()
	shareCores(runtime.NumCPU())
	dir, err := filepath.Abs(cfg.Data.Dir)
	if err != nil {
		return err
	}
	// Its PostgreSQL refuses a second server, but not the Temporal SQLite file, the bank's
	// records or the NATS store, nor anything when KASA_DATABASE_URL points elsewhere.
	addrs := []string{cfg.API.Addr, "KASA_API_ADDR"}
	if cfg.Provider.URL == cfg.SimulatorURL() {
		addrs = append(addrs, cfg.Banksim.Addr, "KASA_BANKSIM_ADDR")
	}
	unlock, err := lockLauncherDir(ctx, dir, "dev.lock", "kasa dev", addrs...)
	if err != nil {
		return err
	}
	defer unlock()
	statePath := filepath.Join(dir, "dev.json")
	var state devState
	if err := loadState(statePath, &state); err != nil {
		return err
	}
	state.credentials(&cfg)

	var cleanup []func()
	defer func() {
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
	}()
	stopped := func(e error) { err = errors.Join(err, e) } // a server's stop that failed

	// Without its database or Temporal nothing works: saying so beats answering 503 for ever.
	died := make(chan error, 2)
	watch := func(name string, c *devenv.Child) {
		go func() {
			<-c.Done()
			died <- fmt.Errorf("%s exited on its own (%v; log %s)", name, c.Err(), c.LogPath)
		}()
	}
	joined := cfg.Database.URL != "" // a deployment's database, whose workers may be running
	if cfg.Database.URL == "" {
		port := cfg.Postgres.Port
		if port == 0 {
			if port, err = keptPort(state.PostgresPort); err != nil {
				return err
			}
		}
		pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: filepath.Join(dir, "postgres"), Port: port, Logger: log})
		if err != nil {
			return err
		}
		cleanup = append(cleanup, func() { log.Info("stopping PostgreSQL"); stopped(pg.Stop()) })
		watch("PostgreSQL", pg.Process())
		cfg.Database.URL = pg.URL
		state.PostgresPort = pg.Port
	}
	uiURL := ""
	if cfg.Temporal.Address == "" {
		tmp, err := devenv.StartTemporal(ctx, devenv.TemporalOptions{
			Port: cfg.Temporal.Port, UIPort: cfg.Temporal.UIPort, DBFile: filepath.Join(dir, "temporal", "temporal.db"),
			Namespace: cfg.Temporal.Namespace, LogDir: dir, Logger: log,
		})
		if err != nil {
			return err
		}
		cleanup = append(cleanup, func() { log.Info("stopping Temporal"); stopped(tmp.Stop()) })
		watch("the Temporal dev server", tmp.Process())
		cfg.Temporal.Address, uiURL = tmp.Address, tmp.UIURL
	}

	st, err := openStore(ctx, cfg, true)
	if err != nil {
		return err
	}
	cleanup = append(cleanup, st.Close)

	// The simulator runs here only when it is the provider: with KASA_PROVIDER_URL at another bank
	// (kasa bench runs `kasa banksim` apart, to measure kasa's CPU alone), none is started.
	if cfg.Provider.URL == cfg.SimulatorURL() {
		sim, err := banksim.New(banksim.Options{DataDir: filepath.Join(dir, "banksim"), Capability: banksim.Capability(cfg.Provider.Capability), Logger: log})
		if err != nil {
			return err
		}
		cleanup = append(cleanup, func() { _ = sim.Close() })
		stopSim, err := serve(ctx, "banksim", cfg.Banksim.Addr, sim.Handler(), log)
		if err != nil {
			return err
		}
		cleanup = append(cleanup, stopSim)
	}

	tc, err := dialTemporal(ctx, cfg, log, false)
	if err != nil {
		return err
	}
	cleanup = append(cleanup, tc.Close)
	// As kasa migrate does: a Temporal of the user's own may lack them (the dev server has them).
	if err := migrateSearchAttributes(ctx, cfg, log); err != nil {
		return err
	}
	// Pointed at a deployment's database, kasa dev joins its workers, and never with other money
	// settings than the live ones. On a database of its own it is the only worker, and a restart
	// with other settings must not wait for its own last report to age.
	if joined {
		if err := st.ClaimWorkerPolicy(ctx, cfg.Temporal.TaskQueue, workerPolicy(cfg), policyLive); err != nil && claimPolicy {
			return err
		}
	}
	w := worker.New(tc, cfg.Temporal.TaskQueue, newActivities(cfg, st), func(err error) {
		select {
		case died <- fmt.Errorf("the worker stopped polling (%w)", err):
		default:
		}
	})
	if err := w.Start(); err != nil {
		return err
	}
	changed := make(chan error, 1)
	cleanup = append(cleanup, w.Stop, startPolicyReport(ctx, cfg, st, log, func(err error) {
		select {
		case changed <- err:
		default:
		}
	}))

	// One registry: the API's /metrics shows the relay's and the webhooks' figures too, on the
	// API's port unless KASA_METRICS_ADDR names a listener (a developer's machine, not production).
	if cfg.Metrics.Addr == "" {
		cfg.Metrics.Addr = config.MetricsOnAPI
	}
	reg := prometheus.NewRegistry()
	stopEvents, err := startEvents(ctx, cfg, st, reg, log)
	if err != nil {
		return err
	}
	cleanup = append(cleanup, stopEvents)

	srv := newAPI(cfg, st, tc, reg, log, true)
	stopAPI, err := serveAPI(ctx, cfg, srv, log)
	if err != nil {
		return err
	}
	cleanup = append(cleanup, stopAPI, followRetentions(ctx, srv, st), startSweeper(ctx, cfg, st, tc, reg, log), startLedgerCheck(ctx, cfg, st, reg, log),
		startRecordRetention(ctx, cfg, st, reg, log))

	if err := state.seedDemo(ctx, st, cfg); err != nil {
		return fmt.Errorf("seed demo merchant: %w", err)
	}
	if err := saveState(statePath, state); err != nil {
		return err
	}
	printBanner(cfg, state, uiURL)
	select {
	case <-ctx.Done():
		log.Info("shutting down: stopping every child process")
		return nil
	case err := <-changed:
		return fmt.Errorf("stopping everything: the deployment's money settings changed while this worker did not report: %w", err)
	case err := <-died:
		return fmt.Errorf("%w: stopping everything; run kasa dev again, the data is kept", err)
	}
}

// seedDemo creates, once, a demo merchant with a TRY account funded with 10,000.00 TRY, and
// notes where this run's servers are.
func (s *devState) seedDemo(ctx context.Context, st *store.Store, cfg config.Config) error {
	s.DatabaseURL, s.TemporalAddress = cfg.Database.URL, cfg.Temporal.Address
	if s.DemoAccountID != uuid.Nil {
		if _, err := st.Account(ctx, s.DemoAccountID); err == nil {
			return nil
		}
	}
	m := payment.Merchant{ID: payment.NewID(), Name: "Demo Merchant"}
	apiKey := payment.NewSecret("sk_")
	if err := st.CreateMerchant(ctx, m, apiKey, payment.NewSecret("whsec_")); err != nil {
		return err
	}
	a, err := st.CreateAccount(ctx, m.ID, "TRY")
	if err != nil {
		return err
	}
	if _, _, err := st.Deposit(ctx, a.ID, "demo-seed", 1_000_000); err != nil {
		return err
	}
	s.DemoMerchantID, s.DemoAPIKey, s.DemoAccountID = m.ID, apiKey, a.ID
	return nil
}

func printBanner(cfg config.Config, s devState, uiURL string) {
	api := "http://" + cfg.API.Addr
	fmt.Printf(`
kasa is running.  Ctrl-C stops everything.

  API            %s   (/healthz /readyz /metrics)
  Temporal UI    %s
  Unknown        %s
  Temporal       %s   namespace %s, task queue %s
  Provider       %s   (capability %s)
  PostgreSQL     %s
  Admin token    %s
  Demo merchant  %s   API key %s
  Demo account   %s   (10000.00 TRY deposited)

Pay 100.00 TRY with the demo merchant:

  curl -sS -X POST %s/v1/payments \
    -H 'Authorization: Bearer %s' \
    -H "Idempotency-Key: demo-$(date +%%s)" \
    -H 'Content-Type: application/json' \
    -d '{"invoice_id": "inv-'$(date +%%s)'", "amount": "100.00", "currency": "TRY", "account_id": "%s"}'

  curl -sS %s/v1/accounts/%s -H 'Authorization: Bearer %s'

`, api, cmp.Or(uiURL, "- (external Temporal: use its own UI)"), unknownList(uiURL, cfg.Temporal.Namespace), cfg.Temporal.Address, cfg.Temporal.Namespace, cfg.Temporal.TaskQueue,
		cfg.Provider.URL, cfg.Provider.Capability, cfg.Database.URL, cfg.Admin.Token,
		s.DemoMerchantID, s.DemoAPIKey, s.DemoAccountID,
		api, s.DemoAPIKey, s.DemoAccountID, api, s.DemoAccountID, s.DemoAPIKey)
}

// unknownList is the Web UI's list of the payments parked as unknown (docs/reconciliation.md):
// add the PaymentSummary column there once to see what each is.
func unknownList(uiURL, namespace string) string {
	if uiURL == "" {
		return "-"
	}
	return uiURL + "/namespaces/" + url.PathEscape(namespace) + "/workflows?query=" + url.QueryEscape(workflows.UnknownList) +
		"   (add the PaymentSummary column)"
}

// relaxGC makes this process collect at devenv.RelaxedGOGC unless GOGC is set: on live heaps of
// tens of MB, collecting a quarter as often lowers the payments' tail (docs/performance.md).
func relaxGC() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(devenv.RelaxedGOGC)
	}
}

// shareCores runs kasa dev's Go code on half the machine's cores (at least one) unless GOMAXPROCS
// is set, leaving the rest to the PostgreSQL and Temporal it starts; the scheduler then spins less
// for work (on 2 cores, ~8% less CPU per payment, no slower: docs/performance.md).
func shareCores(cpus int) {
	if _, set := os.LookupEnv("GOMAXPROCS"); !set {
		runtime.GOMAXPROCS(max(cpus/2, 1))
	}
}
