package bench

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/procfs"
	"golang.org/x/sync/errgroup"

	"github.com/kasa-pay/kasa/outbox"
	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/devenv"
)

// The store path: kasa's own data path at PostgreSQL speed, without Temporal. Clients run a
// payment's store steps (Begin, Reserve, Finalize with its outbox row) back to back while the
// relay, the webhook consumer and the webhook sender run against an embedded NATS and deliver
// to a local endpoint that answers 204, all in this process, on a PostgreSQL of its own. Beside
// it, in the same run and on the same PostgreSQL: pgbench's ceiling P (payment.sql, the same
// statements) and the minimal sketch M (minimal.sql).

// StorePathOptions describe a store-path run. Zero values get the defaults noted.
type StorePathOptions struct {
	Clients   int           // goroutines running payments, and pgbench clients for P and M; default 32
	Duration  time.Duration // measured window of each run; default 10s
	Warmup    time.Duration // load before each window, not measured; default 2s
	Merchants []int         // one run per count; default 1 and 1,000
	// PGBench runs P and M (Duration each, the largest merchant count, Clients clients).
	PGBench bool
	// Dir holds PostgreSQL's and NATS's data; default a temporary directory, removed afterwards.
	Dir      string
	Progress func(format string, args ...any)
}

// StorePathRun is one store-path run: Clients goroutines paying Merchants merchants.
type StorePathRun struct {
	Merchants int     `json:"merchants"`
	Duration  float64 `json:"duration_s"`
	Payments  int64   `json:"payments"` // completed in the window (all three steps)
	Rate      float64 `json:"payments_per_s"`
	Errors    int64   `json:"errors"` // payments whose step failed, in the window
	P50MS     float64 `json:"p50_ms"` // one payment's three steps
	P99MS     float64 `json:"p99_ms"`
	// CPU milliseconds per payment: "kasa" is this process (the store steps, the relay, the
	// consumer, the sender, the embedded NATS and the 2xx endpoint), "postgres" the server's.
	CPUMS map[string]float64 `json:"cpu_ms_per_payment,omitempty"`
	// WALBytes is the WAL the cluster wrote in the window, per payment.
	WALBytes float64 `json:"wal_bytes_per_payment"`
}

// StorePathStatement is one statement's share of the database's time in the last run.
type StorePathStatement struct {
	Query        string  `json:"query"`
	Calls        int64   `json:"calls"`
	PerPayment   float64 `json:"calls_per_payment"`
	MeanMS       float64 `json:"mean_ms"`
	SharePercent float64 `json:"share_percent"` // of all statements' execution time
	WALBytes     float64 `json:"wal_bytes_per_call"`
}

// StorePathTable is one table's bytes per payment (heap and TOAST, and its indexes), measured
// before retention deletes anything; Kept says whether rows stay forever or only for a window.
type StorePathTable struct {
	Table      string  `json:"table"`
	TableBytes float64 `json:"table_bytes_per_payment"`
	IndexBytes float64 `json:"index_bytes_per_payment"`
	Kept       string  `json:"kept"`
}

// StorePathReport is a store-path run's results.
type StorePathReport struct {
	Started time.Time                `json:"started"`
	Machine string                   `json:"machine,omitempty"`
	Commit  string                   `json:"commit,omitempty"`
	Load    string                   `json:"load,omitempty"` // load average before → after
	Clients int                      `json:"clients"`
	Runs    []StorePathRun           `json:"runs"`
	PGBench map[string]PGBenchResult `json:"pgbench,omitempty"` // "P" and "M"
	// PGBenchCPUMS is PostgreSQL's CPU per pgbench transaction (one payment) over each whole
	// pgbench run, "P" and "M" (less disturbed than the rates by what else the machine runs),
	// and pgbench's own, "P client" and "M client".
	PGBenchCPUMS map[string]float64 `json:"pgbench_postgres_cpu_ms_per_payment,omitempty"`
	Ratios       map[string]float64 `json:"ratios"` // "P/M", "store/P", "one/1000"
	KasaCPUMS    float64            `json:"kasa_cpu_ms_per_payment"`
	// Statements are pg_stat_statements' costliest statements: "store" in the window of the
	// run with the most merchants, "P" and "M" in pgbench's whole runs (their warmups too).
	Statements map[string][]StorePathStatement `json:"statements,omitempty"`
	Tables     []StorePathTable                `json:"tables,omitempty"`
	// BytesKept is what a payment leaves for good, BytesWindowed what it leaves for the
	// retention windows (idempotency record: 72 h; outbox, inbox, deliveries: 7 days).
	BytesKept     float64  `json:"bytes_kept_per_payment"`
	BytesWindowed float64  `json:"bytes_windowed_per_payment"`
	Retained      int64    `json:"rows_left_after_retention"` // windowed rows left once retention ran
	Webhooks      int64    `json:"webhooks_delivered"`
	Problems      []string `json:"verify_problems"`
	Correct       bool     `json:"correct"`
}

// StorePath starts a PostgreSQL (counting statements), migrates it, and measures.
func StorePath(ctx context.Context, o StorePathOptions) (_ *StorePathReport, err error) {
	o.Clients, o.Duration, o.Warmup = orDefault(o.Clients, 32), orDefault(o.Duration, 10*time.Second), orDefault(o.Warmup, 2*time.Second)
	if len(o.Merchants) == 0 {
		o.Merchants = []int{1, 1000}
	}
	if o.Progress == nil {
		o.Progress = func(string, ...any) {}
	}
	if o.Dir == "" {
		if o.Dir, err = os.MkdirTemp("", "kasa-store-path-"); err != nil {
			return nil, err
		}
		defer os.RemoveAll(o.Dir)
	}
	rep := &StorePathReport{Started: time.Now().UTC(), Clients: o.Clients, Ratios: map[string]float64{}, Load: loadAvg(),
		Statements: map[string][]StorePathStatement{}}
	o.Progress("starting PostgreSQL in %s", o.Dir)
	pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: filepath.Join(o.Dir, "postgres"), Database: "kasa",
		Settings: []string{"shared_preload_libraries=pg_stat_statements", "pg_stat_statements.max=1000", "max_connections=200"},
		Logger:   slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	defer pg.Stop()
	pgPID, err := readPostmasterPID(filepath.Join(o.Dir, "postgres"))
	if err != nil {
		return nil, err
	}
	db, err := store.Open(ctx, store.Options{URL: pg.URL, SecretKey: make([]byte, 32), Migrate: true, MaxConns: int32(o.Clients + 8)})
	if err != nil {
		return nil, err
	}
	defer db.Close()
	// A connection of the bench's own, for the counters (WAL, rows) it reads.
	aux, err := pgxpool.New(ctx, pg.URL)
	if err != nil {
		return nil, err
	}
	defer aux.Close()
	if _, err := aux.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		return nil, err
	}

	// The event pipeline, as kasa runs it: relay, consumer and sender, NATS embedded.
	var webhooks atomic.Int64
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		webhooks.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer hook.Close()
	natsURL, stopNATS, err := outbox.StartEmbedded(filepath.Join(o.Dir, "nats"))
	if err != nil {
		return nil, err
	}
	defer stopNATS()
	nc, js, err := outbox.Connect(natsURL, "kasa-store-path", outbox.BrokerAuth{})
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	quiet, metrics := slog.New(slog.DiscardHandler), outbox.NewMetrics(prometheus.NewRegistry())
	pctx, stopPipeline := context.WithCancel(ctx)
	var pipeline errgroup.Group
	defer func() { stopPipeline(); _ = pipeline.Wait() }()
	for _, r := range []interface{ Run(context.Context) error }{
		outbox.NewRelay(outbox.RelayOptions{Store: db, JetStream: js, Metrics: metrics, Logger: quiet}),
		outbox.NewWebhookConsumer(outbox.WebhookConsumerOptions{Store: db, JetStream: js, Metrics: metrics, Logger: quiet}),
		outbox.NewWebhookSender(outbox.WebhookSenderOptions{Store: db, AllowPrivate: true, Metrics: metrics, Logger: quiet}),
	} {
		pipeline.Go(func() error { return r.Run(pctx) })
	}

	most := slices.Max(o.Merchants)
	o.Progress("setting up %d merchants", most)
	merchants, err := storePathMerchants(ctx, db, most, hook.URL)
	if err != nil {
		return nil, err
	}
	_, _ = PSQL(ctx, pg.URL, []byte("VACUUM (ANALYZE);\n\\set ON_ERROR_STOP off\nCHECKPOINT;"))

	cpu := processCPU(pgPID)
	if o.PGBench {
		rep.PGBenchCPUMS = map[string]float64{}
		for _, s := range []struct{ name, script string }{{"M", PGBenchMinimal}, {"P", PGBenchPayment}} {
			o.Progress("pgbench %s (%s), %d clients, %d merchants", s.name, s.script, o.Clients, most)
			if _, err := aux.Exec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
				return nil, err
			}
			before := cpu()
			r, err := PGBench(ctx, PGBenchOptions{DatabaseURL: pg.URL, Clients: o.Clients, Duration: o.Duration, Script: s.script, Rows: most})
			if err != nil {
				return nil, err
			}
			after := cpu()
			// Every statement of a script runs once per transaction: the most called one counts them.
			var txs int64
			if err := aux.QueryRow(ctx, `SELECT coalesce(max(calls), 0) FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
				WHERE d.datname = current_database() AND s.query !~* '^\s*(begin|commit)'`).Scan(&txs); err != nil {
				return nil, err
			}
			if txs > 0 {
				rep.PGBenchCPUMS[s.name] = float64(after[ClassPostgres]-before[ClassPostgres]) / float64(time.Millisecond) / float64(txs)
				rep.PGBenchCPUMS[s.name+" client"] = float64(after[classPGBench]-before[classPGBench]) / float64(time.Millisecond) / float64(txs)
			}
			if rep.PGBench == nil {
				rep.PGBench = map[string]PGBenchResult{}
			}
			rep.PGBench[s.name] = r
			if rep.Statements[s.name], err = topStatements(ctx, aux, 0); err != nil {
				return nil, err
			}
			o.Progress("pgbench %s: %.0f tx/s, p50 %.2f ms, p99 %.2f ms", s.name, r.TPS, r.P50MS, r.P99MS)
		}
	}

	// The largest count first: its statements are the ones reported.
	for _, n := range slices.Backward(slices.Sorted(slices.Values(o.Merchants))) {
		o.Progress("store path: %d clients, %d merchant(s)", o.Clients, n)
		run, sts, err := storePathRun(ctx, db, aux, merchants[:n], o, cpu, n == most)
		if err != nil {
			return nil, err
		}
		o.Progress("store path, %d merchant(s): %.0f payments/s, p50 %.2f ms, p99 %.2f ms, %d errors", n, run.Rate, run.P50MS, run.P99MS, run.Errors)
		rep.Runs = append(rep.Runs, run)
		if sts != nil {
			rep.Statements["store"] = sts
		}
	}
	slices.SortFunc(rep.Runs, func(a, b StorePathRun) int { return a.Merchants - b.Merchants })

	// The event pipeline catches up: every payment's webhook delivered.
	var total int64
	if err := aux.QueryRow(ctx, "SELECT count(*) FROM payments").Scan(&total); err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(2 * time.Minute); webhooks.Load() < total && time.Now().Before(deadline); {
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return nil, err
		}
	}
	rep.Webhooks = webhooks.Load()
	stopPipeline()
	_ = pipeline.Wait()

	if rep.Problems, err = db.Verify(ctx); err != nil {
		return nil, err
	}
	rep.Correct = len(rep.Problems) == 0 && rep.Webhooks >= total
	if rep.Webhooks < total {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%d of %d webhooks delivered", rep.Webhooks, total))
	}
	if err := storePathSizes(ctx, db, aux, pg.URL, total, rep); err != nil {
		return nil, err
	}
	storePathRatios(rep)
	rep.Load += " → " + loadAvg()
	return rep, nil
}

// storePathMerchant is a merchant with its payer accounts, funded far beyond any run.
type storePathMerchant struct {
	id     uuid.UUID
	payers []uuid.UUID
}

// hotPayers is how many payers the first merchant has, as the suite's one hot merchant: the run
// with one merchant measures its settlement account, not one payer's row.
const hotPayers = 100

func storePathMerchants(ctx context.Context, db *store.Store, n int, hookURL string) ([]storePathMerchant, error) {
	ms := make([]storePathMerchant, n)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i := range ms {
		g.Go(func() error {
			m := storePathMerchant{id: payment.NewID()}
			if err := db.CreateMerchant(gctx, payment.Merchant{ID: m.id, Name: "store-path-" + strconv.Itoa(i), WebhookURL: hookURL},
				payment.NewSecret("sk_"), payment.NewSecret("whsec_")); err != nil {
				return err
			}
			for range map[bool]int{true: hotPayers, false: 1}[i == 0] {
				a, err := db.CreateAccount(gctx, m.id, "TRY")
				if err != nil {
					return err
				}
				if _, _, err := db.Deposit(gctx, a.ID, "seed", 1_000_000_000_000); err != nil {
					return err
				}
				m.payers = append(m.payers, a.ID)
			}
			ms[i] = m
			return nil
		})
	}
	return ms, g.Wait()
}

// storePathRun runs o.Clients goroutines paying the merchants (each goroutine takes its own in
// turn) through the warmup and the window, and measures the window; with statements, also the
// costliest statements of the window.
func storePathRun(ctx context.Context, db *store.Store, aux *pgxpool.Pool, merchants []storePathMerchant, o StorePathOptions,
	cpu func() map[string]time.Duration, statements bool) (_ StorePathRun, sts []StorePathStatement, _ error) {
	run := StorePathRun{Merchants: len(merchants)}
	start := time.Now()
	from, to := start.Add(o.Warmup), start.Add(o.Warmup+o.Duration)
	var mu sync.Mutex
	var lat []time.Duration
	var errs int64
	var firstErr error
	g, gctx := errgroup.WithContext(ctx)
	for c := range o.Clients {
		g.Go(func() error {
			for i := c; ; i += o.Clients {
				t0 := time.Now()
				if !t0.Before(to) {
					return nil
				}
				m := merchants[i%len(merchants)]
				err := storePathPayment(gctx, db, m.id, m.payers[(i/len(merchants))%len(m.payers)])
				if gctx.Err() != nil {
					return gctx.Err()
				}
				if end := time.Now(); end.After(from) && end.Before(to) {
					mu.Lock()
					if err != nil {
						errs++
						firstErr = cmpErr(firstErr, err)
					} else {
						lat = append(lat, end.Sub(t0))
					}
					mu.Unlock()
				}
			}
		})
	}
	var cpuA, cpuB map[string]time.Duration
	var walA, walB int64
	g.Go(func() error {
		if err := sleep(gctx, time.Until(from)); err != nil {
			return err
		}
		cpuA, walA = cpu(), walLSN(gctx, aux)
		if statements {
			if _, err := aux.Exec(gctx, "SELECT pg_stat_statements_reset()"); err != nil {
				return err
			}
		}
		if err := sleep(gctx, time.Until(to)); err != nil {
			return err
		}
		cpuB, walB = cpu(), walLSN(gctx, aux)
		if statements {
			var err error
			sts, err = topStatements(gctx, aux, 1)
			return err
		}
		return nil
	})
	if err := g.Wait(); err != nil {
		return run, nil, err
	}
	if errs > 0 && len(lat) == 0 {
		return run, nil, fmt.Errorf("store path: every payment failed: %w", firstErr)
	}
	slices.Sort(lat)
	run.Duration, run.Payments, run.Errors = o.Duration.Seconds(), int64(len(lat)), errs
	run.Rate = float64(run.Payments) / run.Duration
	if len(lat) > 0 {
		run.P50MS, run.P99MS = ms(quantile(lat, 0.5)), ms(quantile(lat, 0.99))
		run.WALBytes = float64(walB-walA) / float64(run.Payments)
		run.CPUMS = map[string]float64{}
		for class, d := range cpuB {
			run.CPUMS[class] = float64(d-cpuA[class]) / float64(time.Millisecond) / float64(run.Payments)
		}
		for i := range sts {
			sts[i].PerPayment = float64(sts[i].Calls) / float64(run.Payments)
		}
	}
	return run, sts, nil
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// storePathPayment is one new payment through the steps the API and the worker run.
func storePathPayment(ctx context.Context, db *store.Store, merchant, payer uuid.UUID) error {
	key := uuid.NewString()
	req := payment.Request{InvoiceID: key, AmountMinor: 100, Currency: "TRY", AccountID: payer, PaymentType: payment.DefaultPaymentType}
	_, p, began, err := db.Begin(ctx, store.BeginInput{MerchantID: merchant, Key: key, Request: req, OperationID: payment.NewID(), Lease: time.Minute})
	if err != nil {
		return err
	}
	if began != store.BeganNew {
		return fmt.Errorf("key %s did not begin a new payment", key)
	}
	if err := db.Reserve(ctx, p.ID); err != nil {
		return err
	}
	_, err = db.Finalize(ctx, p.ID, "ch_"+p.ID.String())
	return err
}

// processCPU reads the CPU time of this process (its own, not its children's: pgbench is not
// kasa) and of the PostgreSQL server (the postmaster, its backends and the ended ones).
//
// classPGBench is the CPU of this process's ended children: pgbench and psql.
const classPGBench = "pgbench"

func processCPU(postmaster int) func() map[string]time.Duration {
	const tick = 10 * time.Millisecond // USER_HZ
	self := os.Getpid()
	return func() map[string]time.Duration {
		stats := readProcs()
		use := map[string]time.Duration{}
		for pid, st := range stats {
			switch {
			case pid == self:
				use[ClassKasa] += time.Duration(st.UTime+st.STime) * tick
				use[classPGBench] += time.Duration(st.CUTime+st.CSTime) * tick // ended children: pgbench, psql
			case pid == postmaster || descends(stats, pid, postmaster):
				use[ClassPostgres] += time.Duration(st.UTime+st.STime+uint(st.CUTime+st.CSTime)) * tick
			}
		}
		return use
	}
}

func walLSN(ctx context.Context, aux *pgxpool.Pool) int64 {
	var n int64
	_ = aux.QueryRow(ctx, "SELECT (pg_current_wal_lsn() - '0/0')::bigint").Scan(&n)
	return n
}

func readPostmasterPID(dataDir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
}

func loadAvg() string {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return "?"
	}
	l, err := fs.LoadAvg()
	if err != nil {
		return "?"
	}
	return fmt.Sprintf("%.2f %.2f %.2f", l.Load1, l.Load5, l.Load15)
}

// topStatements reads pg_stat_statements' costliest statements of kasa's database (per payment
// filled in by the caller).
func topStatements(ctx context.Context, aux *pgxpool.Pool, _ int) ([]StorePathStatement, error) {
	rows, err := aux.Query(ctx, `SELECT regexp_replace(s.query, '\s+', ' ', 'g'), s.calls,
	s.mean_exec_time, 100 * s.total_exec_time / nullif(sum(s.total_exec_time) OVER (), 0), s.wal_bytes::float8 / greatest(s.calls, 1)
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = current_database() AND s.query !~* '^\s*(begin|commit|rollback)'
ORDER BY s.total_exec_time DESC LIMIT 12`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var sts []StorePathStatement
	for rows.Next() {
		var st StorePathStatement
		var share *float64
		if err := rows.Scan(&st.Query, &st.Calls, &st.MeanMS, &share, &st.WALBytes); err != nil {
			return nil, err
		}
		if share != nil {
			st.SharePercent = *share
		}
		if r := []rune(st.Query); len(r) > 200 {
			st.Query = string(r[:200]) + "…"
		}
		sts = append(sts, st)
	}
	return sts, rows.Err()
}

// windowed are the tables whose rows retention deletes after a window; the rest are kept.
var windowed = map[string]string{
	"idempotency_records": "72h (KASA_IDEMPOTENCY_RETENTION)", "outbox": "7 days", "inbox": "7 days",
	"webhook_deliveries": "7 days", "webhook_attempts": "7 days",
}

// storePathSizes measures each table's bytes per payment with every row still there, then runs
// retention (a window of zero) and counts what of the windowed tables it left.
func storePathSizes(ctx context.Context, db *store.Store, aux *pgxpool.Pool, dbURL string, payments int64, rep *StorePathReport) error {
	if payments == 0 {
		return nil
	}
	if _, err := PSQL(ctx, dbURL, []byte("VACUUM (ANALYZE);")); err != nil {
		return err
	}
	sizes, err := db.Sizes(ctx)
	if err != nil {
		return err
	}
	for _, t := range sizes {
		kept, ok := windowed[t.Table]
		if !ok {
			kept = "forever"
		}
		st := StorePathTable{Table: t.Table, TableBytes: float64(t.TableBytes) / float64(payments), IndexBytes: float64(t.IndexBytes) / float64(payments), Kept: kept}
		if st.TableBytes+st.IndexBytes < 1 {
			continue // merchants, keys, accounts: the fixture's, not the payments'
		}
		rep.Tables = append(rep.Tables, st)
		if ok {
			rep.BytesWindowed += st.TableBytes + st.IndexBytes
		} else {
			rep.BytesKept += st.TableBytes + st.IndexBytes
		}
	}
	if _, err := db.DeleteExpiredRecords(ctx, 0, 10_000); err != nil {
		return err
	}
	if _, err := db.PurgeEvents(ctx, 0, 10_000); err != nil {
		return err
	}
	var left int64
	err = aux.QueryRow(ctx, `SELECT (SELECT count(*) FROM idempotency_records) + (SELECT count(*) FROM outbox)
		+ (SELECT count(*) FROM inbox) + (SELECT count(*) FROM webhook_deliveries)`).Scan(&left)
	rep.Retained = left
	return err
}

func storePathRatios(rep *StorePathReport) {
	by := map[int]StorePathRun{}
	for _, r := range rep.Runs {
		by[r.Merchants] = r
	}
	most := slices.Max(slices.Collect(func(yield func(int) bool) {
		for n := range by {
			if !yield(n) {
				return
			}
		}
	}))
	p, m := rep.PGBench["P"], rep.PGBench["M"]
	if m.TPS > 0 {
		rep.Ratios["P/M"] = p.TPS / m.TPS
	}
	if c := rep.PGBenchCPUMS; c["P"] > 0 {
		rep.Ratios["P/M by PostgreSQL CPU"] = c["M"] / c["P"]
	}
	if p.TPS > 0 {
		rep.Ratios["store/P"] = by[most].Rate / p.TPS
	}
	if one, ok := by[1]; ok && most != 1 && by[most].Rate > 0 {
		rep.Ratios[fmt.Sprintf("one/%d", most)] = one.Rate / by[most].Rate
	}
	if c := by[most].CPUMS; c != nil {
		rep.KasaCPUMS = c[ClassKasa] + c[ClassPostgres]
	}
}

// StorePathMarkdown renders the report.
func StorePathMarkdown(rep *StorePathReport) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# kasa bench --store-path, %s\n\n", rep.Started.Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&b, "Machine: %s; commit %s; load average %s. %d clients; kasa's store steps (Begin, Reserve, Finalize) "+
		"with the relay, the webhook consumer and the sender running (embedded NATS, webhooks to a local 204 endpoint), "+
		"no Temporal.\n\n", rep.Machine, rep.Commit, rep.Load, rep.Clients)
	b.WriteString("| run | merchants | payments/s | p50 ms | p99 ms | errors | kasa CPU ms/payment | PostgreSQL CPU ms/payment | WAL bytes/payment |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rep.Runs {
		fmt.Fprintf(&b, "| store path | %d | %.0f | %.2f | %.2f | %d | %.2f | %.2f | %.0f |\n", r.Merchants, r.Rate, r.P50MS, r.P99MS, r.Errors,
			r.CPUMS[ClassKasa], r.CPUMS[ClassPostgres], r.WALBytes)
	}
	for _, name := range []string{"P", "M"} {
		if r, ok := rep.PGBench[name]; ok {
			fmt.Fprintf(&b, "| pgbench %s (%s) | %d | %.0f | %.2f | %.2f | %d | (pgbench: %.2f) | %.2f | |\n", name, r.Script, most(rep), r.TPS, r.P50MS, r.P99MS, r.Failed,
				rep.PGBenchCPUMS[name+" client"], rep.PGBenchCPUMS[name])
		}
	}
	b.WriteString("\n| ratio | value | target |\n|---|---:|---:|\n")
	targets := map[string]string{"P/M": "≥ 0.8", "store/P": "≥ 0.7", "P/M by PostgreSQL CPU": "(M's CPU per payment ÷ P's)"}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range rep.Ratios {
			if !yield(k) {
				return
			}
		}
	}) {
		t, ok := targets[k]
		if !ok && strings.HasPrefix(k, "one/") {
			t = "≥ 0.9"
		}
		fmt.Fprintf(&b, "| %s | %.2f | %s |\n", k, rep.Ratios[k], t)
	}
	fmt.Fprintf(&b, "\nkasa's own CPU per payment (this process + PostgreSQL, largest merchant count): %.2f ms.\n", rep.KasaCPUMS)
	for _, k := range []string{"store", "P", "M"} {
		if len(rep.Statements[k]) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n## Costliest statements, %s (pg_stat_statements)\n\n| share %% | calls | calls/payment | mean ms | WAL bytes/call | statement |\n|---:|---:|---:|---:|---:|---|\n",
			map[string]string{"store": "store path (window of the run with the most merchants)", "P": "pgbench P (the whole run)", "M": "pgbench M (the whole run)"}[k])
		for _, s := range rep.Statements[k] {
			fmt.Fprintf(&b, "| %.1f | %d | %.2f | %.3f | %.0f | `%s` |\n", s.SharePercent, s.Calls, s.PerPayment, s.MeanMS, s.WALBytes, strings.ReplaceAll(s.Query, "|", "\\|"))
		}
	}
	if len(rep.Tables) > 0 {
		b.WriteString("\n## Bytes per payment (all rows present, after VACUUM)\n\n| table | table bytes | index bytes | kept |\n|---|---:|---:|---|\n")
		for _, t := range rep.Tables {
			fmt.Fprintf(&b, "| %s | %.0f | %.0f | %s |\n", t.Table, t.TableBytes, t.IndexBytes, t.Kept)
		}
		fmt.Fprintf(&b, "\nKept for good: %.0f bytes per payment; kept for a retention window: %.0f. Rows of the windowed tables left after retention with a window of zero: %d.\n",
			rep.BytesKept, rep.BytesWindowed, rep.Retained)
	}
	fmt.Fprintf(&b, "\nWebhooks delivered: %d. kasa verify: %s.\n", rep.Webhooks, map[bool]string{true: "clean", false: fmt.Sprint(rep.Problems)}[len(rep.Problems) == 0])
	return b.String()
}

// most is the largest merchant count of the report's runs.
func most(rep *StorePathReport) int {
	n := 0
	for _, r := range rep.Runs {
		n = max(n, r.Merchants)
	}
	return n
}
