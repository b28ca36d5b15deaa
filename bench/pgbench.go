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
// nothing else in the way (no HTTP, no Temporal). See pgbench/*.sql: each script names the store
// constants it mirrors, and TestPGBenchScriptsMirrorStore fails when they drift apart.
//
//go:embed pgbench/*.sql
var pgbenchScripts embed.FS

// PGBench scripts.
const (
	// PGBenchPayment is one new payment's whole database work (API, worker, API), as one pgbench
	// transaction made of its several database transactions.
	PGBenchPayment = "payment"
	// PGBenchReplay is the replay lookup: the single query that finds a finished payment's
	// idempotency record and stored answer by (merchant, key).
	PGBenchReplay = "replay"
	// PGBenchReplayPath is all of a replayed request's database work as the API does it today:
	// the API key lookup, store.Begin's transaction that finds the key taken, and the lookup.
	PGBenchReplayPath = "replay-path"
)

// PGBenchOptions describe one pgbench run. Zero values get the defaults noted.
type PGBenchOptions struct {
	DatabaseURL string        // postgres:// URL of kasa's database; the fixture lives in a schema of its own there
	Clients     int           // pgbench clients (connections); default 16
	Duration    time.Duration // rounded up to whole seconds; default 10s
	Script      string        // PGBenchPayment, PGBenchReplay or PGBenchReplayPath
	// Rows sizes the fixture: merchants, each with a settlement account and Payers payer accounts,
	// for the payment script; finished payments (completed idempotency records) to replay. Default 1000.
	Rows   int
	Payers int // payer accounts per merchant; default 1
}

// PGBenchResult is what pgbench measured. One transaction is one run of the script: for the
// payment script a whole payment (several database transactions).
type PGBenchResult struct {
	Script       string  `json:"script"`
	Clients      int     `json:"clients"`
	Duration     float64 `json:"duration_s"`
	TPS          float64 `json:"tps"` // pgbench's, without the initial connection time
	LatencyAvgMS float64 `json:"latency_avg_ms"`
	P50MS        float64 `json:"p50_ms"` // from the per-transaction log (pgbench -l)
	P99MS        float64 `json:"p99_ms"`
	MaxMS        float64 `json:"max_ms"`
	Transactions int64   `json:"transactions"`
	Failed       int64   `json:"failed"`
}

const (
	pgbenchSchemaPrefix = "kasa_pgbench_"
	// Replay keys are numbers (pgbench variables hold numbers): 19 digits, like key_base+i.
	pgbenchKeyBase = 1_000_000_000_000_000_000
	pgbenchLease   = "1m0s" // time.Minute.String(), as store.Begin sends the lease
	cleanupTimeout = time.Minute
	maxStderr      = 4 << 10
)

// PGBench prepares a fixture in a schema of its own (a clone of the tables a payment touches, with
// their indexes, constraints, foreign keys and triggers; kasa's tables are never written), runs
// pgbench with the script at the client count, and drops the schema again.
func PGBench(ctx context.Context, o PGBenchOptions) (PGBenchResult, error) {
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
		_ = dropPGBenchSchema(cctx, o.DatabaseURL, schema)
	}()
	// The scripts' unqualified names must reach the clones, never kasa's tables.
	got, err := psql(ctx, benchURL, nil, "-A", "-t", "-c", "SELECT current_schema()")
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
	secs := int(math.Ceil(o.Duration.Seconds()))
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
	r, err := parsePGBenchOutput(stdout.String())
	if err != nil {
		return PGBenchResult{}, fmt.Errorf("%w\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), tail(stderr.String()))
	}
	r.Script, r.Clients, r.Duration = o.Script, o.Clients, float64(secs)
	lat, failed, err := readPGBenchLogs(filepath.Join(dir, "tx"))
	if err != nil {
		return PGBenchResult{}, err
	}
	r.Failed = max(r.Failed, failed)
	if len(lat) > 0 {
		slices.Sort(lat)
		r.P50MS, r.P99MS, r.MaxMS = quantileMS(lat, 0.50), quantileMS(lat, 0.99), quantileMS(lat, 1)
	}
	return r, nil
}

func (o PGBenchOptions) withDefaults() PGBenchOptions {
	if o.Clients <= 0 {
		o.Clients = 16
	}
	if o.Duration <= 0 {
		o.Duration = 10 * time.Second
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
	hash := sha256.Sum256([]byte("replay"))
	return []string{
		"merchants=" + strconv.Itoa(o.Rows),
		"payers=" + strconv.Itoa(o.Payers),
		"records=" + strconv.Itoa(o.Rows),
		"key_base=" + strconv.FormatInt(pgbenchKeyBase, 10),
		"merchant_id=" + md5UUID("merchant/1"),
		"api_key_hash=\\x" + hex.EncodeToString(sum[:]),
		"account_id=" + md5UUID("payer/1/1"),
		"request_hash=" + hex.EncodeToString(hash[:]),
		"op_id=00000000-0000-7000-8000-000000000000", // never a record's: the replayed insert does nothing
		"lease=" + pgbenchLease,
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
	_, err = psql(ctx, o.DatabaseURL, sql, "-1",
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
	_, err := psql(ctx, dbURL, nil, "-c", `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`)
	return err
}

// psql runs psql without ~/.psqlrc, stopping at the first error, with stdin when given.
func psql(ctx context.Context, dbURL string, stdin []byte, args ...string) (string, error) {
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

// readPGBenchLogs reads the per-transaction logs pgbench -l wrote (prefix.pid, prefix.pid.thread):
// "client_id transaction_no time script_no time_epoch time_us", time being the latency in µs or
// a word (failed, serialization, deadlock, skipped) for a transaction that did not complete.
func readPGBenchLogs(prefix string) (latencies []int64, failed int64, err error) {
	files, err := filepath.Glob(prefix + ".*")
	if err != nil {
		return nil, 0, err
	}
	if len(files) == 0 {
		return nil, 0, errors.New("pgbench: no transaction log written")
	}
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, 0, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 3 {
				continue
			}
			us, err := strconv.ParseInt(fields[2], 10, 64)
			if err != nil {
				if fields[2] != "skipped" {
					failed++
				}
				continue
			}
			latencies = append(latencies, us)
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return nil, 0, err
		}
	}
	return latencies, failed, nil
}

// quantileMS is the nearest-rank q-quantile of sorted latencies in µs, in ms.
func quantileMS(latencies []int64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(latencies)))) - 1
	i = min(max(i, 0), len(latencies)-1)
	return float64(latencies[i]) / 1000
}
