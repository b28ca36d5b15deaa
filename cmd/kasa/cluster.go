//go:build !production

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kasa-pay/kasa/config"
	"github.com/kasa-pay/kasa/tools/devenv"
	"github.com/kasa-pay/kasa/worker"
)

// clusterState is what `kasa cluster` keeps between runs (data dir/cluster/cluster.json): the
// credentials, the demo merchant and the ports, so that a restart finds them again.
type clusterState struct {
	devState
	TemporalPort int `json:"temporal_port"`
	UIPort       int `json:"ui_port"`
}

// stopTimeout bounds a child's graceful stop before it is killed: a worker's in-flight bank
// calls are given their time.
const stopTimeout = worker.StopTimeout + 5*time.Second

// runCluster runs the system as separate processes on a real Temporal Server: PostgreSQL, the
// Temporal Server (and its Web UI when built), NATS, then kasa migrate, banksim, two workers, two
// APIs and the relay, each a child of this process, until SIGINT/SIGTERM. A child that dies once
// the cluster has started is reported and started again; one killed on stop fails the run.
func runCluster(ctx context.Context, cfg config.Config, log *slog.Logger) (err error) {
	cfg = onSimulator(cfg) // its workers are told the bank explicitly (KASA_PROVIDER_URL below)
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	natsBin, err := devenv.FindTool("nats-server", "nats-server")
	if err != nil {
		return err
	}
	root, err := filepath.Abs(cfg.Data.Dir)
	if err != nil {
		return err
	}
	// Beside `kasa dev`'s data, not in it: the two never share a database or a Temporal.
	dir := filepath.Join(root, "cluster")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	unlock, err := devenv.LockDir(filepath.Join(dir, "cluster.lock"), "kasa cluster")
	if err != nil {
		return err
	}
	defer unlock()
	// A process already on one of these addresses would answer for the child that fails to bind
	// it: refused before anything starts (a previous launcher's children are given time to go).
	if err := devenv.WaitAddrFree(ctx, cfg.Banksim.Addr, "KASA_BANKSIM_ADDR", cfg.API.Addr, "KASA_API_ADDR"); err != nil {
		return err
	}
	statePath := filepath.Join(dir, "cluster.json")
	var state clusterState
	if b, err := os.ReadFile(statePath); err == nil {
		if err := json.Unmarshal(b, &state); err != nil {
			return fmt.Errorf("read %s: %w", statePath, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if cfg.Admin.Token == "" {
		if state.AdminToken == "" {
			state.AdminToken = "adm_" + randomHex(16)
		}
		cfg.Admin.Token = state.AdminToken
	}
	// Its APIs refuse tokens anyone could guess (kasa api): refused here, before anything starts
	// around them.
	if err := cfg.CheckAdminToken(); err != nil {
		return err
	}
	if cfg.Secret.Key == "" {
		if state.SecretKey == "" {
			state.SecretKey = randomHex(32)
		}
		cfg.Secret.Key = state.SecretKey
	}
	began := time.Now()
	// A port kept from the last run when it is still free, so bookmarks keep working.
	port := func(last int) (int, error) {
		if last != 0 && portFree(last) {
			return last, nil
		}
		return devenv.FreePort()
	}

	var cleanup []func() error
	defer func() {
		for i := len(cleanup) - 1; i >= 0; i-- {
			err = errors.Join(err, cleanup[i]())
		}
	}()
	sup := devenv.NewSupervisor(filepath.Join(dir, "logs"), log)
	sup.Restart = &devenv.DefaultBackoff

	var pg *devenv.Postgres
	if cfg.Database.URL == "" {
		p, err := port(state.PostgresPort)
		if err != nil {
			return err
		}
		if pg, err = devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: filepath.Join(dir, "postgres"), Port: p, Logger: log, Restart: sup.Restart}); err != nil {
			return err
		}
		cleanup = append(cleanup, func() error { log.Info("stopping PostgreSQL"); return pg.Stop() })
		cfg.Database.URL, state.PostgresPort = pg.URL, pg.Port
	}
	uiURL := "- (run `make temporal-ui` for the Web UI)"
	if cfg.Temporal.Address == "" {
		if pg == nil {
			return errors.New("kasa cluster runs its Temporal Server on the PostgreSQL it starts: " +
				"with KASA_DATABASE_URL set, set KASA_TEMPORAL_ADDRESS too")
		}
		if state.TemporalPort, err = port(state.TemporalPort); err != nil {
			return err
		}
		ts, err := devenv.StartTemporalServer(ctx, pg, devenv.TemporalServerOptions{
			Dir: filepath.Join(dir, "temporal"), Port: state.TemporalPort, Namespace: cfg.Temporal.Namespace, Logger: log, Restart: sup.Restart})
		if err != nil {
			return err
		}
		cleanup = append(cleanup, func() error { log.Info("stopping the Temporal Server"); return ts.Stop() })
		cfg.Temporal.Address = ts.Address()
		if uiBin, err := devenv.FindTool("temporal-ui", "temporal-ui"); err == nil {
			if state.UIPort, err = port(state.UIPort); err != nil {
				return err
			}
			ui, err := devenv.StartUI(ctx, sup, uiBin, filepath.Join(dir, "ui"), cfg.Temporal.Address, cfg.Temporal.Namespace, state.UIPort)
			if err != nil {
				return err
			}
			cleanup = append(cleanup, func() error { return sup.StopAll(stopTimeout, []*devenv.Child{ui}) })
			uiURL = fmt.Sprintf("http://127.0.0.1:%d", state.UIPort)
		} else {
			log.Warn("no Temporal Web UI", "error", err)
		}
	} else {
		uiURL = "- (external Temporal: use its own UI)"
	}

	natsPort, err := devenv.FreePort()
	if err != nil {
		return err
	}
	natsMonitor, err := devenv.FreePort()
	if err != nil {
		return err
	}
	nats, err := devenv.StartNATS(ctx, sup, natsBin, filepath.Join(dir, "nats"), natsPort, natsMonitor)
	if err != nil {
		return err
	}
	cleanup = append(cleanup, func() error { return sup.StopAll(stopTimeout, []*devenv.Child{nats}) })
	natsURL := fmt.Sprintf("nats://127.0.0.1:%d", natsPort)

	// Every child gets the developer's settings, then what this cluster decided. Listeners a
	// developer may have set for one process are turned off (an empty value would mean the
	// default): two children would fight over them. Each worker and the relay get their own below.
	env := func(vars ...string) []string {
		return append(os.Environ(), append([]string{
			"KASA_DATA_DIR=" + dir,
			"KASA_DATABASE_URL=" + cfg.Database.URL,
			"KASA_TEMPORAL_ADDRESS=" + cfg.Temporal.Address,
			"KASA_ADMIN_TOKEN=" + cfg.Admin.Token,
			"KASA_SECRET_KEY=" + cfg.Secret.Key,
			"KASA_PROVIDER_URL=" + cfg.Provider.URL,
			"KASA_PROVIDER_CAPABILITY=" + cfg.Provider.Capability,
			"KASA_BANKSIM_ADDR=" + cfg.Banksim.Addr,
			"KASA_NATS_URL=" + natsURL,
			"KASA_DEBUG_PPROF_ADDR=" + config.MetricsOff, "KASA_METRICS_ADDR=" + config.MetricsOnAPI,
			"KASA_WORKER_METRICS_ADDR=" + config.MetricsOff, "KASA_RELAY_METRICS_ADDR=" + config.MetricsOff,
		}, vars...)...)
	}
	if err := sup.Run(ctx, "migrate", env(), exe, "migrate"); err != nil {
		return err
	}

	var kasaProcs []*devenv.Child
	start := func(name string, env []string, args ...string) (*devenv.Child, error) {
		c, err := sup.Start(name, env, exe, args...)
		if err == nil {
			kasaProcs = append(kasaProcs, c)
		}
		return c, err
	}
	// The APIs stop first (no new payments), then the workers and the relay, the simulator last.
	var apis, backend, sim []*devenv.Child
	cleanup = append(cleanup, func() error {
		log.Info("stopping the kasa processes")
		return sup.StopAll(stopTimeout, apis, backend, sim)
	})
	bs, err := start("banksim", env(), "banksim")
	if err != nil {
		return err
	}
	sim = append(sim, bs)
	apiAddrs := []string{cfg.API.Addr}
	freeAddr := func() (string, error) {
		p, err := devenv.FreePort()
		return "127.0.0.1:" + strconv.Itoa(p), err
	}
	second, err := freeAddr()
	if err != nil {
		return err
	}
	apiAddrs = append(apiAddrs, second)
	var metrics []string
	// On a database of its own the cluster is the whole deployment: its workers' money settings
	// are the deployment's, whatever an earlier run of it used (make run-cluster honours
	// KASA_PROVIDER_CAPABILITY). On a deployment's database they join its workers' settings.
	workerArgs := []string{"worker"}
	if pg != nil {
		workerArgs = append(workerArgs, "--change-money-settings")
	}
	for i := 1; i <= 2; i++ {
		addr, err := freeAddr()
		if err != nil {
			return err
		}
		w, err := start(fmt.Sprintf("worker-%d", i), env("KASA_WORKER_METRICS_ADDR="+addr), workerArgs...)
		if err != nil {
			return err
		}
		backend = append(backend, w)
		metrics = append(metrics, fmt.Sprintf("worker-%d http://%s/metrics", i, addr))
	}
	relayAddr, err := freeAddr()
	if err != nil {
		return err
	}
	relay, err := start("relay", env("KASA_RELAY_METRICS_ADDR="+relayAddr), "relay")
	if err != nil {
		return err
	}
	backend = append(backend, relay)
	metrics = append(metrics, fmt.Sprintf("relay http://%s/metrics", relayAddr))
	for i, addr := range apiAddrs {
		a, err := start(fmt.Sprintf("api-%d", i+1), env("KASA_API_ADDR="+addr), "api")
		if err != nil {
			return err
		}
		apis = append(apis, a)
	}

	// Ready when every API is, or not at all: a child that dies on the way ends the start.
	readyCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := devenv.WaitHTTP(readyCtx, "http://"+cfg.Banksim.Addr+"/_sim/healthz", bs); err != nil && ctx.Err() == nil {
		return err
	}
	for i, a := range apis {
		if err := devenv.WaitHTTP(readyCtx, "http://"+apiAddrs[i]+"/readyz", a); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	st, err := openStore(ctx, cfg, false)
	if err != nil {
		return err
	}
	err = seedDemo(ctx, st, &state.devState)
	st.Close()
	if err != nil {
		return fmt.Errorf("seed demo merchant: %w", err)
	}
	state.DatabaseURL, state.TemporalAddress = cfg.Database.URL, cfg.Temporal.Address
	if err := saveClusterState(statePath, state); err != nil {
		return err
	}
	log.Info("kasa cluster ready", "took", time.Since(began).Round(time.Millisecond))
	printClusterBanner(cfg, state, apiAddrs, uiURL, natsURL, metrics, kasaProcs, sup.LogDir)

	<-ctx.Done()
	log.Info("shutting down: stopping every child process")
	return nil
}

func saveClusterState(path string, s clusterState) error {
	b, _ := json.MarshalIndent(s, "", "  ")
	return os.WriteFile(path, b, 0o600)
}

func printClusterBanner(cfg config.Config, s clusterState, apis []string, uiURL, natsURL string, metrics []string, procs []*devenv.Child, logDir string) {
	var apiLines, pids []string
	for i, a := range apis {
		apiLines = append(apiLines, fmt.Sprintf("  API %d          http://%s   (/healthz /readyz /metrics)", i+1, a))
	}
	for _, p := range procs {
		pids = append(pids, fmt.Sprintf("%s %d", p.Name, p.PID()))
	}
	api := "http://" + apis[0]
	fmt.Printf(`
kasa cluster is running.  Ctrl-C stops everything.

%s
  Temporal UI    %s
  Temporal       %s   (Temporal Server on PostgreSQL, SQL visibility) namespace %s, task queue %s
  NATS           %s   (JetStream)
  Bank simulator http://%s   (capability %s)
  PostgreSQL     %s
  Metrics        %s
  Processes      %s
  Logs           %s
  Admin token    %s
  Demo merchant  %s   API key %s
  Demo account   %s   (10000.00 TRY deposited)

Pay 100.00 TRY with the demo merchant, then replay it on the other API:

  key=demo-$(date +%%s)
  for api in %s; do
    curl -sS -X POST $api/v1/payments \
      -H 'Authorization: Bearer %s' \
      -H "Idempotency-Key: $key" \
      -H 'Content-Type: application/json' \
      -d '{"invoice_id": "inv-'$key'", "amount": "100.00", "currency": "TRY", "account_id": "%s"}'; echo
  done

  curl -sS %s/v1/accounts/%s -H 'Authorization: Bearer %s'

`, strings.Join(apiLines, "\n"), uiURL, cfg.Temporal.Address, cfg.Temporal.Namespace, cfg.Temporal.TaskQueue,
		natsURL, cfg.Banksim.Addr, cfg.Provider.Capability, cfg.Database.URL, strings.Join(metrics, ", "),
		strings.Join(pids, ", "), logDir, cfg.Admin.Token, s.DemoMerchantID, s.DemoAPIKey, s.DemoAccountID,
		"http://"+strings.Join(apis, " http://"), s.DemoAPIKey, s.DemoAccountID, api, s.DemoAccountID, s.DemoAPIKey)
}
