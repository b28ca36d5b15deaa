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
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/procfs"
	"go.temporal.io/sdk/client"

	"github.com/kasa-pay/kasa/tools/bench"
	"github.com/kasa-pay/kasa/tools/devenv"
	"github.com/kasa-pay/kasa/tools/kasaapi"
)

// Config is what the measured kasa takes over from the caller's configuration.
type Config struct {
	Capability string // KASA_PROVIDER_CAPABILITY
	MaxConns   int32  // KASA_DATABASE_MAX_CONNS
	Gzip       bool   // KASA_TEMPORAL_GZIP
	// Dial connects to the child's Temporal frontend for the ceilings, as kasa's own clients do.
	Dial func(ctx context.Context, address string) (client.Client, error)
	// Binary is the kasa run as `kasa dev`; default this executable.
	Binary string
}

// The Temporal a stack runs on (--temporal).
const (
	TemporalDev    = "dev"    // the CLI's dev server, started by kasa dev
	TemporalServer = "server" // the real Temporal Server on PostgreSQL, started by the harness
)

// How the measured kasa runs (--kasa): the command the harness starts.
const (
	// TopologyDev is kasa dev: one process whose API hosts the worker, so a payment starts
	// eagerly and runs its local steps in one workflow task handed back with the start.
	TopologyDev = "dev"
	// TopologyCluster is kasa cluster: two kasa api (the bench loads one), two kasa worker, the
	// relay with NATS and the bank simulator as processes of their own, as deployed. The API
	// hosts no worker: the start is not eager, and the API awaits the workflow's result.
	TopologyCluster = "cluster"
)

var (
	ErrUsage     = errors.New("usage")       // the command line was wrong (exit 2)
	ErrIncorrect = errors.New("not correct") // a payment charged twice or an invariant broken (exit 1)
)

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "kasa bench: "+format+"\n", args...)
}

// Main runs `kasa bench` with its arguments: one run, the standard suite (--suite), or a payday
// (--payday).
func Main(ctx context.Context, args []string, cfg Config) (err error) {
	var o bench.Options
	fs := flag.NewFlagSet("kasa bench", flag.ContinueOnError)
	suite := fs.Bool("suite", false, "run the standard suite (ceilings, targets, correctness) and write its results")
	out := fs.String("out", "bench/results", "--suite: directory for <date>.md and <date>.json; one run, if given: for <date>-run.md and .json")
	fs.DurationVar(&o.Duration, "duration", 15*time.Second, "measured window of each run")
	fs.DurationVar(&o.Warmup, "warmup", 3*time.Second, "load before each window, not measured")
	fs.IntVar(&o.Concurrency, "concurrency", 16, "clients of each closed-loop run")
	fs.IntVar(&o.Merchants, "merchants", 1000, "merchants, each with its own settlement account (1: one hot account)")
	fs.IntVar(&o.Payers, "payers", 1, "one run: payer accounts per merchant")
	fs.Float64Var(&o.Duplicates, "duplicates", 0.05, "share of requests that retry an earlier key (some in parallel)")
	fs.Float64Var(&o.Insufficient, "insufficient", 0.05, "share of new payments the payer cannot afford")
	fs.Float64Var(&o.RefundShare, "refund-share", 0, fmt.Sprintf("share of operations (0 to below 1) that refund a quarter of a payment that succeeded earlier in the run; "+
		"--suite: of its %q run only, default %.1f", bench.RunRefundMix, bench.SuiteRefundShare))
	fs.Float64Var(&o.ManualShare, "manual-share", 0, fmt.Sprintf("share of new payments (0 to below 1) created with capture manual, each then captured in part or (1 in 4) canceled; "+
		"--suite: of its %q run only, default %.1f", bench.RunManualMix, bench.SuiteManualShare))
	fs.IntVar(&o.Preload, "preload", 0, "--suite: load this many stored payments and idempotency records for the large-table runs")
	temporal := fs.String("temporal", TemporalDev, "the Temporal kasa runs on: dev (the CLI's dev server) or server (the real Temporal Server on PostgreSQL)")
	topology := fs.String("kasa", TopologyDev, "how kasa runs: dev (one process, the worker in the API's) or cluster (kasa cluster: APIs and workers apart; needs --temporal=server)")
	cpuProfile := fs.String("cpuprofile", "", "one run with --kasa dev: write a CPU profile of the measured kasa dev over the measured window to this file "+
		"(fetched from its /debug/pprof/ on a loopback port of its own; see `go tool pprof -top kasa FILE`)")
	payday := fs.Bool("payday", false, fmt.Sprintf("a payday: T and the accept transaction's P, then an open loop offering %d × T for --duration, then nothing until every payment is final; writes <date>-payday.{md,json} to --out", bench.PaydayFactor))
	drainFor := fs.Duration("drain-for", 30*time.Minute, "--payday: how long the last payment may take to be final after the burst")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return ErrUsage
	}
	usage := func(format string, args ...any) error {
		fmt.Fprintf(fs.Output(), "kasa bench: "+format+"\n", args...)
		return ErrUsage
	}
	switch {
	case o.RefundShare < 0 || o.RefundShare >= 1:
		return usage("--refund-share is from 0 to below 1, not %v", o.RefundShare)
	case o.ManualShare < 0 || o.ManualShare >= 1:
		return usage("--manual-share is from 0 to below 1, not %v", o.ManualShare)
	case *temporal != TemporalDev && *temporal != TemporalServer:
		return usage("--temporal is dev or server, not %q", *temporal)
	case (*topology != TopologyDev && *topology != TopologyCluster) || (*topology == TopologyCluster && *temporal != TemporalServer):
		return usage("--kasa is dev or cluster (with --temporal=server), not %q", *topology)
	case *payday && *suite:
		return usage("--payday is a run of its own: not with --suite")
	case *cpuProfile != "" && (*suite || *payday || *topology != TopologyDev):
		return usage("--cpuprofile profiles one run of kasa dev: not with --suite, --payday or --kasa cluster")
	}
	o.Progress = progress
	var env []string
	if *payday {
		// The start backlog as deployed, each API running at most 32 payments at once, but with
		// no bound: the run measures how fast a burst is taken and drained, not the refusals
		// (tests check the bound).
		env = []string{"KASA_BACKLOG_API_RUNNING=32", "KASA_API_MERCHANT_SHARE=0.5", "KASA_BACKLOG_MAX_WAIT=0", "KASA_BACKLOG_MAX_QUEUED=0"}
	}
	st, err := startStack(ctx, cfg, *temporal, *topology, *cpuProfile != "", env...)
	if err != nil {
		return err
	}
	defer func() { st.stop(err != nil) }()
	// keep completes a report's header, writes the report to --out, and says whether it was correct.
	keep := func(h *bench.Header, suffix string, markdown func() string, rep any, v bench.Verdict) error {
		h.Machine, h.Commit, h.Capability = machine(), commit(), cfg.Capability
		if err := writeReport(*out, h.Started, suffix, markdown(), rep); err != nil {
			return err
		}
		return verdict(v)
	}
	o.APIURL, o.AdminToken, o.CPU, o.Counters = st.APIURL, st.AdminToken, st.CPU, st.Counters
	if *suite {
		o.Payers = 0 // one run's flag, which the suite does not read
		rep, err := bench.RunSuite(ctx, st.Stack, o)
		if err != nil {
			return err
		}
		return keep(&rep.Header, "", func() string { return bench.SuiteMarkdown(rep) }, rep, rep.Verdict)
	}
	if *payday {
		o.Payers = 1 // one run's flag: the payday's merchants have one payer each
	}
	progress("setting up %d merchant(s) with %d payer(s) each", o.Merchants, o.Payers)
	fx, err := bench.Setup(ctx, o)
	if err != nil {
		return err
	}
	if err := st.Settle(ctx); err != nil {
		return err
	}
	if *payday {
		p, err := bench.RunPayday(ctx, st.Stack, fx, o, *drainFor)
		if err != nil {
			return err
		}
		return keep(&p.Header, "-payday", func() string { return bench.PaydayMarkdown(p) }, p, p.Verdict)
	}
	started := time.Now()
	profiled := make(chan error, 1)
	if *cpuProfile != "" {
		go func() { profiled <- fetchProfile(ctx, st.pprofURL, *cpuProfile, o.Warmup, o.Duration) }()
	}
	res, err := bench.Run(ctx, o, fx)
	if err != nil {
		return err
	}
	if *cpuProfile != "" {
		if err := <-profiled; err != nil {
			return err
		}
		progress("wrote the CPU profile of kasa dev's measured window to %s", *cpuProfile)
	}
	v, err := st.Check(ctx, res.Payments, res.RefundsSeen, res.ManualSeen)
	if err != nil {
		return err
	}
	text := bench.RunText(res)
	fmt.Print(text)
	explicit := false
	fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "out" })
	if !explicit { // only a run given --out is worth keeping, beside the suites' reports
		return verdict(v)
	}
	rep := &bench.RunReport{Header: bench.Header{Started: started.UTC(), Options: o}, Run: res, Verdict: v}
	return keep(&rep.Header, "-run", func() string { return bench.RunMarkdown(*rep, text) }, rep, v)
}

// StorePath is `kasa bench --store-path` (bench.StorePath); it writes <date>-store-path.md and
// .json to --out.
func StorePath(ctx context.Context, args []string, _ Config) error {
	var o bench.StorePathOptions
	fs := flag.NewFlagSet("kasa bench --store-path", flag.ContinueOnError)
	fs.Bool("store-path", true, "kasa's store steps (Begin, Reserve, Finalize) with the event pipeline, without Temporal, beside pgbench P and M")
	out := fs.String("out", "bench/results", "directory for <date>-store-path.md and .json")
	fs.DurationVar(&o.Duration, "duration", 10*time.Second, "measured window of each run")
	fs.DurationVar(&o.Warmup, "warmup", 2*time.Second, "load before each store-path window, not measured")
	fs.IntVar(&o.Clients, "concurrency", 32, "goroutines running payments, and pgbench clients")
	merchants := fs.String("merchants", "1,1000", "merchant counts, one run each")
	pgbench := fs.Bool("pgbench", true, "also run pgbench P and M")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return ErrUsage
	}
	for _, s := range strings.Split(*merchants, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fmt.Fprintf(fs.Output(), "kasa bench: --merchants is a list of counts, not %q\n", *merchants)
			return ErrUsage
		}
		o.Merchants = append(o.Merchants, n)
	}
	o.PGBench, o.Progress = *pgbench, progress
	rep, err := bench.StorePath(ctx, o)
	if err != nil {
		return err
	}
	rep.Machine, rep.Commit = machine(), commit()
	md := bench.StorePathMarkdown(rep)
	fmt.Print(md)
	if err := writeReport(*out, rep.Started, "-store-path", md, rep); err != nil {
		return err
	}
	return verdict(bench.Verdict{Correct: rep.Correct, Problems: rep.Problems})
}

// writeReport writes a report as Markdown and JSON to dir/<date><suffix>.md and .json.
func writeReport(dir string, started time.Time, suffix, markdown string, report any) error {
	js, err := json.MarshalIndent(report, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	base := devenv.FreeBase(dir, started.Format("2006-01-02")+suffix)
	if err := errors.Join(os.WriteFile(base+".md", []byte(markdown), 0o644), os.WriteFile(base+".json", append(js, '\n'), 0o644)); err != nil {
		return err
	}
	progress("wrote %s.md and .json", base)
	return nil
}

// verdict says whether the runs were correct, and is ErrIncorrect when they were not.
func verdict(v bench.Verdict) error {
	if !v.Correct {
		progress("NOT correct: %d double charge(s), %d double refund(s), refund mismatches: %q, %d double authorization(s), manual payment mismatches: %q, invariant violations: %q",
			v.Doubles, v.RefundDoubles, v.RefundProblems, v.DoubleAuthorizations, v.ManualProblems, v.Problems)
		return ErrIncorrect
	}
	more := ""
	if v.RefundsChecked > 0 {
		more = fmt.Sprintf("; %d refunds each at the bank once if succeeded, never if failed, and in their payments' amount_refunded", v.RefundsChecked)
	}
	if v.ManualChecked > 0 {
		more += fmt.Sprintf("; %d manual payments each authorized at the bank at most once, captured there as kasa says", v.ManualChecked)
	}
	progress("correct: no double charge, kasa verify ok%s", more)
	return nil
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

// fetchProfile waits for the warmup, then writes the CPU profile of the window that follows,
// from the pprof server at base, to path.
func fetchProfile(ctx context.Context, base, path string, warmup, window time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(warmup):
	}
	secs := max(int(window.Round(time.Second)/time.Second), 1)
	a, err := kasaapi.Do(ctx, http.DefaultClient, http.MethodGet, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", base, secs), "", nil)
	if err == nil && a.Status != http.StatusOK {
		err = fmt.Errorf("%d: %s", a.Status, a.Body)
	}
	if err != nil {
		return fmt.Errorf("cpu profile: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, a.Body, 0o644)
}
