// Package harness is `kasa bench`: it starts a throwaway kasa (a `kasa dev` child process on free
// ports with its own data directory, so nothing of the user's is touched), measures it with
// package bench, checks that it stayed correct, and writes the results.
package harness

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/prometheus/procfs"
	"go.temporal.io/sdk/client"

	"github.com/kasa-pay/kasa/bench"
)

// Config is what the measured kasa takes over from the caller's configuration.
type Config struct {
	Capability string // KASA_PROVIDER_CAPABILITY
	MaxConns   int32  // KASA_DATABASE_MAX_CONNS
	Gzip       bool   // KASA_TEMPORAL_GZIP
	// Dial connects to the child's Temporal frontend for the ceilings, as kasa's own clients do.
	Dial func(ctx context.Context, address string) (client.Client, error)
}

var (
	ErrUsage     = errors.New("usage")       // the command line was wrong (exit 2)
	ErrIncorrect = errors.New("not correct") // a payment charged twice or an invariant broken (exit 1)
)

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "kasa bench: "+format+"\n", args...)
}

// Main runs `kasa bench` with its arguments: one run, or the standard suite (--suite).
func Main(ctx context.Context, args []string, cfg Config) (err error) {
	var o bench.Options
	fs := flag.NewFlagSet("kasa bench", flag.ContinueOnError)
	suite := fs.Bool("suite", false, "run the standard suite (ceilings, targets, correctness) and write its results")
	out := fs.String("out", "bench/results", "--suite: directory for <date>.md and <date>.json")
	fs.DurationVar(&o.Duration, "duration", 15*time.Second, "measured window of each run")
	fs.DurationVar(&o.Warmup, "warmup", 3*time.Second, "load before each window, not measured")
	fs.IntVar(&o.Concurrency, "concurrency", 16, "clients of each closed-loop run")
	fs.IntVar(&o.Merchants, "merchants", 1000, "merchants, each with its own settlement account (1: one hot account)")
	fs.IntVar(&o.Payers, "payers", 1, "one run: payer accounts per merchant")
	fs.Float64Var(&o.Duplicates, "duplicates", 0.05, "share of requests that retry an earlier key (some in parallel)")
	fs.Float64Var(&o.Insufficient, "insufficient", 0.05, "share of new payments the payer cannot afford")
	fs.IntVar(&o.Preload, "preload", 0, "--suite: load this many stored payments and idempotency records for the large-table runs")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return ErrUsage
	}
	st, err := startStack(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() { st.stop(err != nil) }()
	o.APIURL, o.AdminToken, o.CPU, o.Progress = st.APIURL, st.AdminToken, st.CPU, progress
	if *suite {
		return runSuite(ctx, st, o, *out, cfg.Capability)
	}
	progress("setting up %d merchant(s) with %d payer(s) each", o.Merchants, o.Payers)
	fx, err := bench.Setup(ctx, o)
	if err != nil {
		return err
	}
	if err := st.Settle(ctx); err != nil {
		return err
	}
	res, err := bench.Run(ctx, o, fx)
	if err != nil {
		return err
	}
	v, err := st.Check(ctx, res.Payments)
	if err != nil {
		return err
	}
	fmt.Print(bench.Markdown("kasa bench", res))
	return verdict(v)
}

// verdict says whether the runs were correct, and is ErrIncorrect when they were not.
func verdict(v bench.Verdict) error {
	if !v.Correct {
		progress("NOT correct: %d double charge(s), invariant violations: %v", v.Doubles, v.Problems)
		return ErrIncorrect
	}
	progress("correct: no double charge, kasa verify ok")
	return nil
}

// runSuite runs the standard suite and writes its report to out/<date>.md and .json.
func runSuite(ctx context.Context, st *stack, o bench.Options, out, capability string) error {
	o.Payers = 0 // one run's flag, which the suite does not read
	rep, err := bench.RunSuite(ctx, st.Stack, o)
	if err != nil {
		return err
	}
	rep.Machine, rep.Commit, rep.Capability = machine(), commit(), capability
	js, err := json.MarshalIndent(rep, "", "  ")
	base := filepath.Join(out, rep.Started.Format("2006-01-02"))
	if err = errors.Join(err, os.MkdirAll(out, 0o755)); err == nil {
		err = errors.Join(os.WriteFile(base+".md", []byte(bench.SuiteMarkdown(rep)), 0o644), os.WriteFile(base+".json", append(js, '\n'), 0o644))
	}
	if err != nil {
		return err
	}
	progress("wrote %s.md and .json", base)
	return verdict(rep.Verdict)
}

func machine() string {
	mem := ""
	if fs, err := procfs.NewDefaultFS(); err == nil {
		if m, err := fs.Meminfo(); err == nil && m.MemTotal != nil {
			mem = fmt.Sprintf(", %d GiB", (*m.MemTotal+1<<19)>>20)
		}
	}
	return fmt.Sprintf("%s/%s, %d cores%s, %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), mem, runtime.Version())
}

// commit is the VCS revision the binary was built from (go build records it).
func commit() string {
	rev, dirty := "unknown", ""
	info, ok := debug.ReadBuildInfo()
	for i := 0; ok && i < len(info.Settings); i++ {
		switch s := info.Settings[i]; {
		case s.Key == "vcs.revision" && len(s.Value) >= 12:
			rev = s.Value[:12]
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = "+changes"
		}
	}
	return rev + dirty
}
