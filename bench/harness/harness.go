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
	"strings"
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

// Main runs `kasa bench` with its arguments.
func Main(ctx context.Context, args []string, cfg Config) (err error) {
	var o bench.Options
	fs := flag.NewFlagSet("kasa bench", flag.ContinueOnError)
	suite := fs.Bool("suite", false, "run the standard suite (ceilings, targets, correctness) and write its results")
	out := fs.String("out", "bench/results", "--suite: directory for <date>.md and <date>.json")
	fs.DurationVar(&o.Duration, "duration", 15*time.Second, "measured window of each run")
	fs.DurationVar(&o.Warmup, "warmup", 3*time.Second, "load before each window, not measured")
	fs.IntVar(&o.Concurrency, "concurrency", 16, "clients (closed loop), or the cap on requests in flight (open loop)")
	fs.Float64Var(&o.Rate, "rate", 0, "open loop: arrivals per second (0: closed loop)")
	fs.IntVar(&o.Merchants, "merchants", 1000, "merchants, each with its own settlement account (1: one hot account)")
	fs.IntVar(&o.Payers, "payers", 1, "payer accounts per merchant")
	fs.Float64Var(&o.DuplicateRatio, "duplicates", 0.05, "share of requests that retry an earlier key (some in parallel)")
	fs.Float64Var(&o.InsufficientShare, "insufficient", 0.05, "share of new payments the payer cannot afford")
	fs.StringVar(&o.Currency, "currency", "TRY", "one run: currency of the accounts and payments (TRY, USD, EUR, JPY or KWD)")
	amounts := fs.String("amounts", "1-100", `one run: payment amounts, uniform in MIN-MAX major units of --currency, e.g. "0.50-20.00"`)
	fs.StringVar(&o.Path, "path", "payments", `what one run drives: "payments", "replay", a raw path such as "/healthz", or "temporal:<shape>" (ceiling T, e.g. temporal:LLL+eager+search-attributes)`)
	preload := fs.Int("preload", 0, "load this many stored payments and idempotency records before measuring")
	faults := fs.String("faults", "", `bank simulator fault rules, as PUT /_sim/faults takes them, e.g. {"rules":[{"on":"charge","action":"delay","delay_ms":50}]}`)
	asJSON := fs.Bool("json", false, "one run: print its result as JSON")
	childPprof := fs.String("child-pprof", "", "serve the measured kasa dev child's /debug/pprof/ on this address, e.g. 127.0.0.1:6061")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return ErrUsage
	}
	var shape bench.Shape
	spec, isShape := strings.CutPrefix(o.Path, "temporal:")
	o.MinAmount, o.MaxAmount, err = bench.ParseAmounts(*amounts, o.Currency)
	if err == nil && isShape {
		shape, err = bench.ParseShape(spec)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if err == nil && *suite && (set["currency"] || set["amounts"]) {
		err = errors.New("--currency and --amounts shape one run; the standard suite (--suite) keeps its own")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kasa bench:", err)
		return ErrUsage
	}

	st, err := startStack(ctx, cfg, *childPprof)
	if err != nil {
		return err
	}
	defer func() {
		st.keep = err != nil
		st.stop()
	}()
	if *faults != "" {
		if err := putFaults(ctx, st.SimURL, *faults); err != nil {
			return err
		}
	}
	switch {
	case *suite:
		return runSuite(ctx, st, o, *preload, *out, cfg.Capability)
	case isShape:
		res, err := bench.WorkflowCeiling(ctx, st.Temporal, shape, o.Concurrency, o.Warmup, o.Duration, st.CPU)
		if err != nil {
			return err
		}
		return writeResult(res, *asJSON)
	}
	o.APIURL, o.AdminToken, o.CPU = st.APIURL, st.AdminToken, st.CPU
	var fx *bench.Fixture
	if !strings.HasPrefix(o.Path, "/") {
		progress("setting up %d merchant(s) with %d payer(s) each", o.Merchants, o.Payers)
		if fx, err = bench.Setup(ctx, o); err != nil {
			return err
		}
		if *preload > 0 {
			progress("preloading %d stored payments", *preload)
			err = st.Preload(ctx, fx.MerchantIDs(), *preload)
		} else {
			err = st.Settle(ctx)
		}
		if err != nil {
			return err
		}
	}
	res, err := bench.Run(ctx, o, fx)
	if err != nil {
		return err
	}
	_, doubles, problems, err := st.Check(ctx, res.Payments)
	if err != nil {
		return err
	}
	if err := writeResult(res, *asJSON); err != nil {
		return err
	}
	if doubles > 0 || len(problems) > 0 {
		progress("NOT correct: %d double charge(s), invariant violations: %v", doubles, problems)
		return ErrIncorrect
	}
	progress("correct: no double charge, kasa verify ok")
	return nil
}

// runSuite runs the standard suite and writes its report to out/<date>.md and .json.
func runSuite(ctx context.Context, st *stack, o bench.Options, preload int, out, capability string) error {
	rep, err := bench.RunSuite(ctx, st.Stack, bench.SuiteOptions{
		Duration: o.Duration, Warmup: o.Warmup, Concurrency: o.Concurrency, Merchants: o.Merchants,
		Duplicates: o.DuplicateRatio, Insufficient: o.InsufficientShare, Preload: preload, Progress: progress,
	})
	if err != nil {
		return err
	}
	rep.Machine, rep.Commit, rep.Capability = machine(), commit(), capability
	var md strings.Builder
	js, err := json.MarshalIndent(rep, "", "  ")
	if err == nil {
		err = bench.WriteSuiteMarkdown(&md, rep)
	}
	base := filepath.Join(out, rep.Started.Format("2006-01-02"))
	if err := errors.Join(err, os.MkdirAll(out, 0o755)); err != nil {
		return err
	}
	if err := errors.Join(os.WriteFile(base+".md", []byte(md.String()), 0o644), os.WriteFile(base+".json", append(js, '\n'), 0o644)); err != nil {
		return err
	}
	progress("wrote %s.md and .json", base)
	if !rep.Correct {
		progress("the run was NOT correct (double charges or invariant violations): see the report")
		return ErrIncorrect
	}
	return nil
}

func writeResult(res bench.Result, asJSON bool) error {
	if !asJSON {
		return bench.WriteMarkdown(os.Stdout, "kasa bench", res)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}

func putFaults(ctx context.Context, simURL, rules string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, simURL+"/_sim/faults", strings.NewReader(rules))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	r.Body.Close()
	if r.StatusCode/100 != 2 {
		return fmt.Errorf("PUT /_sim/faults: %s", r.Status)
	}
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
	if !ok {
		return rev
	}
	for _, s := range info.Settings {
		switch {
		case s.Key == "vcs.revision" && len(s.Value) >= 12:
			rev = s.Value[:12]
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = "+changes"
		}
	}
	return rev + dirty
}
