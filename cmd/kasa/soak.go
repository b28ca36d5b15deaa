//go:build !production

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/kasa-pay/kasa/config"
	"github.com/kasa-pay/kasa/tools/soak"
)

const soakUsage = `usage: kasa soak [--duration 10m] [--seed N] [--rate R] [--shape S] [--capability C] [--retention D] [--faults K,K] [--out DIR] [--dir DIR]

Runs kasa's processes (api, two workers, relay, banksim), PostgreSQL and Temporal under a steady
load of payments and refunds with duplicate retries while a seeded schedule of faults kills and restarts
them, makes the bank misbehave and degrades the network; then lets everything settle and checks
the invariants (docs/tools.md, "Chaos soak").

  --duration D     how long the load runs (default 10m)
  --seed N         the fault schedule's seed (default: from the clock; printed, replayable)
  --rate R         new payments per second (default 5)
  --shape S        dev (one api, the Temporal dev server, the relay's embedded broker) or cluster
                   (two apis, the real Temporal Server, a NATS server) (default: drawn from the seed)
  --capability C   the provider's capability: idempotent, inquiry or none (default: drawn from the seed)
  --retention D    KASA_IDEMPOTENCY_RETENTION of kasa's processes: 1s makes keys expire during the
                   run, 0 is kasa's default, 72h (default: drawn from the seed, 1s or 0)
  --faults K,K     the fault kinds drawn from (default all): kill_worker, kill_api, kill_relay,
                   restart_postgres, restart_temporal, bank_fault, net_fault, settings_split,
                   and in the cluster shape lose_broker
  --out DIR        where soak-<date>-<shape>.{md,json} go (default bench/results; "" for nowhere)
  --dir DIR        working directory, kept (default: a temporary one, removed after a clean run)

exit status: 0 every invariant held, 1 a violation (the report lists it), 2 usage or interrupted.
`

// runSoak is `kasa soak`, which lives in package soak.
func runSoak(ctx context.Context, cfg config.Config, _ *slog.Logger) error {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o := soak.Options{}
	fs.DurationVar(&o.Duration, "duration", 10*time.Minute, "")
	fs.Int64Var(&o.Seed, "seed", time.Now().UnixNano()%1_000_000, "")
	fs.Float64Var(&o.Rate, "rate", 5, "")
	fs.StringVar(&o.Shape, "shape", "", "")
	fs.StringVar(&o.Capability, "capability", "", "")
	fs.DurationVar(&o.Retention, "retention", -1, "")
	faults := fs.String("faults", "", "")
	fs.StringVar(&o.Out, "out", "bench/results", "")
	fs.StringVar(&o.Dir, "dir", "", "")
	if err := fs.Parse(os.Args[2:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Print(soakUsage)
			return nil
		}
		fmt.Fprintf(os.Stderr, "kasa soak: %v\n\n%s", err, soakUsage)
		return exitError(2)
	}
	refuse := func(format string, args ...any) error {
		fmt.Fprintf(os.Stderr, "kasa soak: "+format+"\n", args...)
		return exitError(2)
	}
	var err error
	if o.Kinds, err = soak.ParseKinds(*faults); err != nil {
		return refuse("%v", err)
	}
	if o.Retention > 0 && o.Retention < config.MinIdempotencyRetention {
		return refuse("--retention must be at least %s", config.MinIdempotencyRetention)
	}
	if o.Shape != "" && !slices.Contains(soak.Shapes, o.Shape) {
		return refuse("--shape must be one of %v", soak.Shapes)
	}
	if o.Capability != "" && !slices.Contains(config.Capabilities, o.Capability) {
		return refuse("--capability must be one of %v", config.Capabilities)
	}
	if o.Binary, err = os.Executable(); err != nil {
		return err
	}
	rep, err := soak.Run(ctx, o)
	switch {
	case errors.Is(err, soak.ErrInterrupted):
		fmt.Fprintln(os.Stderr, "kasa soak: interrupted; every process it started is stopped")
		return exitError(2)
	case err != nil:
		return err
	case rep.Violations > 0:
		fmt.Fprintf(os.Stderr, "kasa soak: %d violation(s); logs in %s; every key's requests in %s; run it again with:\n  %s\n",
			rep.Violations, rep.Dir, rep.HistoryFile(o.Out), rep.Replay)
		return exitError(1)
	}
	return nil
}
