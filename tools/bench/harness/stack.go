package harness

import (
	"context"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/store/pgstats"
	"github.com/kasa-pay/kasa/tools/bench"
	"github.com/kasa-pay/kasa/tools/devenv"
)

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
		progress("kept %s (its logs) for a look", s.dir)
	} else {
		_ = os.RemoveAll(s.dir)
	}
}

// startStack starts this binary's `kasa dev` or `kasa cluster` (which needs temporal "server") in a
// temporary data directory on free ports and waits until it is ready. The child gets none of the
// user's KASA_* settings (it must not touch their database or Temporal) but the Temporal CLI's
// path and what cfg passes on. With temporal "server" it first starts PostgreSQL and the real
// Temporal Server on it; with pprof, the child serves /debug/pprof/ on a loopback port of its own.
func startStack(ctx context.Context, cfg Config, temporal, topology string, pprof bool, extraEnv ...string) (_ *stack, err error) {
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
	var ports [4]int // the API's, the simulator's, the Temporal dev server's, and pprof's if asked
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
		// kasa's ceiling, not the rate limiter's, from as many connections as a run needs.
		"KASA_API_RATE_LIMIT_PER_IP_RATE=0", "KASA_API_RATE_LIMIT_PER_MERCHANT_RATE=0", "KASA_API_MAX_CONNS_PER_CLIENT=0",
		// Its runs offer more payments at once than one API runs: measured synchronously, none
		// queues in the start backlog unless the payday run asks for it.
		"KASA_BACKLOG_API_RUNNING=0", "KASA_API_MERCHANT_SHARE=1",
	}
	env = append(env, extraEnv...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KASA_") || strings.HasPrefix(kv, "KASA_TEMPORAL_CLI=") || strings.HasPrefix(kv, "KASA_TEMPORAL_SERVER=") {
			env = append(env, kv)
		}
	}
	procs := devenv.NewSupervisor(dir, nil)
	var beside []int // the servers started here, not by the child: their CPU counts too
	if temporal == TemporalServer {
		progress("starting PostgreSQL and the Temporal Server %s in %s", devenv.TemporalServerVersion, dir)
		// Checkpoints spaced as compose and docs/deployment.md deploy them for a burst.
		settings := append(slices.Clone(pgstats.Settings), "max_wal_size=16GB", "checkpoint_timeout=30min")
		pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: filepath.Join(dir, "postgres"), Settings: settings,
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return nil, err
		}
		s.cleanup = append(s.cleanup, func() { _ = pg.Stop() })
		ts, err := devenv.StartTemporalServer(ctx, pg, devenv.TemporalServerOptions{Dir: filepath.Join(dir, "temporal-server"), HistoryShards: historyShards})
		if err != nil {
			return nil, err
		}
		s.cleanup = append(s.cleanup, func() { _ = ts.Stop() })
		beside = append(beside, pg.Process().PID(), ts.PID())
		env = append(env, "KASA_DATABASE_URL="+pg.URL, "KASA_TEMPORAL_ADDRESS="+ts.Address(), "KASA_TEMPORAL_NAMESPACE="+ts.Namespace())
	}
	s.APIURL, s.SimURL = fmt.Sprintf("http://127.0.0.1:%d", ports[0]), fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	childEnv := env
	if topology == TopologyDev {
		// The bank simulator runs as a process of its own (kasa cluster starts its own so), for its
		// CPU not to count as kasa's; kasa dev starts none when its provider is another address.
		sim, err := procs.Start("banksim", env, bin, "banksim")
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
		s.pprofURL = fmt.Sprintf("http://127.0.0.1:%d", ports[3])
		childEnv = append(slices.Clip(childEnv), fmt.Sprintf("KASA_DEBUG_PPROF_ADDR=127.0.0.1:%d", ports[3]))
	}
	// Stopping sends SIGTERM, and SIGKILL a minute later if the child is still running; a
	// kasa bench killed outright takes its child (and so that one's servers) with it.
	child, err := procs.Start(topology, childEnv, bin, topology)
	if err != nil {
		return nil, err
	}
	s.cleanup = append(s.cleanup, func() { child.Stop(time.Minute) })
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
		return fmt.Errorf("kasa %s %s; its log:\n%s", topology, why, child.Tail(30))
	}
	for deadline := time.After(3 * time.Minute); !ready(statePath, &st, s.APIURL); {
		select {
		case <-child.Done():
			return nil, failed("exited while starting")
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
	// The bench's own reads of kasa's tables (the payday's backlog) name themselves, so that
	// their CPU does not count as kasa's.
	observerURL, err := pgstats.ObserverURL(st.DatabaseURL)
	if err != nil {
		return nil, err
	}
	db, err := store.Open(ctx, store.Options{URL: observerURL, SecretKey: key})
	if err != nil {
		return nil, err
	}
	s.cleanup = append(s.cleanup, db.Close)
	if s.Temporal, err = cfg.Dial(ctx, st.TemporalAddress); err != nil {
		return nil, fmt.Errorf("temporal at %s: %w", st.TemporalAddress, err)
	}
	s.cleanup = append(s.cleanup, s.Temporal.Close)
	// What grows in kasa's database ("kasa", devenv's) and the real Temporal Server's, and which
	// backends serve kasa's database, for StackCPU to tell kasa's part of PostgreSQL's CPU.
	srv, err := pgstats.Open(ctx, st.DatabaseURL)
	if err != nil {
		return nil, err
	}
	s.cleanup = append(s.cleanup, srv.Close)
	s.Counters = func(ctx context.Context) (map[string]int64, error) {
		return srv.Counters(ctx, []string{"kasa", "temporal", "temporal_visibility"})
	}
	kasaBackends := func() map[int]bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		m, _ := srv.Backends(ctx, "kasa")
		return m
	}
	s.AdminToken, s.DatabaseURL, s.Verify = st.AdminToken, st.DatabaseURL, db.Verify
	s.CPU = bench.StackCPU(child.PID(), beside, kasaBackends)
	s.Preload = func(ctx context.Context, fx *bench.Fixture, n int) error {
		var merchants []string
		for _, m := range fx.Merchants {
			merchants = append(merchants, m.ID)
		}
		_, err := preload(ctx, st.DatabaseURL, merchants, n, preloadChunk, func(done, total int) { progress("preloaded %d/%d", done, total) })
		return err
	}
	s.Settle = func(ctx context.Context) error { return bench.Settle(ctx, st.DatabaseURL) }
	s.Backlog = func(ctx context.Context) (queued, processing int64, err error) {
		if queued, _, err = db.QueuedBacklog(ctx); err == nil {
			processing, err = db.Processing(ctx)
		}
		return queued, processing, err
	}
	return s, nil
}

// historyShards is the real Temporal Server's: a few, as a cluster has many, on 2 cores.
const historyShards = 4

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
	return prefix, bench.Settle(ctx, dbURL)
}
