package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/bench"
	"github.com/kasa-pay/kasa/config"
	"github.com/kasa-pay/kasa/internal/devenv"
	"github.com/kasa-pay/kasa/store"
)

// runBench is `kasa bench`: it starts a throwaway kasa (a `kasa dev` child process on free ports
// with its own data directory, so nothing of the user's is touched) and measures it.
func runBench(ctx context.Context, cfg config.Config, log *slog.Logger) (err error) {
	relaxGC()
	fs := flag.NewFlagSet("kasa bench", flag.ContinueOnError)
	suite := fs.Bool("suite", false, "run the standard suite (ceilings, targets, correctness) and write its results")
	out := fs.String("out", "bench/results", "--suite: directory for <date>.md, <date>.json and <date>.svg")
	readme := fs.String("readme", "", "--suite: replace the section between the bench markers of this file with the results")
	duration := fs.Duration("duration", 15*time.Second, "measured window of each run")
	warmup := fs.Duration("warmup", 3*time.Second, "load before each window, not measured")
	concurrency := fs.Int("concurrency", 16, "clients (closed loop), or the cap on requests in flight (open loop)")
	rate := fs.Float64("rate", 0, "open loop: arrivals per second (0: closed loop)")
	merchants := fs.Int("merchants", 1000, "merchants, each with its own settlement account (1: one hot account)")
	payers := fs.Int("payers", 1, "payer accounts per merchant")
	dups := fs.Float64("duplicates", 0.05, "share of requests that retry an earlier key (some in parallel)")
	insufficient := fs.Float64("insufficient", 0.05, "share of new payments the payer cannot afford")
	currency := fs.String("currency", "TRY", "one run: currency of the accounts and payments (TRY, USD, EUR, JPY or KWD)")
	amounts := fs.String("amounts", "1-100", `one run: payment amounts, uniform in MIN-MAX major units of --currency, e.g. "0.50-20.00"`)
	path := fs.String("path", "payments", `what one run drives: "payments", "replay", a raw path such as "/healthz", or "temporal:<shape>" (ceiling T, e.g. temporal:LLL+eager+search-attributes)`)
	preload := fs.Int("preload", 0, "load this many stored payments and idempotency records (COPY) before measuring")
	faults := fs.String("faults", "", `bank simulator fault rules, as PUT /_sim/faults takes them, e.g. {"rules":[{"on":"charge","action":"delay","delay_ms":50}]}`)
	asJSON := fs.Bool("json", false, "one run: print its result as JSON")
	steadyWait := fs.Duration("steady-wait", 40*time.Second, "--suite: how long, over the whole suite, to wait for slow spells of a shared machine before a run")
	childPprof := fs.String("child-pprof", "", "serve the measured kasa dev child's /debug/pprof/ on this address, e.g. 127.0.0.1:6061")
	if err := fs.Parse(os.Args[2:]); errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return exitError(2)
	}
	minAmount, maxAmount, err := bench.ParseAmounts(*amounts, *currency)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kasa bench:", err)
		return exitError(2)
	}
	if *suite && (flagSet(fs, "currency") || flagSet(fs, "amounts")) {
		fmt.Fprintln(os.Stderr, "kasa bench: --currency and --amounts shape one run; the standard suite (--suite) keeps its own")
		return exitError(2)
	}

	st, err := startBenchStack(ctx, cfg, *childPprof, log)
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
	progress := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "kasa bench: "+format+"\n", args...) }

	if *suite {
		rep, err := bench.RunSuite(ctx, st.Stack, bench.SuiteOptions{
			Duration: *duration, Warmup: *warmup, Concurrency: *concurrency, Merchants: *merchants,
			Duplicates: *dups, Insufficient: *insufficient, Preload: *preload, SteadyWait: *steadyWait, Progress: progress,
		})
		if err != nil {
			return err
		}
		rep.Machine, rep.Commit, rep.Capability = machine(), commit(), cfg.Provider.Capability
		if err := writeSuite(rep, *out, *readme); err != nil {
			return err
		}
		if !rep.Correct {
			fmt.Fprintln(os.Stderr, "kasa bench: the run was NOT correct (double charges or invariant violations): see the report")
			return exitError(1)
		}
		return nil
	}

	if shape, ok := strings.CutPrefix(*path, "temporal:"); ok {
		sh, err := bench.ParseShape(shape)
		if err != nil {
			fmt.Fprintln(os.Stderr, "kasa bench:", err)
			return exitError(2)
		}
		res, err := bench.WorkflowCeiling(ctx, st.Temporal, sh, *concurrency, *warmup, *duration, st.CPU)
		if err != nil {
			return err
		}
		return writeResult(res, *asJSON)
	}
	opts := bench.Options{
		APIURL: st.APIURL, AdminToken: st.AdminToken, Duration: *duration, Warmup: *warmup,
		Concurrency: *concurrency, Rate: *rate, Merchants: *merchants, Payers: *payers,
		DuplicateRatio: *dups, InsufficientShare: *insufficient, Path: *path,
		Currency: *currency, MinAmount: minAmount, MaxAmount: maxAmount, CPU: st.CPU,
	}
	var fx *bench.Fixture
	if !strings.HasPrefix(*path, "/") {
		progress("setting up %d merchant(s) with %d payer(s) each", *merchants, *payers)
		if fx, err = bench.Setup(ctx, opts); err != nil {
			return err
		}
		if *preload > 0 {
			ids := make([]string, len(fx.Merchants))
			for i, m := range fx.Merchants {
				ids[i] = m.ID
			}
			progress("preloading %d stored payments", *preload)
			if err := st.Preload(ctx, ids, *preload); err != nil {
				return err
			}
		} else if err := st.Settle(ctx); err != nil {
			return err
		}
	}
	res, err := bench.Run(ctx, opts, fx)
	if err != nil {
		return err
	}
	doubles, err := bench.CheckCharges(ctx, st.SimURL, res.PaymentIDs("succeeded", "processing", "unknown"))
	if err != nil {
		return err
	}
	problems, err := st.Verify(ctx)
	if err != nil {
		return err
	}
	if err := writeResult(res, *asJSON); err != nil {
		return err
	}
	if doubles > 0 || len(problems) > 0 {
		fmt.Fprintf(os.Stderr, "kasa bench: NOT correct: %d double charge(s), invariant violations: %v\n", doubles, problems)
		return exitError(1)
	}
	fmt.Fprintln(os.Stderr, "kasa bench: correct: no double charge, kasa verify ok")
	return nil
}

// flagSet says whether the command line set the flag.
func flagSet(fs *flag.FlagSet, name string) (set bool) {
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func writeResult(res bench.Result, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	return bench.WriteMarkdown(os.Stdout, "kasa bench", res)
}

// benchStack is the `kasa dev` child and what the suite needs of it.
type benchStack struct {
	bench.Stack
	stop func()
	dir  string
	keep bool // a failed run keeps the child's data directory
}

// startBenchStack starts `kasa dev` in a temporary data directory on free ports (Temporal UI
// off, logs at warn) and waits until it is ready.
func startBenchStack(ctx context.Context, cfg config.Config, pprofAddr string, log *slog.Logger) (*benchStack, error) {
	bin, err := os.Executable()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kasa-bench-")
	if err != nil {
		return nil, err
	}
	var cleanup []func()
	stop := func() {
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
	}
	s := &benchStack{dir: dir}
	cleanup = append(cleanup, func() {
		if s.keep {
			fmt.Fprintf(os.Stderr, "kasa bench: kept %s (its dev.log and temporal.log) for a look\n", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	ports := make([]int, 3)
	for i := range ports {
		if ports[i], err = devenv.FreePort(); err != nil {
			stop()
			return nil, err
		}
	}
	env := []string{
		"KASA_DATA_DIR=" + dir, "KASA_LOG_LEVEL=warn", "KASA_TEMPORAL_UI_PORT=0",
		fmt.Sprintf("KASA_API_ADDR=127.0.0.1:%d", ports[0]), fmt.Sprintf("KASA_BANKSIM_ADDR=127.0.0.1:%d", ports[1]),
		fmt.Sprintf("KASA_TEMPORAL_PORT=%d", ports[2]), "KASA_PROVIDER_CAPABILITY=" + cfg.Provider.Capability,
		"KASA_DATABASE_MAX_CONNS=" + fmt.Sprint(cfg.Database.MaxConns), "KASA_DEBUG_PPROF_ADDR=" + pprofAddr,
		// The child's clients and the ceilings' client talk to Temporal alike.
		fmt.Sprintf("KASA_TEMPORAL_GZIP=%t", cfg.Temporal.Gzip),
	}
	// The child gets none of the user's KASA_* settings (it must not touch their database or
	// Temporal), except where to find the Temporal CLI.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KASA_") || strings.HasPrefix(kv, "KASA_TEMPORAL_CLI=") {
			env = append(env, kv)
		}
	}
	logFile, err := os.Create(filepath.Join(dir, "dev.log"))
	if err != nil {
		stop()
		return nil, err
	}
	cmd := exec.Command(bin, "dev")
	cmd.Env, cmd.Stderr = env, logFile
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		stop()
		return nil, err
	}
	dieWithParent(cmd)
	exited := make(chan struct{})
	started := make(chan error, 1)
	go func() {
		// The parent-death signal follows the thread that started the child, and Go ends a
		// thread only when a goroutine locked to it returns: this one returns once the child has.
		runtime.LockOSThread()
		defer close(exited)
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
	}()
	if err := <-started; err != nil {
		stop()
		return nil, err
	}
	cleanup = append(cleanup, func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		logFile.Close()
	})
	fmt.Fprintf(os.Stderr, "kasa bench: starting a throwaway kasa dev in %s\n", dir)
	banner := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "Ctrl-C stops everything") {
				close(banner)
			}
		}
	}()
	select {
	case <-banner:
	case <-exited:
		log := tailFile(logFile.Name()) // before stop removes it
		stop()
		return nil, fmt.Errorf("kasa dev exited while starting; its log:\n%s", log)
	case <-time.After(3 * time.Minute):
		log := tailFile(logFile.Name())
		stop()
		return nil, fmt.Errorf("kasa dev did not start within 3 minutes; its log:\n%s", log)
	case <-ctx.Done():
		stop()
		return nil, ctx.Err()
	}

	var state devState
	b, err := os.ReadFile(filepath.Join(dir, "dev.json"))
	if err == nil {
		err = json.Unmarshal(b, &state)
	}
	if err != nil {
		stop()
		return nil, fmt.Errorf("read the child's dev.json: %w", err)
	}
	s.stop = stop
	s.APIURL, s.SimURL = fmt.Sprintf("http://127.0.0.1:%d", ports[0]), fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	s.AdminToken, s.DatabaseURL = state.AdminToken, state.DatabaseURL

	cfg.Database.URL, cfg.Temporal.Address, cfg.Secret.Key = state.DatabaseURL, state.TemporalAddress, state.SecretKey
	// The Temporal SDK logs every ceiling worker's start and stop at info: not bench output.
	db, tc, err := connect(ctx, cfg, newLogger("warn"), false)
	if err != nil {
		stop()
		return nil, err
	}
	cleanup = append(cleanup, db.Close, tc.Close)
	s.Temporal = tc
	s.Verify = db.Verify
	s.Preload = func(ctx context.Context, merchants []string, n int) error { return preload(ctx, db, merchants, n) }
	s.Sizes = func(ctx context.Context) ([]bench.TableSize, error) { return sizes(ctx, db) }
	s.Settle = db.Settle
	s.CPU = bench.StackCPU(cmd.Process.Pid)
	if err := waitReady(ctx, s.APIURL+"/readyz"); err != nil {
		stop()
		return nil, err
	}
	return s, nil
}

func preload(ctx context.Context, db *store.Store, merchants []string, n int) error {
	ids := make([]uuid.UUID, len(merchants))
	for i, m := range merchants {
		var err error
		if ids[i], err = uuid.Parse(m); err != nil {
			return err
		}
	}
	started := time.Now()
	// A progress line redrawn in place on a terminal; nothing in between into a file.
	progress := func(int, int) {}
	fi, err := os.Stderr.Stat()
	terminal := err == nil && fi.Mode()&os.ModeCharDevice != 0
	if terminal {
		progress = func(done, total int) { fmt.Fprintf(os.Stderr, "\rkasa bench: preloaded %d/%d", done, total) }
	}
	res, err := db.Preload(ctx, store.PreloadOptions{Merchants: ids, N: n, Progress: progress})
	if terminal {
		fmt.Fprintln(os.Stderr)
	}
	if err == nil {
		fmt.Fprintf(os.Stderr, "kasa bench: preloaded %d payments in %s\n", res.Rows, time.Since(started).Round(time.Second))
	}
	return err
}

func sizes(ctx context.Context, db *store.Store) ([]bench.TableSize, error) {
	ts, err := db.Sizes(ctx)
	out := make([]bench.TableSize, len(ts))
	for i, t := range ts {
		out[i] = bench.TableSize{Table: t.Table, Rows: t.Rows, TableBytes: t.TableBytes, IndexBytes: t.IndexBytes}
	}
	return out, err
}

func waitReady(ctx context.Context, url string) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if r, err := http.Get(url); err == nil {
			r.Body.Close()
			if r.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s never answered 200", url)
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

// writeSuite writes <out>/<date>.{md,json,svg} and, when readme is set, the summary between its
// bench markers.
func writeSuite(rep *bench.Report, out, readme string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	base := filepath.Join(out, rep.Started.Format("2006-01-02"))
	var md strings.Builder
	if err := bench.WriteSuiteMarkdown(&md, rep); err != nil {
		return err
	}
	chart := filepath.Base(base) + ".svg"
	md.WriteString("\n![throughput and p99 per second of the spread payment run](" + chart + ")\n")
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	// The chart shows the spread payment run that counted: the faster of its two passes.
	var spread *bench.Result
	for i, r := range rep.Runs {
		if strings.HasPrefix(r.Path, bench.RunSpread+" ") && (spread == nil || r.NewPaymentRate > spread.NewPaymentRate) {
			spread = &rep.Runs[i]
		}
	}
	var svg strings.Builder
	if spread != nil {
		if err := bench.WriteSVG(&svg, "new payments, "+spread.Path, spread.Series); err != nil {
			return err
		}
	}
	for name, content := range map[string]string{base + ".md": md.String(), base + ".json": string(b) + "\n", base + ".svg": svg.String()} {
		if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "kasa bench: wrote %s.md, .json and .svg\n", base)
	if readme == "" {
		return nil
	}
	text, err := os.ReadFile(readme)
	if err != nil {
		return err
	}
	section := regexp.MustCompile(`(?s)(<!-- bench:start -->\n).*?(<!-- bench:end -->)`)
	if !section.Match(text) {
		return fmt.Errorf("%s has no <!-- bench:start --> ... <!-- bench:end --> section", readme)
	}
	var summary strings.Builder
	fmt.Fprintf(&summary, "Latest `make bench` (%s, %s, commit %s; full report: [%s](%s)):\n\n",
		rep.Started.Format("2006-01-02"), rep.Machine, rep.Commit, filepath.ToSlash(base)+".md", filepath.ToSlash(base)+".md")
	summary.WriteString(rep.CapabilityLine())
	summary.WriteString("| target | inputs | ratio | goal | met |\n|---|---|---:|---:|---|\n")
	for _, t := range rep.Targets {
		goal := fmt.Sprintf("≥ %.2f", t.Threshold)
		if strings.HasPrefix(t.Name, "5") {
			goal = fmt.Sprintf("≤ %.0f", t.Threshold)
		}
		met := "no"
		if t.Met {
			met = "yes"
		}
		fmt.Fprintf(&summary, "| %s | %s | %.2f | %s | %s |\n", t.Name, t.Inputs, t.Value, goal, met)
	}
	fmt.Fprintf(&summary, "\nCorrect: %v (%d payments checked, %d double charges, %d invariant violations).\n\n",
		rep.Correct, rep.Checked, rep.Doubles, len(rep.Problems))
	// What 1a compares, in CPU: where a payment's cost goes beside T's workflow.
	var cpu []string
	for _, r := range rep.Runs {
		if r.CPU != nil && (strings.HasPrefix(r.Path, bench.RunSpread+" #") || strings.HasPrefix(r.Path, bench.RunTOwn+" #")) {
			cpu = append(cpu, fmt.Sprintf("- %s: %s", strings.SplitN(r.Path, " (", 2)[0], r.CPU))
		}
	}
	if len(cpu) > 0 {
		fmt.Fprintf(&summary, "CPU of target 1a's runs, in milliseconds of each process class's CPU time:\n\n%s\n\n", strings.Join(cpu, "\n"))
	}
	text = section.ReplaceAll(text, []byte("${1}"+strings.ReplaceAll(summary.String(), "$", "$$")+"${2}"))
	return os.WriteFile(readme, text, 0o644)
}

func machine() string {
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		if _, err := fmt.Sscanf(string(b), "MemTotal: %d kB", &kb); err == nil {
			mem = fmt.Sprintf(", %d GiB", (kb+1<<19)>>20)
		}
	}
	return fmt.Sprintf("%s/%s, %d cores%s, %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), mem, runtime.Version())
}

// commit is the VCS revision the binary was built from (go build records it).
func commit() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	rev, dirty := "unknown", ""
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

func tailFile(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-30):], "\n")
}
