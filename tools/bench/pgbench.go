package bench

import (
	"context"
	"crypto/md5"
	"embed"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/tools/devenv"
)

// The database ceilings: pgbench runs kasa's own SQL with nothing else in the way. The scripts
// pgbench/*.sql are generated from pgbench/src/*.sql and store/queries/*.sql (make generate).
//
//go:embed pgbench/*.sql pgbench/psql/*.sql
var pgbenchScripts embed.FS

// PGBench scripts: one new payment's whole database work (API, worker, API) as one pgbench
// transaction; and the replay lookup, the single query that finds a finished payment's
// idempotency record and stored answer.
const (
	PGBenchPayment = "payment"
	PGBenchReplay  = "replay"
	// PGBenchAccept is what the API commits to accept a payment in a burst: the payday's P.
	PGBenchAccept = "accept"
	// PGBenchMinimal is the seed's design of a payment in three commits on the fewest tables
	// (minimal-setup.sql): the floor the payment script is compared with.
	PGBenchMinimal = "minimal"
)

// PGBenchOptions describe one pgbench run. Zero values get the defaults noted.
type PGBenchOptions struct {
	DatabaseURL string        // postgres:// URL of kasa's database; the fixture lives in a schema of its own there
	Clients     int           // pgbench clients (connections); default 16
	Duration    time.Duration // measured window, after pgbenchWarmup; default 10s
	Script      string        // PGBenchPayment or PGBenchReplay
	// Rows sizes the fixture: merchants, each with a settlement and a payer account, for the
	// payment script; finished payments to replay. Default 1000.
	Rows int
}

// PGBenchResult is what pgbench measured in the window after the warmup, from its
// per-transaction log (pgbench -l). One transaction is one run of the script.
type PGBenchResult struct {
	Script       string  `json:"script"`
	Clients      int     `json:"clients"`
	Duration     float64 `json:"duration_s"` // the measured window
	TPS          float64 `json:"tps"`        // transactions completed in the window per second
	LatencyAvgMS float64 `json:"latency_avg_ms"`
	P50MS        float64 `json:"p50_ms"`
	P99MS        float64 `json:"p99_ms"`
	MaxMS        float64 `json:"max_ms"`
	Transactions int64   `json:"transactions"` // completed in the window
	Failed       int64   `json:"failed"`       // failed in the window
}

const (
	// pgbenchWarmup runs before the measured window, which also waits for each client's first
	// warmTransactions: PostgreSQL plans a prepared statement afresh on its first five executions,
	// and a new backend fills its caches, which kasa's long-lived pooled connections did long before.
	pgbenchWarmup    = time.Second
	warmTransactions = 5
	// Replay keys are numbers (pgbench variables hold numbers): 19 digits, like key_base+i.
	pgbenchKeyBase = 1_000_000_000_000_000_000
)

// PGBench runs the script in a fixture schema of its own (clones of the tables a payment touches,
// with their indexes, constraints, foreign keys and triggers: kasa's are never written).
func PGBench(ctx context.Context, o PGBenchOptions) (_ PGBenchResult, err error) {
	o.Clients, o.Duration, o.Rows = orDefault(o.Clients, 16), orDefault(o.Duration, 10*time.Second), orDefault(o.Rows, 1000)
	script, err := pgbenchScripts.ReadFile("pgbench/" + o.Script + ".sql")
	if err != nil || !slices.Contains([]string{PGBenchPayment, PGBenchAccept, PGBenchReplay, PGBenchMinimal}, o.Script) {
		return PGBenchResult{}, fmt.Errorf("pgbench: unknown script %q (%s, %s, %s or %s)", o.Script, PGBenchPayment, PGBenchAccept, PGBenchReplay, PGBenchMinimal)
	}
	setup := "setup"
	if o.Script == PGBenchMinimal {
		setup = "minimal-setup"
	}
	pgbench, err := devenv.PostgresTool("pgbench")
	if err != nil {
		return PGBenchResult{}, err
	}
	schema, vars := fmt.Sprintf("kasa_pgbench_%08x", rand.Uint32()), pgbenchVariables(o.Rows)
	benchURL, err := withSearchPath(o.DatabaseURL, schema)
	if err != nil {
		return PGBenchResult{}, err
	}
	if err := setupPGBenchFixture(ctx, o.DatabaseURL, setup, schema, vars); err != nil {
		return PGBenchResult{}, err
	}
	defer func() {
		// Also after a cancelled run: the fixture must not outlive it.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if _, derr := psqlScript(cctx, o.DatabaseURL, "psql/drop", "-v", "schema="+schema); derr != nil && err == nil {
			err = fmt.Errorf("pgbench: drop the fixture schema %s: %w", schema, derr)
		}
	}()
	// The scripts' unqualified names must reach the clones, never kasa's tables.
	got, err := psqlScript(ctx, benchURL, "psql/current-schema", "-A", "-t")
	if err != nil {
		return PGBenchResult{}, err
	}
	if got = strings.TrimSpace(got); got != schema {
		return PGBenchResult{}, fmt.Errorf("pgbench: sessions would use schema %q, not the fixture's %q: does the database URL set options=-csearch_path?", got, schema)
	}
	dir, err := os.MkdirTemp("", "kasa-pgbench-")
	if err != nil {
		return PGBenchResult{}, err
	}
	defer os.RemoveAll(dir)
	args := []string{"-n", "-M", "prepared", "-f", "-", "-c", strconv.Itoa(o.Clients), "-j", strconv.Itoa(min(o.Clients, 2)),
		"-T", strconv.Itoa(int(math.Ceil((pgbenchWarmup + o.Duration).Seconds()))), "-l", "--log-prefix", filepath.Join(dir, "tx")}
	for _, kv := range vars {
		args = append(args, "-D", kv)
	}
	if _, err := (devenv.Command{Stdin: script}).Run(ctx, pgbench, append(args, benchURL)...); err != nil {
		return PGBenchResult{}, fmt.Errorf("pgbench %s: %w", o.Script, err)
	}
	txs, err := readPGBenchLogs(filepath.Join(dir, "tx"))
	if err != nil {
		return PGBenchResult{}, err
	}
	r := summarize(txs, pgbenchWarmup)
	if r.Transactions == 0 {
		return PGBenchResult{}, fmt.Errorf("pgbench %s: no transaction completed after the warmup (%d in all): lengthen Duration", o.Script, len(txs))
	}
	r.Script, r.Clients = o.Script, o.Clients
	return r, nil
}

// pgbenchVariables are the fixture's sizes as setup.sql takes them and every script may use, and
// for the replay script, merchant 1's id as setup.sql derives it.
func pgbenchVariables(rows int) []string {
	return []string{
		"merchants=" + strconv.Itoa(rows), "payers=1", "records=" + strconv.Itoa(rows), "key_base=" + strconv.FormatInt(pgbenchKeyBase, 10),
		"merchant_id=" + uuid.UUID(md5.Sum([]byte("merchant/1"))).String(), // md5('merchant/1')::uuid
	}
}

// withSearchPath returns the URL with the schema as the sessions' search_path (libpq's options).
func withSearchPath(raw, schema string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", errors.New("pgbench: the database url must be a postgres:// URL")
	}
	q := u.Query()
	q.Set("options", strings.TrimSpace(q.Get("options")+" -c search_path="+schema))
	// libpq decodes %XX in a URI, not '+': spaces must be %20 (Encode writes a '+' itself as %2B).
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
	return u.String(), nil
}

// setupPGBenchFixture creates the schema and its fixture (the script setup), of the sizes vars gives.
func setupPGBenchFixture(ctx context.Context, dbURL, setup, schema string, vars []string) error {
	args := []string{"-1", "-v", "schema=" + schema}
	for _, kv := range vars {
		args = append(args, "-v", kv)
	}
	if _, err := psqlScript(ctx, dbURL, setup, args...); err != nil {
		return fmt.Errorf("pgbench fixture: %w", err)
	}
	return nil
}

// psqlScript runs the embedded pgbench/name.sql through psql.
func psqlScript(ctx context.Context, dbURL, name string, args ...string) (string, error) {
	sql, err := pgbenchScripts.ReadFile("pgbench/" + name + ".sql")
	if err != nil {
		return "", err
	}
	return PSQL(ctx, dbURL, sql, args...)
}

// Settle runs psql/settle.sql: the vacuum and checkpoint a bulk of writes leaves for later, done
// now so that whatever is measured next does not pay for them.
func Settle(ctx context.Context, dbURL string) error {
	_, err := psqlScript(ctx, dbURL, "psql/settle")
	return err
}

// PSQL runs the script sql through psql, without ~/.psqlrc and stopping at the first error.
func PSQL(ctx context.Context, dbURL string, sql []byte, args ...string) (string, error) {
	bin, err := devenv.PostgresTool("psql")
	if err != nil {
		return "", err
	}
	out, err := devenv.Command{Stdin: sql}.Run(ctx, bin, append([]string{"-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dbURL, "-f", "-"}, args...)...)
	if err != nil {
		return "", fmt.Errorf("psql: %w", err)
	}
	return out, nil
}

// pgbenchTx is one line of pgbench's per-transaction log.
type pgbenchTx struct {
	client, n    int           // the client's n-th transaction, from 1
	end, latency time.Duration // end: since the Unix epoch
	failed       bool
}

// readPGBenchLogs reads the per-transaction logs pgbench -l wrote (prefix.pid, prefix.pid.thread):
// "client_id transaction_no time script_no time_epoch time_us", time being the latency in µs or
// a word (failed, serialization, deadlock, skipped) for a transaction that did not complete, and
// time_epoch.time_us when it ended.
func readPGBenchLogs(prefix string) ([]pgbenchTx, error) {
	files, _ := filepath.Glob(prefix + ".*")
	if len(files) == 0 {
		return nil, errors.New("pgbench: no transaction log written")
	}
	var txs []pgbenchTx
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			return nil, err
		}
		for line := range strings.Lines(string(b)) {
			var tx pgbenchTx
			var lat string
			var script, sec, usec int64
			if _, err := fmt.Sscan(line, &tx.client, &tx.n, &lat, &script, &sec, &usec); err != nil {
				return nil, fmt.Errorf("pgbench log %s: %q: %w", name, line, err)
			}
			us, err := strconv.ParseInt(lat, 10, 64)
			if lat != "skipped" {
				tx.end, tx.latency, tx.failed = time.Duration(sec)*time.Second+time.Duration(usec)*time.Microsecond, time.Duration(us)*time.Microsecond, err != nil
				txs = append(txs, tx)
			}
		}
	}
	return txs, nil
}

// summarize measures the transactions that ended in the window that opens once warmup has passed
// and every client has done its warmTransactions, and closes when the last transaction ends.
func summarize(txs []pgbenchTx, warmup time.Duration) (r PGBenchResult) {
	if len(txs) == 0 {
		return r
	}
	start, to, warm := txs[0].end, txs[0].end, time.Duration(0)
	for _, tx := range txs {
		start, to = min(start, tx.end-tx.latency), max(to, tx.end)
		if tx.n == warmTransactions {
			warm = max(warm, tx.end)
		}
	}
	from := max(start+warmup, warm)
	if from >= to { // a machine too busy for every client to warm up within the run: the time alone counts
		from = start + warmup
	}
	r.Duration = (to - from).Seconds()
	var lat []time.Duration
	var sum time.Duration
	for _, tx := range txs {
		switch {
		case tx.end <= from:
		case tx.failed:
			r.Failed++
		default:
			lat, sum = append(lat, tx.latency), sum+tx.latency
		}
	}
	if r.Transactions = int64(len(lat)); len(lat) == 0 || r.Duration <= 0 {
		return r
	}
	l := latencyOf(lat)
	r.TPS, r.LatencyAvgMS = float64(len(lat))/r.Duration, float64(sum)/float64(len(lat))/1e6
	r.P50MS, r.P99MS, r.MaxMS = l.P50, l.P99, l.Max
	return r
}
