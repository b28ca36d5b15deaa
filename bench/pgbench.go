package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/md5"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The database ceilings of a benchmark: pgbench runs kasa's own SQL, statement for statement, with
// nothing else in the way (no HTTP, no Temporal). The scripts pgbench/*.sql are generated from
// pgbench/src/*.sql and store/queries/*.sql (make generate), so they run the very statements
// kasa runs.
//
//go:embed pgbench/*.sql pgbench/psql/*.sql
var pgbenchScripts embed.FS

// PGBench scripts.
const (
	// PGBenchPayment is one new payment's whole database work (API, worker, API), as one pgbench
	// transaction made of its several database transactions.
	PGBenchPayment = "payment"
	// PGBenchReplay is the replay lookup: the single query that finds a finished payment's
	// idempotency record and stored answer by (merchant, key).
	PGBenchReplay = "replay"
	// PGBenchReplayPath is all of a replayed request's database work when it misses the API's
	// in-memory cache of completed records: the API key lookup and the replay lookup.
	PGBenchReplayPath = "replay-path"
)

// PGBenchOptions describe one pgbench run. Zero values get the defaults noted.
type PGBenchOptions struct {
	DatabaseURL string        // postgres:// URL of kasa's database; the fixture lives in a schema of its own there
	Clients     int           // pgbench clients (connections); default 16
	Duration    time.Duration // measured window; Warmup+Duration is rounded up to whole seconds; default 10s
	// Warmup runs before the measured window and is not counted. The window also waits for every
	// client's first five transactions: PostgreSQL plans a prepared statement afresh on each of its
	// first five executions before it settles on a generic plan, and the backend fills its caches,
	// which kasa's long-lived pooled connections did long before (at 64 clients here, the first
	// payment of every client takes over a second). Default 1s; negative for none.
	Warmup time.Duration
	Script string // PGBenchPayment, PGBenchReplay or PGBenchReplayPath
	// Rows sizes the fixture: merchants, each with a settlement account and Payers payer accounts,
	// for the payment script; finished payments (completed idempotency records) to replay. Default 1000.
	Rows   int
	Payers int // payer accounts per merchant; default 1
}

// PGBenchResult is what pgbench measured in the window after the warmup, from its
// per-transaction log (pgbench -l). One transaction is one run of the script: for the payment
// script a whole payment (several database transactions).
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
	Failed       int64   `json:"failed"`       // failed in the window (pgbench's count for the whole run when higher)
	// PGBenchTPS is pgbench's own figure for the whole run, warmup included (without the initial
	// connection time).
	PGBenchTPS float64 `json:"pgbench_tps"`
}

const (
	pgbenchSchemaPrefix = "kasa_pgbench_"
	// Replay keys are numbers (pgbench variables hold numbers): 19 digits, like key_base+i.
	pgbenchKeyBase = 1_000_000_000_000_000_000
	cleanupTimeout = time.Minute
	maxStderr      = 4 << 10
)

// PGBench prepares a fixture in a schema of its own (a clone of the tables a payment touches, with
// their indexes, constraints, foreign keys and triggers; kasa's tables are never written), runs
// pgbench with the script at the client count, and drops the schema again.
func PGBench(ctx context.Context, o PGBenchOptions) (_ PGBenchResult, err error) {
	o = o.withDefaults()
	script, err := pgbenchScripts.ReadFile("pgbench/" + o.Script + ".sql")
	if err != nil || o.Script == "setup" {
		return PGBenchResult{}, fmt.Errorf("pgbench: unknown script %q (%s, %s or %s)", o.Script, PGBenchPayment, PGBenchReplay, PGBenchReplayPath)
	}
	pgbench, err := pgTool("pgbench")
	if err != nil {
		return PGBenchResult{}, err
	}
	schema, err := newPGBenchSchema()
	if err != nil {
		return PGBenchResult{}, err
	}
	benchURL, err := withSearchPath(o.DatabaseURL, schema)
	if err != nil {
		return PGBenchResult{}, err
	}
	if err := setupPGBenchFixture(ctx, o, schema); err != nil {
		return PGBenchResult{}, err
	}
	defer func() {
		// Also after a cancelled run: the fixture must not outlive it.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if derr := dropPGBenchSchema(cctx, o.DatabaseURL, schema); derr != nil && err == nil {
			err = fmt.Errorf("pgbench: drop the fixture schema %s: %w", schema, derr)
		}
	}()
	// The scripts' unqualified names must reach the clones, never kasa's tables.
	q, err := pgbenchScripts.ReadFile("pgbench/psql/current-schema.sql")
	if err != nil {
		return PGBenchResult{}, err
	}
	got, err := PSQL(ctx, benchURL, q, "-A", "-t", "-f", "-")
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
	file := filepath.Join(dir, o.Script+".sql")
	if err := os.WriteFile(file, script, 0o644); err != nil {
		return PGBenchResult{}, err
	}
	secs := int(math.Ceil((o.Warmup + o.Duration).Seconds()))
	args := []string{"-n", "-M", "prepared", "-f", file,
		"-c", strconv.Itoa(o.Clients), "-j", strconv.Itoa(min(o.Clients, 2)), "-T", strconv.Itoa(secs),
		"-l", "--log-prefix", filepath.Join(dir, "tx")}
	for _, kv := range pgbenchVariables(o) {
		args = append(args, "-D", kv)
	}
	args = append(args, benchURL)
	cmd := exec.CommandContext(ctx, pgbench, args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return PGBenchResult{}, ctx.Err()
		}
		return PGBenchResult{}, fmt.Errorf("pgbench %s: %w: %s", o.Script, err, tail(stderr.String()))
	}
	summary, err := parsePGBenchOutput(stdout.String())
	if err != nil {
		return PGBenchResult{}, fmt.Errorf("%w\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), tail(stderr.String()))
	}
	txs, err := readPGBenchLogs(filepath.Join(dir, "tx"))
	if err != nil {
		return PGBenchResult{}, err
	}
	r := summarize(txs, o.Warmup)
	if r.Transactions == 0 {
		return PGBenchResult{}, fmt.Errorf("pgbench %s: no transaction completed after the warmup (%d in all): lengthen Duration", o.Script, summary.Transactions)
	}
	r.Script, r.Clients, r.PGBenchTPS = o.Script, o.Clients, summary.TPS
	r.Failed = max(r.Failed, summary.Failed)
	return r, nil
}

func (o PGBenchOptions) withDefaults() PGBenchOptions {
	if o.Clients <= 0 {
		o.Clients = 16
	}
	if o.Duration <= 0 {
		o.Duration = 10 * time.Second
	}
	switch {
	case o.Warmup == 0:
		o.Warmup = time.Second
	case o.Warmup < 0:
		o.Warmup = 0
	}
	if o.Rows <= 0 {
		o.Rows = 1000
	}
	if o.Payers <= 0 {
		o.Payers = 1
	}
	return o
}

// pgbenchVariables are the -D definitions every script may use: the fixture's sizes and, for the
// replay scripts, merchant 1's values as setup.sql derives them.
func pgbenchVariables(o PGBenchOptions) []string {
	sum := sha256.Sum256([]byte("sk_bench_1"))
	return []string{
		"merchants=" + strconv.Itoa(o.Rows),
		"payers=" + strconv.Itoa(o.Payers),
		"records=" + strconv.Itoa(o.Rows),
		"key_base=" + strconv.FormatInt(pgbenchKeyBase, 10),
		"merchant_id=" + md5UUID("merchant/1"),
		"api_key_hash=\\x" + hex.EncodeToString(sum[:]),
	}
}

// md5UUID is PostgreSQL's md5(s)::uuid.
func md5UUID(s string) string {
	h := md5.Sum([]byte(s))
	x := hex.EncodeToString(h[:])
	return x[:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:]
}

func newPGBenchSchema() (string, error) {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return pgbenchSchemaPrefix + hex.EncodeToString(b), nil
}

// withSearchPath returns the URL with the schema as the sessions' search_path (libpq's options).
func withSearchPath(raw, schema string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("pgbench: database url must be a postgres:// URL, got %q", redact(raw))
	}
	q := u.Query()
	opts := strings.TrimSpace(q.Get("options") + " -c search_path=" + schema)
	q.Set("options", opts)
	// libpq decodes %XX in a URI, not '+': spaces must be %20 (Encode writes a '+' itself as %2B).
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
	return u.String(), nil
}

func redact(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		return u.Redacted()
	}
	return raw
}

func setupPGBenchFixture(ctx context.Context, o PGBenchOptions, schema string) error {
	sql, err := pgbenchScripts.ReadFile("pgbench/setup.sql")
	if err != nil {
		return err
	}
	_, err = PSQL(ctx, o.DatabaseURL, sql, "-1",
		"-v", "schema="+schema,
		"-v", "merchants="+strconv.Itoa(o.Rows),
		"-v", "payers="+strconv.Itoa(o.Payers),
		"-v", "records="+strconv.Itoa(o.Rows),
		"-v", "key_base="+strconv.FormatInt(pgbenchKeyBase, 10),
		"-f", "-")
	if err != nil {
		return fmt.Errorf("pgbench fixture: %w", err)
	}
	return nil
}

func dropPGBenchSchema(ctx context.Context, dbURL, schema string) error {
	q, err := pgbenchScripts.ReadFile("pgbench/psql/drop.sql")
	if err != nil {
		return err
	}
	_, err = PSQL(ctx, dbURL, q, "-v", "schema="+schema, "-f", "-")
	return err
}

// PSQL runs psql without ~/.psqlrc, stopping at the first error, with stdin when given.
func PSQL(ctx context.Context, dbURL string, stdin []byte, args ...string) (string, error) {
	bin, err := pgTool("psql")
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, bin, append([]string{"-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dbURL}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("psql: %w: %s", err, tail(stderr.String()))
	}
	return stdout.String(), nil
}

// pgTool finds a PostgreSQL client program: on PATH, else in pg_config's bindir.
func pgTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		p := filepath.Join(strings.TrimSpace(string(out)), name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/" + name); len(m) > 0 {
		return m[len(m)-1], nil
	}
	return "", fmt.Errorf("%s not found: install the PostgreSQL client programs (Debian: apt-get install postgresql-client) or put $(pg_config --bindir) on PATH", name)
}

func tail(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > maxStderr {
		s = "..." + s[len(s)-maxStderr:]
	}
	return s
}

var (
	rePGBenchProcessed = regexp.MustCompile(`(?m)^number of transactions actually processed: (\d+)`)
	rePGBenchFailed    = regexp.MustCompile(`(?m)^number of failed transactions: (\d+)`)
	rePGBenchLatency   = regexp.MustCompile(`(?m)^latency average = ([0-9.]+) ms`)
	rePGBenchTPS       = regexp.MustCompile(`(?m)^tps = ([0-9.]+)`)
)

// parsePGBenchOutput reads pgbench's summary (PostgreSQL 14+: one tps line, failed transactions).
func parsePGBenchOutput(out string) (PGBenchResult, error) {
	var r PGBenchResult
	m := rePGBenchProcessed.FindStringSubmatch(out)
	if m == nil {
		return r, errors.New("pgbench: no \"number of transactions actually processed\" in its output")
	}
	r.Transactions, _ = strconv.ParseInt(m[1], 10, 64)
	if m := rePGBenchFailed.FindStringSubmatch(out); m != nil {
		r.Failed, _ = strconv.ParseInt(m[1], 10, 64)
	}
	if m := rePGBenchLatency.FindStringSubmatch(out); m != nil {
		r.LatencyAvgMS, _ = strconv.ParseFloat(m[1], 64)
	}
	m = rePGBenchTPS.FindStringSubmatch(out)
	if m == nil {
		return r, errors.New("pgbench: no \"tps = \" in its output")
	}
	r.TPS, _ = strconv.ParseFloat(m[1], 64)
	return r, nil
}

// pgbenchTx is one line of pgbench's per-transaction log.
type pgbenchTx struct {
	client, n int // the client's n-th transaction, from 1
	end       time.Time
	latency   time.Duration
	failed    bool
}

// warmTransactions are the transactions of each client that run before the measured window: the
// plan cache makes custom plans for a prepared statement's first five executions.
const warmTransactions = 5

// readPGBenchLogs reads the per-transaction logs pgbench -l wrote (prefix.pid, prefix.pid.thread):
// "client_id transaction_no time script_no time_epoch time_us", time being the latency in µs or
// a word (failed, serialization, deadlock, skipped) for a transaction that did not complete, and
// time_epoch.time_us when it ended.
func readPGBenchLogs(prefix string) ([]pgbenchTx, error) {
	files, err := filepath.Glob(prefix + ".*")
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, errors.New("pgbench: no transaction log written")
	}
	var txs []pgbenchTx
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 6 || fields[2] == "skipped" {
				continue
			}
			client, err1 := strconv.Atoi(fields[0])
			n, err2 := strconv.Atoi(fields[1])
			sec, err3 := strconv.ParseInt(fields[4], 10, 64)
			usec, err4 := strconv.ParseInt(fields[5], 10, 64)
			if err := errors.Join(err1, err2, err3, err4); err != nil {
				return nil, fmt.Errorf("pgbench log %s: %q: %w", name, sc.Text(), err)
			}
			tx := pgbenchTx{client: client, n: n, end: time.Unix(sec, usec*1000)}
			if us, err := strconv.ParseInt(fields[2], 10, 64); err == nil {
				tx.latency = time.Duration(us) * time.Microsecond
			} else {
				tx.failed = true
			}
			txs = append(txs, tx)
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return nil, err
		}
	}
	return txs, nil
}

// summarize measures the transactions that ended in the window that opens when warmup has passed
// since the run's first transaction began and every client has done its warmTransactions, and
// closes when the last transaction ends.
func summarize(txs []pgbenchTx, warmup time.Duration) PGBenchResult {
	var r PGBenchResult
	if len(txs) == 0 {
		return r
	}
	start, to := txs[0].end.Add(-txs[0].latency), txs[0].end
	for _, tx := range txs {
		if b := tx.end.Add(-tx.latency); b.Before(start) {
			start = b
		}
		if tx.end.After(to) {
			to = tx.end
		}
	}
	from := start.Add(warmup)
	warm := from
	for _, tx := range txs {
		if tx.n == warmTransactions && tx.end.After(warm) {
			warm = tx.end
		}
	}
	// On a machine too busy for every client to warm up within the run, the time alone counts.
	if warm.Before(to) {
		from = warm
	}
	r.Duration = to.Sub(from).Seconds()
	var lat []int64
	var sum int64
	for _, tx := range txs {
		if !tx.end.After(from) {
			continue
		}
		if tx.failed {
			r.Failed++
			continue
		}
		us := tx.latency.Microseconds()
		lat = append(lat, us)
		sum += us
	}
	r.Transactions = int64(len(lat))
	if len(lat) == 0 || r.Duration <= 0 {
		return r
	}
	r.TPS = float64(len(lat)) / r.Duration
	r.LatencyAvgMS = float64(sum) / float64(len(lat)) / 1000
	slices.Sort(lat)
	r.P50MS, r.P99MS, r.MaxMS = quantileMS(lat, 0.50), quantileMS(lat, 0.99), quantileMS(lat, 1)
	return r
}

// quantileMS is the nearest-rank q-quantile of sorted latencies in µs, in ms.
func quantileMS(latencies []int64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(latencies)))) - 1
	i = min(max(i, 0), len(latencies)-1)
	return float64(latencies[i]) / 1000
}
