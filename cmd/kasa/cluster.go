//go:build !production

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
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
	unlock, err := lockLauncherDir(ctx, dir, "cluster.lock", "kasa cluster",
		cfg.Banksim.Addr, "KASA_BANKSIM_ADDR", cfg.API.Addr, "KASA_API_ADDR")
	if err != nil {
		return err
	}
	defer unlock()
	statePath := filepath.Join(dir, "cluster.json")
	var state clusterState
	if err := loadState(statePath, &state); err != nil {
		return err
	}
	state.credentials(&cfg)
	// Its APIs refuse tokens anyone could guess (kasa api): refused here, before anything starts
	// around them.
	if err := cfg.CheckAdminToken(); err != nil {
		return err
	}
	began := time.Now()

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
		p, err := keptPort(state.PostgresPort)
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
		if state.TemporalPort, err = keptPort(state.TemporalPort); err != nil {
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
			if state.UIPort, err = keptPort(state.UIPort); err != nil {
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
		return slices.Concat(os.Environ(), []string{
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
		}, vars)
	}
	if err := sup.Run(ctx, "migrate", env(), exe, "migrate"); err != nil {
		return err
	}

	// On a database of its own the cluster is the whole deployment: its workers' money settings
	// are the deployment's, whatever an earlier run of it used (make run-cluster honours
	// KASA_PROVIDER_CAPABILITY). On a deployment's database they join its workers' settings.
	workerArgs := []string{"worker"}
	if pg != nil {
		workerArgs = append(workerArgs, "--change-money-settings")
	}
	// The APIs stop first (no new payments), then the workers and the relay, the simulator last.
	var apis, backend, sim, kasaProcs []*devenv.Child
	cleanup = append(cleanup, func() error {
		log.Info("stopping the kasa processes")
		return sup.StopAll(stopTimeout, apis, backend, sim)
	})
	start := func(group *[]*devenv.Child, name string, vars []string, args ...string) error {
		c, err := sup.Start(name, env(vars...), exe, args...)
		if err == nil {
			*group, kasaProcs = append(*group, c), append(kasaProcs, c)
		}
		return err
	}
	freeAddr := func() (string, error) {
		p, err := devenv.FreePort()
		return "127.0.0.1:" + strconv.Itoa(p), err
	}
	if err := start(&sim, "banksim", nil, "banksim"); err != nil {
		return err
	}
	var metrics []string
	for _, name := range []string{"worker-1", "worker-2", "relay"} {
		addr, err := freeAddr()
		if err != nil {
			return err
		}
		setting, args := "KASA_WORKER_METRICS_ADDR=", workerArgs
		if name == "relay" {
			setting, args = "KASA_RELAY_METRICS_ADDR=", []string{"relay"}
		}
		if err := start(&backend, name, []string{setting + addr}, args...); err != nil {
			return err
		}
		metrics = append(metrics, name+" http://"+addr+"/metrics")
	}
	second, err := freeAddr()
	if err != nil {
		return err
	}
	apiAddrs := []string{cfg.API.Addr, second}
	for i, addr := range apiAddrs {
		if err := start(&apis, fmt.Sprintf("api-%d", i+1), []string{"KASA_API_ADDR=" + addr}, "api"); err != nil {
			return err
		}
	}

	// Ready when every API is, or not at all: a child that dies on the way ends the start.
	readyCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	urls := []string{"http://" + cfg.Banksim.Addr + "/_sim/healthz", "http://" + apiAddrs[0] + "/readyz", "http://" + apiAddrs[1] + "/readyz"}
	for i, c := range slices.Concat(sim, apis) {
		if err := devenv.WaitHTTP(readyCtx, urls[i], c); err != nil {
			return err
		}
	}
	st, err := openStore(ctx, cfg, false)
	if err != nil {
		return err
	}
	err = state.seedDemo(ctx, st, cfg)
	st.Close()
	if err != nil {
		return fmt.Errorf("seed demo merchant: %w", err)
	}
	if err := saveState(statePath, state); err != nil {
		return err
	}
	log.Info("kasa cluster ready", "took", time.Since(began).Round(time.Millisecond))
	printClusterBanner(cfg, state, apiAddrs, uiURL, natsURL, metrics, kasaProcs, sup.LogDir)

	<-ctx.Done()
	log.Info("shutting down: stopping every child process")
	return nil
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
