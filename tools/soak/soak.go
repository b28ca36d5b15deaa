// Package soak is the chaos soak (`kasa soak`, `make soak`): kasa's real processes, PostgreSQL and
// Temporal run under a steady load with duplicate retries while a seeded schedule of faults kills
// and restarts them, makes the bank misbehave and degrades the network; then everything settles
// and the soak checks kasa's invariants. docs/tools.md ("Chaos soak") describes it.
package soak

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kasa-pay/kasa/config"
	"github.com/kasa-pay/kasa/tools/banksim"
	"github.com/kasa-pay/kasa/tools/devenv"
)

// ErrInterrupted is returned when the soak was stopped (SIGINT/SIGTERM) before its verdict.
var ErrInterrupted = errors.New("soak interrupted: no verdict")

// Options say how to run a soak.
type Options struct {
	Binary     string        // the kasa executable the processes run
	Duration   time.Duration // of the load; default 10m
	Seed       int64         // of the fault schedule and the load's choices
	Rate       float64       // new payments per second; default 5
	Shape      string        // ShapeDev or ShapeCluster; "": drawn from the seed
	Capability string        // the provider's capability, for the simulator and kasa; "": drawn from the seed
	// Retention is KASA_IDEMPOTENCY_RETENTION: 0 kasa's default (72h), no key expires during the
	// run; negative: drawn from the seed, 1s or the default.
	Retention time.Duration
	Kinds     []Kind        // the fault kinds drawn from; empty: all
	Out       string        // where the report goes (soak-<date>-<shape>.{md,json}); empty: nowhere
	Dir       string        // working directory (data, logs); empty: a temporary one, removed after a clean run
	Settle    time.Duration // bound of each wait while settling; default 3m
	Log       io.Writer     // progress; default os.Stdout
}

// The deployment shapes a soak runs.
const (
	// ShapeDev: one `kasa api`, the Temporal dev server, the broker embedded in `kasa relay`.
	ShapeDev = "dev"
	// ShapeCluster: as deployed for production: two `kasa api` (the load spreads over both), the
	// real Temporal Server on the soak's PostgreSQL, and a NATS server of its own.
	ShapeCluster = "cluster"
)

// Shapes lists the shapes.
var Shapes = []string{ShapeDev, ShapeCluster}

// replay is the command that runs the same fault schedule and load again.
func (o Options) replay() string {
	cmd := fmt.Sprintf("kasa soak --seed %d --duration %s --rate %g --shape %s --capability %s --retention %s",
		o.Seed, o.Duration, o.Rate, o.Shape, o.Capability, o.Retention)
	if len(o.Kinds) > 0 {
		kinds := make([]string, len(o.Kinds))
		for i, k := range o.Kinds {
			kinds[i] = string(k)
		}
		cmd += " --faults " + strings.Join(kinds, ",")
	}
	return cmd
}

func (o *Options) defaults() {
	if o.Duration <= 0 {
		o.Duration = 10 * time.Minute
	}
	if o.Rate <= 0 {
		o.Rate = 5
	}
	// Drawn from the seed, apart from the schedule's draws: over many seeds every capability and
	// both retentions get soaked.
	draw := rand.New(rand.NewPCG(uint64(o.Seed), 0x63617061))
	if o.Capability == "" {
		o.Capability = config.Capabilities[draw.IntN(len(config.Capabilities))]
	}
	if o.Retention < 0 {
		o.Retention = []time.Duration{0, time.Second}[draw.IntN(2)]
	}
	if shape := Shapes[draw.IntN(len(Shapes))]; o.Shape == "" && slices.Contains(o.Kinds, LoseBroker) {
		o.Shape = ShapeCluster // the only shape with a broker of its own
	} else if o.Shape == "" {
		o.Shape = shape
	}
	if o.Settle <= 0 {
		o.Settle = 3 * time.Minute
	}
	if o.Log == nil {
		o.Log = os.Stdout
	}
}

// planOptions are the schedule's options for o: faults start after a warm-up and stop well
// before the end of the load, so the last payments run on a healthy system.
func (o Options) planOptions() PlanOptions {
	quiet := min(30*time.Second, max(10*time.Second, o.Duration/6))
	return PlanOptions{Seed: o.Seed, Duration: o.Duration, Warmup: 5 * time.Second, Quiet: quiet,
		MinGap: 3 * time.Second, MaxGap: 10 * time.Second, Kinds: o.Kinds, Workers: workers, Cluster: o.Shape == ShapeCluster}
}

const workers = 2

// Settings of every kasa process: short timeouts so that a dead worker or a silent bank is
// noticed within seconds, and a short charge budget so that long bank faults park payments as
// unknown for the reconciliation to settle.
var kasaSettings = map[string]string{
	"KASA_PROVIDER_TIMEOUT":        "2s",
	"KASA_PROVIDER_CHARGE_TIMEOUT": "5s",
	"KASA_PROVIDER_CHARGE_BUDGET":  "20s",
	"KASA_PROVIDER_BOOKING_WINDOW": "5s",
	"KASA_API_SYNC_WAIT":           "1s",
	"KASA_DATABASE_MAX_CONNS":      "16",
	"KASA_WEBHOOK_TIMEOUT":         "5s",
	"KASA_WEBHOOK_ALLOW_PRIVATE":   "true",
	"KASA_LOG_LEVEL":               "info",
	// Manual payments nobody captures expire within the soak.
	"KASA_CAPTURE_WINDOW": "20s",
}

// stack is one soak's processes, servers and links.
type stack struct {
	o        Options
	dir      string
	log      *log.Logger // every line "soak: "; one write a line, whoever writes
	pg, tmp  *server
	tmpAddr  string
	nats     string // the cluster shape's broker: its store directory
	links    *links
	procs    *devenv.Supervisor
	children map[string]*devenv.Child
	balances *watch // readings of every account during the run
	verifies *watch // kasa verify during the run
	splits   splits // what the settings_split faults saw
	api      *api
	hook     *receiver
	dbURL    string // direct, for the tools (migrate, verify, reconcile)
	env      map[string]string
	stops    []func()
}

// Run runs one soak and returns its report; the report's Violations say whether kasa held.
func Run(ctx context.Context, o Options) (rep *Report, err error) {
	o.defaults()
	if o.Binary == "" {
		return nil, errors.New("soak: no kasa binary")
	}
	if o.Shape != ShapeCluster && slices.Contains(o.Kinds, LoseBroker) {
		return nil, fmt.Errorf("soak: %s needs the cluster shape (its own broker)", LoseBroker)
	}
	s := &stack{o: o, log: log.New(o.Log, "soak: ", 0), children: map[string]*devenv.Child{}}
	keep := o.Dir != ""
	if o.Dir == "" {
		d, err := os.MkdirTemp("", "kasa-soak-")
		if err != nil {
			return nil, err
		}
		o.Dir = d
	}
	s.dir = o.Dir
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return nil, err
	}
	defer func() {
		// A temporary directory goes unless it holds the logs of a failure.
		s.teardown(!keep && (errors.Is(err, ErrInterrupted) || err == nil && rep.Violations == 0))
	}()

	rep = &Report{Started: time.Now().UTC(), Seed: o.Seed, Duration: o.Duration.String(), Rate: o.Rate,
		Shape: o.Shape, Capability: o.Capability, Workers: workers, Dir: s.dir, Replay: o.replay()}
	rep.Plan = Plan(o.planOptions())
	retention := o.Retention.String()
	if o.Retention == 0 {
		retention = "72h (kasa's default)"
	}
	s.log.Printf("seed %d, %s at %.1f payments/s, shape %s, capability %s, retention %s, working directory %s",
		o.Seed, o.Duration, o.Rate, o.Shape, o.Capability, retention, s.dir)
	s.log.Printf("fault schedule (%d faults; replay with %s):", len(rep.Plan), rep.Replay)
	PrintPlan(o.Log, rep.Plan)

	if err := s.up(ctx); err != nil {
		return nil, interrupted(ctx, fmt.Errorf("start the stack (logs in %s): %w", s.dir, err))
	}
	merchants, err := s.merchants()
	if err != nil {
		return nil, interrupted(ctx, err)
	}

	// The load runs for the duration; the faults run inside it. Clients still retrying when it
	// ends go on until their key is taken, within the settle bound.
	s.log.Print("load started")
	started := time.Now()
	loadCtx, stopLoad := context.WithTimeout(ctx, o.Duration)
	defer stopLoad()
	retryCtx, stopRetries := context.WithCancel(ctx)
	defer stopRetries()
	ld := newLoad(s.api, o.Rate, o.Seed, merchants, o.expires(), rep)
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	s.balances = watchBalances(watchCtx, s.api, merchants, 2*time.Second)
	s.verifies = s.watchVerify(watchCtx, 5*time.Second)
	faults := s.runFaults(loadCtx, rep.Plan, started)
	ld.run(loadCtx, retryCtx, fmt.Sprintf("soak%d-%s", o.Seed, started.UTC().Format("150405")))
	rep.Faults = <-faults
	if ctx.Err() != nil {
		return nil, ErrInterrupted
	}
	s.log.Printf("load done (%d keys); faults over; settling", len(ld.snapshot()))
	if err := s.heal(ctx); err != nil {
		return nil, interrupted(ctx, err)
	}
	healed := time.Now()
	bound, stopBound := context.WithTimeout(ctx, o.Settle)
	context.AfterFunc(bound, stopRetries)
	ld.wg.Wait()
	stopBound()

	st, err := s.settle(ctx, ld, started, healed, rep)
	if err != nil {
		return nil, interrupted(ctx, err)
	}
	stopWatch() // the readings cover the load, the faults and the settling
	rep.SettledAfter = time.Since(healed).Round(time.Second).String()
	checking := time.Now()
	s.check(ctx, ld, st, rep)
	rep.CheckedIn = time.Since(checking).Round(100 * time.Millisecond).String()
	if ctx.Err() != nil {
		return nil, ErrInterrupted
	}
	for name, c := range s.children {
		if exits := c.Exits(); len(exits) > 0 {
			if rep.UnplannedExits == nil {
				rep.UnplannedExits = map[string][]string{}
			}
			rep.UnplannedExits[name] = exits
		}
	}
	rep.Finished = time.Now().UTC()
	rep.summarise(ld, st, s.hook)
	if rep.Violations > 0 {
		rep.histories = map[string][]op{}
		for _, k := range ld.snapshot() {
			k.mu.Lock()
			rep.histories[k.Key] = slices.Clone(k.history)
			k.mu.Unlock()
		}
	}
	if o.Out != "" {
		if err := rep.write(o.Out); err != nil {
			return rep, err
		}
	}
	rep.WriteText(o.Log)
	return rep, nil
}

// expires says whether idempotency records may expire while the soak still sends their keys.
func (o Options) expires() bool { return o.Retention > 0 && o.Retention < o.Duration+2*o.Settle }

func interrupted(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ErrInterrupted
	}
	return err
}

// up starts PostgreSQL, Temporal, the links, the webhook receiver and every kasa process, and
// waits until the API is ready.
func (s *stack) up(ctx context.Context) error {
	// PostgreSQL, Temporal, the simulator, the API, the relay's metrics, NATS and its monitor, a
	// second API.
	ports, addr := make([]int, 8), make([]string, 8)
	for i := range ports {
		p, err := devenv.FreePort()
		if err != nil {
			return err
		}
		ports[i], addr[i] = p, "127.0.0.1:"+strconv.Itoa(p)
	}
	// Durable, not Ephemeral: with synchronous_commit off a crash loses commits kasa was told
	// about, which no payment system can survive.
	s.pg = &server{name: "postgres", launch: func(ctx context.Context, _ crashable) (crashable, error) {
		return devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: filepath.Join(s.dir, "postgres"), Port: ports[0]})
	}}
	s.tmp = &server{name: "temporal", launch: func(ctx context.Context, _ crashable) (crashable, error) {
		return devenv.StartTemporal(ctx, devenv.TemporalOptions{Port: ports[1], DBFile: filepath.Join(s.dir, "temporal", "temporal.db"), LogDir: s.dir})
	}}
	if s.o.Shape == ShapeCluster {
		// The real Temporal Server on the soak's PostgreSQL (directly, not through the faulty
		// link), restarted with the configuration and ports of its first start.
		s.tmp.launch = func(ctx context.Context, last crashable) (crashable, error) {
			if last != nil {
				ts := last.(*devenv.TemporalServer)
				return ts, ts.Restart(ctx)
			}
			pg, up := s.pg.running()
			if !up {
				return nil, errors.New("the Temporal Server needs PostgreSQL running")
			}
			return devenv.StartTemporalServer(ctx, pg.(*devenv.Postgres), devenv.TemporalServerOptions{Dir: filepath.Join(s.dir, "temporal"), Port: ports[1],
				Logger: slog.New(slog.DiscardHandler)})
		}
	}
	for _, srv := range []*server{s.pg, s.tmp} {
		if err := srv.start(ctx); err != nil {
			return err
		}
		s.stops = append(s.stops, srv.stop)
	}
	s.dbURL, s.tmpAddr = pgURL(addr[0]), addr[1]

	s.links = newLinks()
	s.stops = append(s.stops, s.links.stop)
	pgLink, err := s.links.add(LinkPostgres, addr[0])
	if err != nil {
		return err
	}
	bankLink, err := s.links.add(LinkBank, addr[2])
	if err != nil {
		return err
	}
	if s.hook, err = startReceiver(); err != nil {
		return err
	}
	s.stops = append(s.stops, s.hook.close)

	admin := "adm_" + randomHex(16)
	s.env = map[string]string{
		"KASA_DATA_DIR":            filepath.Join(s.dir, "data"),
		"KASA_SECRET_KEY":          randomHex(32),
		"KASA_ADMIN_TOKEN":         admin,
		"KASA_API_ADDR":            addr[3],
		"KASA_BANKSIM_ADDR":        addr[2],
		"KASA_PROVIDER_URL":        "http://" + bankLink,
		"KASA_PROVIDER_CAPABILITY": s.o.Capability,
		"KASA_DATABASE_URL":        pgURL(pgLink),
		"KASA_TEMPORAL_ADDRESS":    s.tmpAddr,
		"KASA_RELAY_METRICS_ADDR":  addr[4],
		"KASA_METRICS_ADDR":        "api", // the soak reads each API's gauges on its port
		"KASA_WORKER_METRICS_ADDR": "off", // two workers on one host; the soak runs kasa verify itself
	}
	maps.Copy(s.env, kasaSettings)
	// A process that exits on its own is started again, and its exit is reported.
	s.procs = devenv.NewSupervisor(s.dir, nil)
	s.procs.WorkDir, s.procs.Restart = s.dir, &devenv.DefaultBackoff
	if s.o.Shape == ShapeCluster {
		natsBin, err := devenv.FindTool("nats-server", "nats-server")
		if err != nil {
			return err
		}
		s.nats = filepath.Join(s.dir, "nats")
		nats, err := devenv.StartNATS(ctx, s.procs, natsBin, s.nats, ports[5], ports[6])
		if err != nil {
			return err
		}
		s.children["nats"] = nats
		s.stops = append(s.stops, func() { s.procs.StopAll(15*time.Second, []*devenv.Child{nats}) })
		s.env["KASA_NATS_URL"] = "nats://" + addr[5]
	}
	if s.o.Retention > 0 {
		s.env["KASA_IDEMPOTENCY_RETENTION"] = s.o.Retention.String()
	}
	if out, err := s.tool(ctx, "migrate"); err != nil {
		return fmt.Errorf("kasa migrate: %w\n%s", err, out)
	}
	s.api = &api{base: "http://" + addr[3], sim: "http://" + addr[2], admin: admin, http: &http.Client{Timeout: 15 * time.Second}}

	// Each process's own settings beside the shared ones: in the cluster shape, a second API.
	procs := map[string]map[string]string{"banksim": nil, "relay": nil}
	if s.o.Shape == ShapeCluster {
		procs["api-1"], procs["api-2"] = nil, map[string]string{"KASA_API_ADDR": addr[7]}
		s.api.others = []string{"http://" + addr[7]}
	} else {
		procs["api"] = nil
	}
	for i := 1; i <= workers; i++ {
		procs[fmt.Sprintf("worker-%d", i)] = nil
	}
	var all []*devenv.Child
	for _, name := range slices.Sorted(maps.Keys(procs)) {
		cmd, _, _ := strings.Cut(name, "-")
		c, err := s.procs.Start(name, s.environ(procs[name]), s.o.Binary, cmd)
		if err != nil {
			return err
		}
		s.children[name] = c
		all = append(all, c)
	}
	// Registered after the servers' stops: the processes stop first.
	s.stops = append(s.stops, func() { s.procs.StopAll(15*time.Second, all) })
	if err := s.api.waitOK(s.api.sim+"/_sim/healthz", time.Minute); err != nil {
		return err
	}
	return s.api.ready(2 * time.Minute)
}

// merchants makes two merchants with webhooks to the receiver: the first has a well-funded
// account and one that runs dry, the second a well-funded one.
func (s *stack) merchants() ([]*merchant, error) {
	var out []*merchant
	for i, deposits := range [][]int64{{100_000_000_00, 100_00}, {100_000_000_00}} {
		var m struct {
			ID            string `json:"id"`
			APIKey        string `json:"api_key"`
			WebhookSecret string `json:"webhook_secret"`
		}
		// The receiver knows the merchant by its webhook URL's last segment, its index here: the
		// merchant's id is known only once it exists.
		name := fmt.Sprintf("soak merchant %d", i+1)
		if err := s.api.adminCall("POST", "/admin/v1/merchants", map[string]string{"name": name, "webhook_url": s.hook.url + strconv.Itoa(i)}, &m); err != nil {
			return nil, err
		}
		s.hook.addMerchant(strconv.Itoa(i), m.WebhookSecret)
		mc := &merchant{ID: m.ID, APIKey: m.APIKey}
		for j, d := range deposits {
			var a struct{ ID string }
			if err := s.api.adminCall("POST", "/admin/v1/accounts", map[string]string{"merchant_id": m.ID, "currency": "TRY"}, &a); err != nil {
				return nil, err
			}
			if err := s.api.adminCall("POST", "/admin/v1/accounts/"+a.ID+"/deposits", map[string]string{"amount": formatTRY(d)}, nil,
				"Idempotency-Key", fmt.Sprintf("soak-seed-%d-%d", i, j)); err != nil {
				return nil, err
			}
			mc.Accounts = append(mc.Accounts, account{ID: a.ID, Deposit: d})
		}
		out = append(out, mc)
	}
	return out, nil
}

// environ is the environment of a kasa process: the soak's settings, never the caller's KASA_*.
func (s *stack) environ(overrides map[string]string) []string {
	out := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "KASA_") })
	for k, v := range s.env {
		if o, ok := overrides[k]; ok {
			v = o
		}
		out = append(out, k+"="+v)
	}
	return out
}

// tool runs a one-shot kasa command (migrate, verify, reconcile) on the database directly, not
// through the faulty link.
func (s *stack) tool(ctx context.Context, args ...string) (string, error) {
	return devenv.Command{Dir: s.dir, Env: s.environ(map[string]string{"KASA_DATABASE_URL": s.dbURL})}.Run(ctx, s.o.Binary, args...)
}

// runFaults runs the schedule from start, each fault in its own goroutine, and delivers every
// fault's result once all are over.
func (s *stack) runFaults(ctx context.Context, plan []Fault, start time.Time) <-chan []FaultResult {
	out := make(chan []FaultResult, 1)
	results := make([]FaultResult, len(plan))
	var wg sync.WaitGroup
	for i, f := range plan {
		wg.Go(func() {
			results[i] = FaultResult{Fault: f}
			if sleep(ctx, time.Until(start.Add(f.At))) != nil {
				results[i].Error = "not injected: the load ended"
				return
			}
			s.log.Print(strings.TrimSpace(fmt.Sprintf("%s  %s %s %s", clock(time.Since(start)), f.Kind, f.Target, f.Detail())))
			t0 := time.Now()
			if err := s.inject(ctx, f); err != nil {
				results[i].Error = err.Error()
				s.log.Printf("%s %s: %v", f.Kind, f.Target, err)
			}
			results[i].Injected = true
			results[i].Took = time.Since(t0).Round(time.Millisecond).String()
		})
	}
	go func() { wg.Wait(); out <- results }()
	return out
}

// inject applies one fault, waits its duration, and undoes it.
func (s *stack) inject(ctx context.Context, f Fault) error {
	wait := func() { _ = sleep(ctx, f.Duration) }
	switch f.Kind {
	case KillWorker, KillAPI, KillRelay, LoseBroker:
		c := s.children[f.Target]
		if err := c.Kill(); err != nil {
			return err
		}
		if f.Kind == LoseBroker { // the store goes with the process: every message the broker acknowledged is lost
			if err := os.RemoveAll(filepath.Join(s.nats, "jetstream")); err != nil {
				return err
			}
		}
		wait()
		return c.Resume()
	case RestartPostgres, RestartTemporal:
		srv := map[Kind]*server{RestartPostgres: s.pg, RestartTemporal: s.tmp}[f.Kind]
		if err := srv.crash(); err != nil {
			return err
		}
		wait()
		return retry(context.WithoutCancel(ctx), srv.start)
	case SettingsSplit:
		return s.split(ctx, f)
	case BankFault:
		rules := []banksim.Rule{{On: f.On, Action: f.Action, Probability: &f.Probability, DelayMS: f.DelayMS}}
		if f.AlsoOn != "" {
			rules = append(rules, banksim.Rule{On: f.AlsoOn, Action: f.Action, Probability: &f.Probability, DelayMS: f.DelayMS})
		}
		if err := s.api.bank().SetFaults(ctx, rules...); err != nil {
			return err
		}
		wait()
		return s.api.bank().SetFaults(context.WithoutCancel(ctx))
	case NetFault:
		if err := s.links.inject(f); err != nil {
			return err
		}
		wait()
		s.links.heal(f)
		return nil
	}
	return fmt.Errorf("unknown fault kind %q", f.Kind)
}

// heal undoes whatever the faults left broken, and waits until the API is ready.
func (s *stack) heal(ctx context.Context) error {
	if err := s.api.bank().SetFaults(ctx); err != nil {
		return fmt.Errorf("clear the bank's faults: %w", err)
	}
	for _, name := range []string{LinkPostgres, LinkBank} {
		s.links.heal(Fault{Target: name})
	}
	for _, srv := range []*server{s.pg, s.tmp} {
		if _, up := srv.running(); !up {
			if err := retry(ctx, srv.start); err != nil {
				return err
			}
		}
	}
	for _, c := range s.children {
		if err := c.Resume(); err != nil {
			return err
		}
	}
	return s.api.ready(s.o.Settle)
}

// teardown stops everything in the reverse order of its start, and removes the directory if asked.
func (s *stack) teardown(remove bool) {
	for _, stop := range slices.Backward(s.stops) {
		stop()
	}
	if remove {
		_ = os.RemoveAll(s.dir)
	}
}

// retry starts a server, trying again a few times a second apart (a port may take a moment to
// be free again after a crash).
func retry(ctx context.Context, start func(context.Context) error) error {
	var err error
	for range 5 {
		if err = start(ctx); err == nil || ctx.Err() != nil {
			return err
		}
		_ = sleep(ctx, time.Second)
	}
	return err
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = crand.Read(b)
	return hex.EncodeToString(b)
}

func formatTRY(minor int64) string { return fmt.Sprintf("%d.%02d", minor/100, minor%100) }
