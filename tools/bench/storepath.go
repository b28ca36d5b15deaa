package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/kasa-pay/kasa/outbox"
	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/store/pgstats"
	"github.com/kasa-pay/kasa/tools/devenv"
)

// The store path: kasa's own data path at PostgreSQL speed, without Temporal. Clients run a
// payment's store steps (Begin, Reserve, Finalize with its outbox row) back to back while the
// relay, the webhook consumer and the webhook sender run against an embedded NATS and deliver
// to a local endpoint that answers 204, all in this process, on a PostgreSQL of its own. Beside
// it, on the same PostgreSQL: pgbench's ceiling P (payment.sql, the same statements) and the
// minimal sketch M (minimal.sql).

// StorePathOptions describe a store-path run; `kasa bench --store-path`'s flags give the defaults.
type StorePathOptions struct {
	Clients   int           // goroutines running payments, and pgbench clients for P and M
	Duration  time.Duration // measured window of each run
	Warmup    time.Duration // load before each window, not measured
	Merchants []int         // one run per count
	PGBench   bool          // run P and M (Duration each, the largest merchant count, Clients clients)
	Progress  func(format string, args ...any)
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
	CPUMS    map[string]float64 `json:"cpu_ms_per_payment,omitempty"`
	WALBytes float64            `json:"wal_bytes_per_payment"` // the WAL the cluster wrote in the window
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
	dir, err := os.MkdirTemp("", "kasa-store-path-") // PostgreSQL's and NATS's data
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	rep := &StorePathReport{Started: time.Now().UTC(), Clients: o.Clients, Ratios: map[string]float64{}, Load: LoadAvg(),
		Statements: map[string][]StorePathStatement{}}
	o.Progress("starting PostgreSQL in %s", dir)
	pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: filepath.Join(dir, "postgres"), Database: storePathDB,
		Settings: append(slices.Clone(pgstats.Settings), "max_connections=200"),
		Logger:   slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	defer pg.Stop()
	db, err := store.Open(ctx, store.Options{URL: pg.URL, SecretKey: make([]byte, 32), Migrate: true, MaxConns: int32(o.Clients + 8)})
	if err != nil {
		return nil, err
	}
	defer db.Close()
	// The server's statistics (WAL, pg_stat_statements), read apart from kasa's database.
	aux, err := pgstats.Open(ctx, pg.URL)
	if err != nil {
		return nil, err
	}
	defer aux.Close()

	// The event pipeline, as kasa runs it: relay, consumer and sender, NATS embedded.
	var webhooks atomic.Int64
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		webhooks.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer hook.Close()
	natsURL, stopNATS, err := outbox.StartEmbedded(filepath.Join(dir, "nats"))
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
	if err := Settle(ctx, pg.URL); err != nil {
		return nil, err
	}
	cpu := StackCPU(0, []int{pg.Process().PID()}, nil) // this process is class bench: kasa's store steps and pipeline
	if o.PGBench {
		rep.PGBench, rep.PGBenchCPUMS = map[string]PGBenchResult{}, map[string]float64{}
		for _, s := range []struct{ name, script string }{{"M", PGBenchMinimal}, {"P", PGBenchPayment}} {
			o.Progress("pgbench %s (%s), %d clients, %d merchants", s.name, s.script, o.Clients, most)
			if err := aux.ResetStatements(ctx); err != nil {
				return nil, err
			}
			before, client := cpu()[ClassPostgres], childrenCPU()
			r, err := PGBench(ctx, PGBenchOptions{DatabaseURL: pg.URL, Clients: o.Clients, Duration: o.Duration, Script: s.script, Rows: most})
			if err != nil {
				return nil, err
			}
			postgres, client := cpu()[ClassPostgres]-before, childrenCPU()-client
			txs, err := aux.Transactions(ctx, storePathDB)
			if err != nil {
				return nil, err
			}
			if txs > 0 {
				rep.PGBenchCPUMS[s.name] = float64(postgres) / float64(time.Millisecond) / float64(txs)
				rep.PGBenchCPUMS[s.name+" client"] = float64(client) / float64(time.Millisecond) / float64(txs)
			}
			rep.PGBench[s.name] = r
			if rep.Statements[s.name], err = topStatements(ctx, aux); err != nil {
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
	counts, err := db.ReportCounts(ctx)
	if err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(2 * time.Minute); webhooks.Load() < counts.Payments && time.Now().Before(deadline); {
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
	if rep.Webhooks < counts.Payments {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%d of %d webhooks delivered", rep.Webhooks, counts.Payments))
	}
	rep.Correct = len(rep.Problems) == 0
	if err := storePathSizes(ctx, db, pg.URL, counts.Payments, rep); err != nil {
		return nil, err
	}
	storePathRatios(rep, most)
	rep.Load += " → " + LoadAvg()
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
	return ms, parallel(ctx, n, 8, func(ctx context.Context, i int) error {
		m := storePathMerchant{id: payment.NewID()}
		if err := db.CreateMerchant(ctx, payment.Merchant{ID: m.id, Name: "store-path-" + strconv.Itoa(i), WebhookURL: hookURL},
			payment.NewSecret("sk_"), payment.NewSecret("whsec_")); err != nil {
			return err
		}
		for range map[bool]int{true: hotPayers, false: 1}[i == 0] {
			a, err := db.CreateAccount(ctx, m.id, "TRY")
			if err != nil {
				return err
			}
			if _, _, err := db.Deposit(ctx, a.ID, "seed", 1_000_000_000_000); err != nil {
				return err
			}
			m.payers = append(m.payers, a.ID)
		}
		ms[i] = m
		return nil
	})
}

// storePathRun runs o.Clients clients paying the merchants in turn through the warmup and the
// window, measured as Run measures; with statements, also the costliest statements of the window.
func storePathRun(ctx context.Context, db *store.Store, aux *pgstats.Server, merchants []storePathMerchant, o StorePathOptions,
	cpu CPU, statements bool) (StorePathRun, []StorePathStatement, error) {
	wal := func(ctx context.Context) (map[string]int64, error) {
		lsn, err := aux.WALBytes(ctx)
		return map[string]int64{"wal": lsn}, err
	}
	r := newRunner(Options{Concurrency: o.Clients, Warmup: o.Warmup, Duration: o.Duration, CPU: cpu, Counters: wal}, nil)
	var next atomic.Int64
	r.op = func(ctx context.Context) outcome {
		i := int(next.Add(1) - 1)
		m := merchants[i%len(merchants)]
		err := storePathPayment(ctx, db, m.id, m.payers[(i/len(merchants))%len(m.payers)])
		return outcome{done: time.Now(), err: err}
	}
	var sts []StorePathStatement
	var g errgroup.Group
	g.Go(func() error { // pg_stat_statements of the window alone
		if !statements || sleep(ctx, o.Warmup) != nil {
			return nil
		}
		if err := aux.ResetStatements(ctx); err != nil || sleep(ctx, o.Duration) != nil {
			return err
		}
		var err error
		sts, err = topStatements(ctx, aux)
		return err
	})
	res, err := r.measure(ctx)
	if err := errors.Join(err, g.Wait()); err != nil {
		return StorePathRun{}, nil, err
	}
	if res.Errors > 0 && res.Requests == 0 {
		return StorePathRun{}, nil, fmt.Errorf("store path: every payment failed: %s", res.FirstError)
	}
	run := StorePathRun{Merchants: len(merchants), Duration: res.Duration, Payments: res.Requests, Rate: res.Throughput, Errors: res.Errors,
		P50MS: res.Latency.P50, P99MS: res.Latency.P99, WALBytes: res.PerOp["wal"]}
	if res.CPU != nil {
		run.CPUMS = map[string]float64{ClassKasa: res.CPU.MS[ClassBench], ClassPostgres: res.CPU.MS[ClassPostgres]}
	}
	for i := range sts {
		sts[i].PerPayment = float64(sts[i].Calls) / float64(max(run.Payments, 1))
	}
	return run, sts, nil
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

// storePathDB is the database the store path measures.
const storePathDB = "kasa"

// topStatements are the costliest statements of kasa's database (per payment filled in by the
// caller).
func topStatements(ctx context.Context, aux *pgstats.Server) ([]StorePathStatement, error) {
	sts, err := aux.TopStatements(ctx, storePathDB, 12)
	out := make([]StorePathStatement, len(sts))
	for i, st := range sts {
		out[i] = StorePathStatement{Query: st.Query, Calls: st.Calls, MeanMS: st.MeanMS, SharePercent: st.SharePercent, WALBytes: st.WALBytes}
	}
	return out, err
}

// windowed are the tables whose rows retention deletes after a window; the rest are kept.
var windowed = map[string]string{
	"idempotency_records": "72h (KASA_IDEMPOTENCY_RETENTION)", "outbox": "7 days", "inbox": "7 days",
	"webhook_deliveries": "7 days", "webhook_attempts": "7 days",
}

// storePathSizes measures each table's bytes per payment with every row still there, then runs
// retention (a window of zero) and counts what of the windowed tables it left.
func storePathSizes(ctx context.Context, db *store.Store, dbURL string, payments int64, rep *StorePathReport) error {
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
		st := StorePathTable{Table: t.Table, TableBytes: float64(t.TableBytes) / float64(payments), IndexBytes: float64(t.IndexBytes) / float64(payments), Kept: kept}
		switch {
		case st.TableBytes+st.IndexBytes < 1:
			continue // merchants, keys, accounts: the fixture's, not the payments'
		case ok:
			rep.BytesWindowed += st.TableBytes + st.IndexBytes
		default:
			st.Kept = "forever"
			rep.BytesKept += st.TableBytes + st.IndexBytes
		}
		rep.Tables = append(rep.Tables, st)
	}
	if _, err := db.DeleteExpiredRecords(ctx, 0, 10_000); err != nil {
		return err
	}
	if _, err := db.PurgeEvents(ctx, 0, 10_000); err != nil {
		return err
	}
	left, err := db.ReportCounts(ctx)
	rep.Retained = left.Windowed
	return err
}

func storePathRatios(rep *StorePathReport, most int) {
	by := map[int]StorePathRun{}
	for _, r := range rep.Runs {
		by[r.Merchants] = r
	}
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
