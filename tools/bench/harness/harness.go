// Package harness is `kasa bench`: it starts a throwaway kasa (a `kasa dev` child process on free
// ports with its own data directory, so nothing of the user's is touched), measures it with
// package bench, checks that it stayed correct, and writes the results.
package harness

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/procfs"
	"go.temporal.io/sdk/client"

	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/bench"
	"github.com/kasa-pay/kasa/tools/devenv"
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

// Main runs `kasa bench` with its arguments: one run, or the standard suite (--suite).
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
	fs.IntVar(&o.Preload, "preload", 0, "--suite: load this many stored payments and idempotency records for the large-table runs")
	temporal := fs.String("temporal", TemporalDev, "the Temporal kasa runs on: dev (the CLI's dev server) or server (the real Temporal Server on PostgreSQL)")
	topology := fs.String("kasa", TopologyDev, "how kasa runs: dev (one process, the worker in the API's) or cluster (kasa cluster: APIs and workers apart; needs --temporal=server)")
	cpuProfile := fs.String("cpuprofile", "", "one run with --kasa dev: write a CPU profile of the measured kasa dev over the measured window to this file "+
		"(fetched from its /debug/pprof/ on a loopback port of its own; see `go tool pprof -top kasa FILE`)")
	compare := fs.Bool("compare-temporal", false, "measure T and new payments on the dev server, on the real server, and on the real server with kasa cluster, and write <date>-temporal-server.{md,json} to --out")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return ErrUsage
	}
	if o.RefundShare < 0 || o.RefundShare >= 1 {
		fmt.Fprintf(fs.Output(), "kasa bench: --refund-share is from 0 to below 1, not %v\n", o.RefundShare)
		return ErrUsage
	}
	if *temporal != TemporalDev && *temporal != TemporalServer {
		fmt.Fprintf(fs.Output(), "kasa bench: --temporal is dev or server, not %q\n", *temporal)
		return ErrUsage
	}
	if (*topology != TopologyDev && *topology != TopologyCluster) || (*topology == TopologyCluster && *temporal != TemporalServer) {
		fmt.Fprintf(fs.Output(), "kasa bench: --kasa is dev or cluster (with --temporal=server), not %q\n", *topology)
		return ErrUsage
	}
	if *cpuProfile != "" && (*suite || *compare || *topology != TopologyDev) {
		fmt.Fprintln(fs.Output(), "kasa bench: --cpuprofile profiles one run of kasa dev: not with --suite, --compare-temporal or --kasa cluster")
		return ErrUsage
	}
	if *compare {
		o.Progress = progress
		c, err := Compare(ctx, cfg, o)
		if err != nil {
			return err
		}
		js, err := json.MarshalIndent(c, "", "  ")
		base := freeBase(*out, c.Started.Format("2006-01-02")+"-temporal-server")
		if err = errors.Join(err, os.MkdirAll(*out, 0o755)); err == nil {
			err = errors.Join(os.WriteFile(base+".md", []byte(bench.CompareMarkdown(c)), 0o644), os.WriteFile(base+".json", append(js, '\n'), 0o644))
		}
		if err != nil {
			return err
		}
		progress("wrote %s.md and .json", base)
		for _, s := range c.Sides {
			if err := verdict(s.Verdict); err != nil {
				return err
			}
		}
		return nil
	}
	st, err := startStack(ctx, cfg, *temporal, *topology, *cpuProfile != "")
	if err != nil {
		return err
	}
	defer func() { st.stop(err != nil) }()
	o.APIURL, o.AdminToken, o.CPU, o.Counters, o.Progress = st.APIURL, st.AdminToken, st.CPU, st.Counters, progress
	if *suite {
		// The suite writes its report to out/<date>.md and .json.
		o.Payers = 0 // one run's flag, which the suite does not read
		rep, err := bench.RunSuite(ctx, st.Stack, o)
		if err != nil {
			return err
		}
		rep.Machine, rep.Commit, rep.Capability = machine(), commit(), cfg.Capability
		js, err := json.MarshalIndent(rep, "", "  ")
		base := freeBase(*out, rep.Started.Format("2006-01-02"))
		if err = errors.Join(err, os.MkdirAll(*out, 0o755)); err == nil {
			err = errors.Join(os.WriteFile(base+".md", []byte(bench.SuiteMarkdown(rep)), 0o644), os.WriteFile(base+".json", append(js, '\n'), 0o644))
		}
		if err != nil {
			return err
		}
		progress("wrote %s.md and .json", base)
		return verdict(rep.Verdict)
	}
	progress("setting up %d merchant(s) with %d payer(s) each", o.Merchants, o.Payers)
	fx, err := bench.Setup(ctx, o)
	if err != nil {
		return err
	}
	if err := st.Settle(ctx); err != nil {
		return err
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
	v, err := st.Check(ctx, res.Payments, res.RefundsSeen)
	if err != nil {
		return err
	}
	var text strings.Builder
	text.WriteString(bench.Markdown("kasa bench", res))
	if len(res.PerOp) > 0 {
		per := "new payment"
		if res.CPU != nil {
			per = res.CPU.Per
		}
		fmt.Fprintf(&text, "\nCounters per %s: ", per)
		for i, n := range slices.Sorted(maps.Keys(res.PerOp)) {
			fmt.Fprintf(&text, "%s%s %.1f", map[bool]string{true: "", false: ", "}[i == 0], n, res.PerOp[n])
		}
		text.WriteString("\n")
	}
	fmt.Print(text.String())
	explicit := false
	fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "out" })
	if explicit { // a run worth keeping: its report beside the suites'
		rep := bench.RunReport{Started: started.UTC(), Machine: machine(), Commit: commit(), Capability: cfg.Capability, Options: o, Run: res, Verdict: v}
		js, err := json.MarshalIndent(rep, "", "  ")
		base := freeBase(*out, rep.Started.Format("2006-01-02")+"-run")
		if err = errors.Join(err, os.MkdirAll(*out, 0o755)); err == nil {
			err = errors.Join(os.WriteFile(base+".md", []byte(bench.RunMarkdown(rep, text.String())), 0o644), os.WriteFile(base+".json", append(js, '\n'), 0o644))
		}
		if err != nil {
			return err
		}
		progress("wrote %s.md and .json", base)
	}
	return verdict(v)
}

// Compare measures ceiling T and new payments (o's Duration, Warmup, Concurrency, Merchants,
// Duplicates, Insufficient) on a fresh stack for each side: kasa dev on the dev server, kasa dev
// on the real Temporal Server, and kasa cluster on the real Temporal Server, each beside T of
// the shape its payments have there.
func Compare(ctx context.Context, cfg Config, o bench.Options) (*bench.Comparison, error) {
	c := &bench.Comparison{Started: time.Now().UTC(), Machine: machine(), Commit: commit(), Options: o}
	server := fmt.Sprintf("Temporal Server %s (PostgreSQL persistence and visibility, %d history shards)", devenv.TemporalServerVersion, historyShards)
	for _, side := range []struct {
		temporal, topology string
		of                 bench.SideOf
	}{
		{TemporalDev, TopologyDev, bench.SideOf{Name: "dev", About: "dev server (Temporal CLI, SQLite, one process), kasa dev", Shape: bench.PaymentShape}},
		{TemporalServer, TopologyDev, bench.SideOf{Name: "server", About: server + ", kasa dev (the worker in the API's process: eager start, one workflow task)", Shape: bench.PaymentShape}},
		{TemporalServer, TopologyCluster, bench.SideOf{Name: "server, split", About: server + ", kasa cluster (2 kasa api, one loaded; 2 kasa worker; relay; NATS: no eager start)", Shape: bench.SplitShape}},
	} {
		st, err := startStack(ctx, cfg, side.temporal, side.topology, false)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", side.of.Name, err)
		}
		before := loadavg()
		s, err := bench.CompareSide(ctx, st.Stack, o, side.of)
		st.stop(err != nil)
		if err != nil {
			return nil, err
		}
		c.Load = append(c.Load, fmt.Sprintf("%s %s → %s", side.of.Name, before, loadavg()))
		c.Sides = append(c.Sides, s)
	}
	return c, nil
}

// freeBase is dir/stem, or dir/stem-2, -3... when a report of that name is there already: a
// second run on a day does not write over the first.
func freeBase(dir, stem string) string {
	base := filepath.Join(dir, stem)
	for i := 2; ; i++ {
		if _, err := os.Stat(base + ".md"); err != nil {
			return base
		}
		base = filepath.Join(dir, fmt.Sprintf("%s-%d", stem, i))
	}
}

// loadavg is the machine's load average over 1, 5 and 15 minutes.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "?"
}

// verdict says whether the runs were correct, and is ErrIncorrect when they were not.
func verdict(v bench.Verdict) error {
	if !v.Correct {
		progress("NOT correct: %d double charge(s), %d double refund(s), refund mismatches: %q, invariant violations: %q",
			v.Doubles, v.RefundDoubles, v.RefundProblems, v.Problems)
		return ErrIncorrect
	}
	refunds := ""
	if v.RefundsChecked > 0 {
		refunds = fmt.Sprintf("; %d refunds each at the bank once if succeeded, never if failed, and in their payments' amount_refunded", v.RefundsChecked)
	}
	progress("correct: no double charge, kasa verify ok%s", refunds)
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
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", base, secs), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("cpu profile: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("cpu profile: %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// stack is a throwaway `kasa dev` (or `kasa cluster`) child and what the suite needs of it.
type stack struct {
	bench.Stack
	dir      string   // the child's data directory
	pprofURL string   // with profiling: the child's pprof server, on a loopback port of its own
	cleanup  []func() // run in reverse order by stop
}

// stop stops the child and removes its directory, unless keep (after a failed run, for a look).
func (s *stack) stop(keep bool) {
	for i := len(s.cleanup) - 1; i >= 0; i-- {
		s.cleanup[i]()
	}
	if keep {
		progress("kept %s (its dev.log and temporal.log) for a look", s.dir)
	} else {
		_ = os.RemoveAll(s.dir)
	}
}

// startStack starts this binary's `kasa dev` (topology cluster: `kasa cluster`, which needs
// temporal "server") in a temporary data directory on free ports and waits
// until it is ready. The child gets none of the user's KASA_* settings (it must not touch their
// database or Temporal) but the Temporal CLI's path and what cfg passes on.
//
// With temporal "server" it first starts PostgreSQL and the real Temporal Server on it itself, and
// the child uses both (kasa dev starts neither when given their addresses). That PostgreSQL
// counts statements and their WAL by database (statsSettings).
//
// With pprof, the child serves Go's /debug/pprof/ on a free loopback port (never the API's).
func startStack(ctx context.Context, cfg Config, temporal, topology string, pprof bool) (_ *stack, err error) {
	bin := cfg.Binary
	if bin == "" {
		if bin, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "kasa-bench-")
	if err != nil {
		return nil, err
	}
	s := &stack{dir: dir}
	defer func() {
		if err != nil {
			s.stop(false)
		}
	}()
	var ports [3]int
	for i := range ports {
		if ports[i], err = devenv.FreePort(); err != nil {
			return nil, err
		}
	}
	env := []string{
		"KASA_DATA_DIR=" + dir, "KASA_LOG_LEVEL=warn", "KASA_TEMPORAL_UI_PORT=0",
		fmt.Sprintf("KASA_API_ADDR=127.0.0.1:%d", ports[0]), fmt.Sprintf("KASA_BANKSIM_ADDR=127.0.0.1:%d", ports[1]),
		fmt.Sprintf("KASA_TEMPORAL_PORT=%d", ports[2]), "KASA_PROVIDER_CAPABILITY=" + cfg.Capability,
		fmt.Sprintf("KASA_DATABASE_MAX_CONNS=%d", cfg.MaxConns),
		fmt.Sprintf("KASA_TEMPORAL_GZIP=%t", cfg.Gzip), // the child's clients and the ceilings' client alike
		// One address sends every run, replays and /healthz at ~20,000/s: the bench measures
		// kasa's ceiling, not the rate limiter's.
		"KASA_API_RATE_LIMIT_PER_IP_RATE=0", "KASA_API_RATE_LIMIT_PER_MERCHANT_RATE=0",
	}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KASA_") || strings.HasPrefix(kv, "KASA_TEMPORAL_CLI=") || strings.HasPrefix(kv, "KASA_TEMPORAL_SERVER=") {
			env = append(env, kv)
		}
	}
	var beside []int // the servers started here, not by the child: their CPU counts too
	if temporal == TemporalServer {
		progress("starting PostgreSQL and the Temporal Server %s in %s", devenv.TemporalServerVersion, dir)
		pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: filepath.Join(dir, "postgres"), Database: "kasa",
			Settings: statsSettings, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return nil, err
		}
		s.cleanup = append(s.cleanup, func() { _ = pg.Stop() })
		pgPID, err := postmasterPID(filepath.Join(dir, "postgres"))
		if err != nil {
			return nil, err
		}
		ts, err := devenv.StartTemporalServer(ctx, pg, devenv.TemporalServerOptions{Dir: filepath.Join(dir, "temporal-server"), HistoryShards: historyShards})
		if err != nil {
			return nil, err
		}
		s.cleanup = append(s.cleanup, func() { _ = ts.Stop() })
		beside = append(beside, pgPID, ts.PID())
		env = append(env, "KASA_DATABASE_URL="+pg.URL, "KASA_TEMPORAL_ADDRESS="+ts.Address(), "KASA_TEMPORAL_NAMESPACE="+ts.Namespace())
	}
	s.APIURL, s.SimURL = fmt.Sprintf("http://127.0.0.1:%d", ports[0]), fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	childEnv := env
	if topology == TopologyDev {
		// The bank simulator runs as a process of its own (kasa cluster starts its own so), for its
		// CPU not to count as kasa's; kasa dev starts none when its provider is another address.
		sim, err := devenv.NewSupervisor(dir, nil).Start("banksim", env, bin, "banksim")
		if err != nil {
			return nil, err
		}
		s.cleanup = append(s.cleanup, func() { sim.Stop(time.Minute) })
		if err := devenv.WaitHTTP(ctx, s.SimURL+"/_sim/healthz", sim); err != nil {
			return nil, err
		}
		beside = append(beside, sim.PID())
		childEnv = slices.DeleteFunc(slices.Clone(env), func(kv string) bool { return strings.HasPrefix(kv, "KASA_BANKSIM_ADDR=") })
		childEnv = append(childEnv, "KASA_PROVIDER_URL="+s.SimURL)
	}
	if pprof { // the measured child's only
		port, err := devenv.FreePort()
		if err != nil {
			return nil, err
		}
		s.pprofURL = fmt.Sprintf("http://127.0.0.1:%d", port)
		childEnv = append(slices.Clip(childEnv), fmt.Sprintf("KASA_DEBUG_PPROF_ADDR=127.0.0.1:%d", port))
	}
	logFile, err := os.Create(filepath.Join(dir, "dev.log"))
	if err != nil {
		return nil, err
	}
	// Stopping sends SIGTERM, and SIGKILL a minute later if the child is still running.
	stopCtx, stopChild := context.WithCancel(context.WithoutCancel(ctx))
	cmd := exec.CommandContext(stopCtx, bin, topology)
	cmd.Env, cmd.Stdout, cmd.Stderr, cmd.WaitDelay = childEnv, logFile, logFile, time.Minute
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	dieWithParent(cmd)
	var startErr error
	started, exited := make(chan struct{}), make(chan struct{})
	go func() {
		// The parent-death signal follows the thread that started the child, and Go ends a
		// thread only when a goroutine locked to it returns: this one returns once the child has.
		runtime.LockOSThread()
		defer close(exited)
		startErr = cmd.Start()
		close(started) // cmd.Process is set, for the other goroutines to read
		if startErr == nil {
			_ = cmd.Wait()
		}
	}()
	s.cleanup = append(s.cleanup, func() { stopChild(); <-exited; logFile.Close() })
	progress("starting a throwaway kasa %s in %s", topology, dir)

	// The child writes dev.json (kasa cluster: cluster/cluster.json), which says where its
	// servers are, once all of them run.
	statePath := filepath.Join(dir, "dev.json")
	if topology == TopologyCluster {
		statePath = filepath.Join(dir, "cluster", "cluster.json")
	}
	var st struct {
		AdminToken      string `json:"admin_token"`
		SecretKey       string `json:"secret_key"`
		DatabaseURL     string `json:"database_url"`
		TemporalAddress string `json:"temporal_address"`
	}
	failed := func(why string) error {
		b, _ := os.ReadFile(logFile.Name())
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		return fmt.Errorf("kasa %s %s; its log:\n%s", topology, why, strings.Join(lines[max(0, len(lines)-30):], "\n"))
	}
	for deadline := time.After(3 * time.Minute); !ready(statePath, &st, s.APIURL); {
		select {
		case <-exited:
			return nil, cmp.Or(startErr, failed("exited while starting"))
		case <-deadline:
			return nil, failed("did not start within 3 minutes")
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	key, err := hex.DecodeString(st.SecretKey)
	if err != nil {
		return nil, fmt.Errorf("the child's secret key: %w", err)
	}
	db, err := store.Open(ctx, store.Options{URL: st.DatabaseURL, SecretKey: key})
	if err != nil {
		return nil, err
	}
	s.cleanup = append(s.cleanup, db.Close)
	if s.Temporal, err = cfg.Dial(ctx, st.TemporalAddress); err != nil {
		return nil, fmt.Errorf("temporal at %s: %w", st.TemporalAddress, err)
	}
	s.cleanup = append(s.cleanup, s.Temporal.Close)
	<-started
	counters, kasaBackends, closeCounters, err := databaseCounters(ctx, st.DatabaseURL)
	if err != nil {
		return nil, err
	}
	s.cleanup = append(s.cleanup, closeCounters)
	s.Counters = counters
	s.AdminToken, s.DatabaseURL, s.Verify = st.AdminToken, st.DatabaseURL, db.Verify
	s.CPU = bench.StackCPU(cmd.Process.Pid, beside, kasaBackends)
	s.Preload = func(ctx context.Context, fx *bench.Fixture, n int) error {
		var merchants []string
		for _, m := range fx.Merchants {
			merchants = append(merchants, m.ID)
		}
		_, err := preload(ctx, st.DatabaseURL, merchants, n, preloadChunk, func(done, total int) { progress("preloaded %d/%d", done, total) })
		return err
	}
	s.Settle = func(ctx context.Context) error { return settle(ctx, st.DatabaseURL) }
	return s, nil
}

// historyShards is the real Temporal Server's: a few, as a cluster has many, on 2 cores.
const historyShards = 4

// postmasterPID reads the PostgreSQL server's process id from its data directory.
func postmasterPID(dataDir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
}

// statsSettings make a PostgreSQL the harness starts count every statement, and the WAL it
// wrote, by database (pg_stat_statements): room for Temporal's few hundred distinct statements.
var statsSettings = []string{"shared_preload_libraries=pg_stat_statements", "pg_stat_statements.max=10000"}

// measuredDatabases are kasa's database and the real Temporal Server's persistence and visibility.
var measuredDatabases = []string{"kasa", "temporal", "temporal_visibility"}

// databaseCounters reads, through a pool on the cluster's `postgres` database (so that its own
// queries count in none of the measured ones), what grows in the measured databases: for each,
// "commits <db>" (pg_stat_database.xact_commit, read-only transactions included) and "rows written
// <db>" (rows inserted, updated and deleted); the cluster's whole WAL as "wal bytes, all" and
// its "full-page images, all" (pages written whole, the first change to each after a checkpoint);
// and, where pg_stat_statements is loaded, "statements <db>" (executions of statements other
// than transaction control), "wal bytes <db>" and "full-page images <db>" (what those statements
// wrote; commit records, autovacuum and checkpoint records are in no database's).
//
// kasaBackends maps the process ids of the cluster's backends (autovacuum workers included) to
// whether they serve dbURL's database, for StackCPU to tell kasa's part of PostgreSQL's CPU.
func databaseCounters(ctx context.Context, dbURL string) (count func(context.Context) (map[string]int64, error), kasaBackends func() map[int]bool, closePool func(), err error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return nil, nil, nil, err
	}
	kasaDB := strings.TrimPrefix(u.Path, "/")
	u.Path = "/postgres"
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		return nil, nil, nil, err
	}
	kasaBackends = func() map[int]bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		rows, err := pool.Query(ctx, `SELECT pid, datname = $1 FROM pg_stat_activity WHERE datname IS NOT NULL`, kasaDB)
		if err != nil {
			return nil
		}
		m := map[int]bool{}
		var pid int
		var kasa bool
		if _, err := pgx.ForEachRow(rows, []any{&pid, &kasa}, func() error { m[pid] = kasa; return nil }); err != nil {
			return nil
		}
		return m
	}
	_, err = pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)
	if err == nil {
		_, err = pool.Exec(ctx, `SELECT 1 FROM pg_stat_statements LIMIT 1`) // fails unless preloaded
	}
	statements := err == nil
	count = func(ctx context.Context) (map[string]int64, error) {
		out := map[string]int64{}
		add := func(sql string, names ...string) error {
			rows, err := pool.Query(ctx, sql, measuredDatabases)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var db string
				vals := make([]int64, len(names))
				dest := []any{&db}
				for i := range vals {
					dest = append(dest, &vals[i])
				}
				if err := rows.Scan(dest...); err != nil {
					return err
				}
				for i, n := range names {
					out[strings.TrimSpace(n+" "+db)] = vals[i]
				}
			}
			return rows.Err()
		}
		err := add(`SELECT datname, xact_commit, tup_inserted + tup_updated + tup_deleted FROM pg_stat_database WHERE datname = ANY($1)`,
			"commits", "rows written")
		if err == nil {
			err = add(`SELECT '', (pg_current_wal_lsn() - '0/0')::bigint, wal_fpi FROM pg_stat_wal WHERE $1::text[] IS NOT NULL`,
				"wal bytes, all", "full-page images, all")
		}
		if err == nil && statements {
			err = add(`SELECT d.datname,
				coalesce(sum(s.calls) FILTER (WHERE s.query !~* '^\s*(begin|commit|rollback|start transaction|savepoint|release|end)\M'), 0)::bigint,
				coalesce(sum(s.wal_bytes), 0)::bigint, coalesce(sum(s.wal_fpi), 0)::bigint
				FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = ANY($1) GROUP BY d.datname`,
				"statements", "wal bytes", "full-page images")
		}
		return out, err
	}
	return count, kasaBackends, pool.Close, nil
}

// ready reads the child's dev.json into st, and asks its API's /readyz.
func ready(devJSON string, st any, apiURL string) bool {
	b, err := os.ReadFile(devJSON)
	if err != nil || json.Unmarshal(b, st) != nil {
		return false
	}
	r, err := http.Get(apiURL + "/readyz")
	if err != nil {
		return false
	}
	r.Body.Close()
	return r.StatusCode == http.StatusOK
}

//go:embed preload.sql
var preloadSQL []byte

//go:embed settle.sql
var settleSQL []byte

// preloadChunk is how many rows one preload transaction loads.
const preloadChunk = 100_000

// preload bulk-loads n failed payments with their completed idempotency records for the merchants
// (preload.sql) in transactions of chunk rows, then settles the database. Row i's key is prefix+i.
func preload(ctx context.Context, dbURL string, merchants []string, n, chunk int, progress func(done, total int)) (prefix string, err error) {
	if len(merchants) == 0 {
		return "", errors.New("preload: no merchants")
	}
	prefix = fmt.Sprintf("preload-%08x-", rand.Uint32()) // repeated preloads never collide
	for first := 0; first < n; first += chunk {
		last := min(first+chunk, n)
		_, err := bench.PSQL(ctx, dbURL, preloadSQL, "-1", "-v", "merchants={"+strings.Join(merchants, ",")+"}",
			"-v", "prefix="+prefix, "-v", "first="+strconv.Itoa(first), "-v", "last="+strconv.Itoa(last))
		if err != nil {
			return prefix, fmt.Errorf("preload rows %d-%d: %w", first, last-1, err)
		}
		progress(last, n)
	}
	return prefix, settle(ctx, dbURL)
}

// settle runs settle.sql: the vacuum and checkpoint a bulk load leaves for later, done now.
func settle(ctx context.Context, dbURL string) error {
	_, err := bench.PSQL(ctx, dbURL, settleSQL)
	return err
}
