//go:build !production

package main

import (
	"context"
	"errors"
	"log/slog"

	"github.com/kasa-pay/kasa/config"
	"github.com/kasa-pay/kasa/tools/banksim"
	"github.com/kasa-pay/kasa/tools/devenv"
)

// The developer tools (tools/): built into ./bin/kasa by make build, left out of a build with
// -tags production (the Docker image), so production carries only what it runs.
func init() {
	commands["dev"] = stoppedWhileStarting(runDev)
	commands["cluster"] = stoppedWhileStarting(runCluster)
	commands["banksim"] = runBanksim
	commands["bench"] = runBench
	commands["soak"] = runSoak
	workerBank = onSimulator
	toolHeadUsage = `  dev       run everything locally: PostgreSQL, Temporal dev server + UI, bank simulator, worker, relay, API
  cluster   run the same system as separate processes on a real Temporal Server (PostgreSQL persistence),
            NATS, two APIs and two workers (make run-cluster; docs/operations.md)
`
	toolUsage = `  banksim   run the bank simulator on KASA_BANKSIM_ADDR

  bench     [flags] measure a throwaway kasa (a "kasa dev" child on free ports): one load run, or
            --suite for the standard suite with ceilings, targets and correctness checks (make bench);
            "kasa bench -h" lists the flags
  soak      [flags] the chaos soak: every process under load and seeded faults, then the invariants (make soak)
`
}

func runBanksim(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	sim, err := banksim.New(banksim.Options{DataDir: cfg.Data.Dir + "/banksim", Capability: banksim.Capability(cfg.Provider.Capability), Logger: log})
	if err != nil {
		return err
	}
	defer sim.Close()
	stop, err := serve(ctx, "banksim", cfg.Banksim.Addr, sim.Handler(), log)
	if err != nil {
		return err
	}
	<-ctx.Done()
	sim.Release() // hanging requests would hold the shutdown to its timeout
	stop()
	return nil
}

// onSimulator charges the bank simulator on KASA_BANKSIM_ADDR unless KASA_PROVIDER_URL names
// another bank: kasa dev and kasa cluster start one, and the full build's kasa worker charges it,
// where the production build's refuses to start without KASA_PROVIDER_URL (config.ErrNoProvider).
func onSimulator(cfg config.Config) config.Config {
	if cfg.Provider.URL == "" {
		cfg.Provider.URL = cfg.SimulatorURL()
	}
	return cfg
}

// stoppedWhileStarting makes a launcher's stop (SIGINT, SIGTERM) before it finished starting a
// clean exit, as a stop afterwards is: what failed then failed because it was stopped. A child
// killed after its grace period is no such failure: the stop itself went wrong.
func stoppedWhileStarting(run func(context.Context, config.Config, *slog.Logger) error) func(context.Context, config.Config, *slog.Logger) error {
	return func(ctx context.Context, cfg config.Config, log *slog.Logger) error {
		err := run(ctx, cfg, log)
		if errors.Is(err, devenv.ErrKilled) {
			return err
		}
		return stoppedOr(ctx, log, err)
	}
}
