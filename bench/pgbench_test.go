package bench

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/internal/testkit"
	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
)

// scriptStatement is one SQL statement of a pgbench script with the store constant it mirrors
// ("-" for a statement marked "-- not in kasa:"). BEGIN, COMMIT and ROLLBACK are left out.
type scriptStatement struct {
	mirrors string
	sql     string
	line    int
}

var (
	reMirrorsHeader = regexp.MustCompile(`^-- mirrors (.+)$`)
	reMirrorMarker  = regexp.MustCompile(`^-- store\.(sql\w+)$`)
)

// parseScript splits a pgbench script into the constants its leading comment says it mirrors and
// its SQL statements. A statement ends with ';' or with a \gset line; meta-commands are skipped.
func parseScript(t *testing.T, name, text string) (header []string, stmts []scriptStatement) {
	t.Helper()
	lines := strings.Split(text, "\n")
	for _, line := range lines {
		if !strings.HasPrefix(line, "--") {
			break
		}
		if m := reMirrorsHeader.FindStringSubmatch(line); m != nil {
			for _, c := range strings.Split(m[1], ",") {
				if c = strings.TrimSpace(c); c != "" {
					header = append(header, strings.TrimPrefix(c, "store."))
				}
			}
		}
	}
	var marker string
	var buf []string
	start := 0
	end := func() {
		sql := strings.TrimSuffix(strings.TrimSpace(strings.Join(buf, "\n")), ";")
		buf = nil
		switch strings.ToUpper(sql) {
		case "BEGIN", "COMMIT", "ROLLBACK":
			require.Empty(t, marker, "%s:%d: a transaction command carries a marker", name, start)
			return
		}
		require.NotEmpty(t, marker, "%s:%d: statement mirrors no store constant: mark it \"-- store.sqlX\" or \"-- not in kasa: why\"", name, start)
		stmts = append(stmts, scriptStatement{mirrors: marker, sql: sql, line: start})
		marker = ""
	}
	for i, line := range lines {
		trimmed := strings.TrimSpace(line)
		switch {
		case buf != nil && strings.HasPrefix(trimmed, `\gset`):
			end()
		case buf != nil:
			buf = append(buf, line)
			if strings.HasSuffix(trimmed, ";") {
				end()
			}
		case strings.HasPrefix(trimmed, "--"):
			if m := reMirrorMarker.FindStringSubmatch(trimmed); m != nil {
				marker = m[1]
			} else if strings.HasPrefix(trimmed, "-- not in kasa:") {
				marker = "-"
			}
		case trimmed == "" || strings.HasPrefix(trimmed, `\`):
		default:
			start, buf = i+1, []string{line}
			if strings.HasSuffix(trimmed, ";") {
				end()
			}
		}
	}
	require.Nil(t, buf, "%s: unterminated statement at line %d", name, start)
	return header, stmts
}

// normalizeSQL collapses whitespace and turns parameters ($n in Go, :name in pgbench; not inside
// string literals, not the :: of a cast) into '?', returning them in order.
func normalizeSQL(sql string) (string, []string) {
	sql = strings.Join(strings.Fields(sql), " ")
	var b strings.Builder
	var params []string
	ident := func(c byte) bool {
		return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
	}
	for i := 0; i < len(sql); i++ {
		c := sql[i]
		switch {
		case c == '\'':
			j := strings.IndexByte(sql[i+1:], '\'')
			if j < 0 {
				j = len(sql) - i - 1
			}
			b.WriteString(sql[i : i+j+2])
			i += j + 1
		case c == ':' && i+1 < len(sql) && sql[i+1] == ':':
			b.WriteString("::")
			i++
		case (c == ':' || c == '$') && i+1 < len(sql) && ident(sql[i+1]):
			j := i + 1
			for j < len(sql) && ident(sql[j]) {
				j++
			}
			params = append(params, sql[i+1:j])
			b.WriteByte('?')
			i = j - 1
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), params
}

// storePackage parses kasa's store package as text: its string constants (evaluated, since some
// are concatenations such as `SELECT ` + paymentColumns + ...) and, per function and method, the
// constants and package functions it names. Nothing in store has to be exported for this.
type storePackage struct {
	consts map[string]string
	uses   map[string][]string // function or method name -> sql constants and functions it names
}

func parseStore(t *testing.T) storePackage {
	t.Helper()
	exprs := map[string]ast.Expr{}
	var funcs []*ast.FuncDecl
	for _, d := range packageDecls(t, "../store") {
		switch d := d.(type) {
		case *ast.GenDecl:
			if d.Tok != token.CONST {
				continue
			}
			for _, s := range d.Specs {
				vs := s.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if i < len(vs.Values) {
						exprs[n.Name] = vs.Values[i]
					}
				}
			}
		case *ast.FuncDecl:
			funcs = append(funcs, d)
		}
	}
	p := storePackage{consts: map[string]string{}, uses: map[string][]string{}}
	var eval func(ast.Expr) (string, bool)
	eval = func(e ast.Expr) (string, bool) {
		switch e := e.(type) {
		case *ast.BasicLit:
			if e.Kind != token.STRING {
				return "", false
			}
			s, err := strconv.Unquote(e.Value)
			return s, err == nil
		case *ast.ParenExpr:
			return eval(e.X)
		case *ast.Ident:
			if x, ok := exprs[e.Name]; ok {
				return eval(x)
			}
		case *ast.BinaryExpr:
			if e.Op == token.ADD {
				l, ok1 := eval(e.X)
				r, ok2 := eval(e.Y)
				return l + r, ok1 && ok2
			}
		}
		return "", false
	}
	for name, e := range exprs {
		if s, ok := eval(e); ok {
			p.consts[name] = s
		}
	}
	declared := map[string]bool{}
	for _, f := range funcs {
		declared[f.Name.Name] = true
	}
	for _, f := range funcs {
		if f.Body == nil {
			continue
		}
		use := func(name string) {
			if _, isSQL := p.consts[name]; (isSQL && strings.HasPrefix(name, "sql")) || declared[name] {
				p.uses[f.Name.Name] = append(p.uses[f.Name.Name], name)
			}
		}
		var visit func(ast.Node) bool
		visit = func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.Ident:
				use(n.Name)
			case *ast.SelectorExpr:
				// A method of the store's own receivers (s *Store, t or tx *pipeTx) is followed;
				// another value's (conn.Release of pgxpool) is not, whatever its name.
				if x, ok := n.X.(*ast.Ident); ok {
					if x.Name == "s" || x.Name == "t" || x.Name == "tx" {
						use(n.Sel.Name)
					}
					return false
				}
				ast.Inspect(n.X, visit)
				return false
			}
			return true
		}
		ast.Inspect(f.Body, visit)
	}
	return p
}

// reach lists the sql constants the functions run, directly or through other store functions.
func (p storePackage) reach(roots ...string) map[string]bool {
	seen, out := map[string]bool{}, map[string]bool{}
	var walk func(string)
	walk = func(name string) {
		if seen[name] {
			return
		}
		seen[name] = true
		if _, ok := p.consts[name]; ok {
			out[name] = true
			return
		}
		for _, u := range p.uses[name] {
			walk(u)
		}
	}
	for _, r := range roots {
		walk(r)
	}
	return out
}

// TestPGBenchScriptsMirrorStore fails when a pgbench script and kasa's SQL drift apart: every
// marked statement must equal its store constant up to whitespace and parameter names (with one
// script variable per Go parameter), and the payment script must run every statement of the
// store methods one successful payment calls.
func TestPGBenchScriptsMirrorStore(t *testing.T) {
	t.Parallel()
	st := parseStore(t)
	require.Contains(t, st.consts, "sqlRecord", "store constants were not found")
	entries, err := pgbenchScripts.ReadDir("pgbench")
	require.NoError(t, err)
	var scripts []string
	for _, e := range entries {
		if e.Name() != "setup.sql" {
			scripts = append(scripts, e.Name())
		}
	}
	require.ElementsMatch(t, []string{"payment.sql", "replay.sql", "replay-path.sql"}, scripts)
	for _, name := range scripts {
		t.Run(name, func(t *testing.T) {
			text, err := pgbenchScripts.ReadFile("pgbench/" + name)
			require.NoError(t, err)
			header, stmts := parseScript(t, name, string(text))
			require.NotEmpty(t, header, "%s must start with \"-- mirrors store.sqlX, ...\"", name)
			marked := map[string]bool{}
			require.True(t, strings.HasPrefix(string(text), "-- mirrors "), "%s must start with \"-- mirrors store.sqlX, ...\"", name)
			for _, s := range stmts {
				if s.mirrors == "-" {
					continue
				}
				marked[s.mirrors] = true
				goSQL, ok := st.consts[s.mirrors]
				require.True(t, ok, "%s:%d: no constant store.%s", name, s.line, s.mirrors)
				want, goParams := normalizeSQL(goSQL)
				got, scriptParams := normalizeSQL(s.sql)
				require.Equal(t, want, got, "%s:%d differs from store.%s", name, s.line, s.mirrors)
				// $n and the script's variables must correspond one to one.
				toVar, toParam := map[string]string{}, map[string]string{}
				for i := range goParams {
					if v, ok := toVar[goParams[i]]; ok {
						require.Equal(t, v, scriptParams[i], "%s:%d: $%s is two variables", name, s.line, goParams[i])
					}
					if p, ok := toParam[scriptParams[i]]; ok {
						require.Equal(t, p, goParams[i], "%s:%d: :%s stands for two parameters", name, s.line, scriptParams[i])
					}
					toVar[goParams[i]], toParam[scriptParams[i]] = scriptParams[i], goParams[i]
				}
			}
			require.ElementsMatch(t, slices.Sorted(maps.Keys(marked)), dedupe(header),
				"%s: the header's mirrored constants and the marked statements differ", name)
		})
	}
	t.Run("payment.sql runs every statement of a successful payment", func(t *testing.T) {
		// The store methods POST /v1/payments (with its authentication) and the worker's
		// activities call, on a new payment that succeeds and off it.
		onPath := []string{"MerchantByAPIKey", "Begin", "Reserve", "Finalize"}
		offPath := map[string]string{
			"Record":             "an outcome not announced in this process (the worker runs elsewhere), or a key another request took first",
			"Payment":            "a payment still processing when the API stops waiting",
			"SaveResponse":       "a record completed before answers were stored with the payment",
			"TakeOver":           "a stranded key taken over",
			"ExpireLease":        "a workflow that could not be started",
			"Release":            "a failed payment",
			"MarkUnknown":        "an outcome the provider cannot tell",
			"BeginChargeAttempt": "a provider without idempotency (the default capability is idempotent)",
		}
		calls := storeCalls(t, "../api", "createPayment", "merchantAuth")
		maps.Copy(calls, storeCalls(t, "../activities"))
		for m := range calls {
			_, off := offPath[m]
			require.True(t, off || slices.Contains(onPath, m),
				"a payment now calls store.%s: mirror its statements in payment.sql and add it to onPath, or add it to offPath", m)
		}
		for _, m := range append(onPath, slices.Collect(maps.Keys(offPath))...) {
			require.True(t, calls[m], "a payment no longer calls store.%s: update this test (and payment.sql)", m)
		}
		reached := st.reach(onPath...)
		// Branches of those methods a successful first attempt does not take.
		for _, c := range []string{
			"sqlLivePayment",       // Begin: an invoice with a live payment (duplicate_payment)
			"sqlPayment",           // Finalize: a retried activity that finds the payment final
			"sqlReservationExists", // Reserve: a decline that may be a concurrent attempt's hold
		} {
			require.True(t, reached[c], "store no longer uses %s: update this list", c)
			delete(reached, c)
		}
		text, err := pgbenchScripts.ReadFile("pgbench/payment.sql")
		require.NoError(t, err)
		header, _ := parseScript(t, "payment.sql", string(text))
		require.ElementsMatch(t, slices.Sorted(maps.Keys(reached)), dedupe(header),
			"payment.sql must run exactly the statements of a successful payment")
	})
}

// packageDecls parses the Go files of the package in dir (tests left out) and returns their
// top-level declarations.
func packageDecls(t *testing.T, dir string) []ast.Decl {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	require.NoError(t, err)
	fset := token.NewFileSet()
	var decls []ast.Decl
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		decls = append(decls, f.Decls...)
	}
	return decls
}

// storeCalls lists the methods called on a Store field (x.Store.M) by the package in dir, from the
// roots (every function when none) and the package's own functions they call, by name.
func storeCalls(t *testing.T, dir string, roots ...string) map[string]bool {
	t.Helper()
	funcs := map[string][]*ast.FuncDecl{}
	for _, d := range packageDecls(t, dir) {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
			funcs[fd.Name.Name] = append(funcs[fd.Name.Name], fd)
		}
	}
	if len(roots) == 0 {
		roots = slices.Collect(maps.Keys(funcs))
	}
	calls, seen := map[string]bool{}, map[string]bool{}
	var walk func(string)
	walk = func(name string) {
		if seen[name] {
			return
		}
		seen[name] = true
		for _, fd := range funcs[name] {
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.SelectorExpr:
					if x, ok := n.X.(*ast.SelectorExpr); ok && x.Sel.Name == "Store" {
						calls[n.Sel.Name] = true
						return false
					}
					walk(n.Sel.Name)
				case *ast.Ident:
					walk(n.Name)
				}
				return true
			})
		}
	}
	for _, r := range roots {
		require.Contains(t, funcs, r, "%s has no function %s", dir, r)
		walk(r)
	}
	return calls
}

func dedupe(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

func TestNormalizeSQL(t *testing.T) {
	t.Parallel()
	got, params := normalizeSQL("SELECT a ,\n  b FROM t WHERE x = :x_1 AND y = now() + :lease::interval AND z = 'a:b $1'")
	require.Equal(t, "SELECT a , b FROM t WHERE x = ? AND y = now() + ?::interval AND z = 'a:b $1'", got)
	require.Equal(t, []string{"x_1", "lease"}, params)
	got, params = normalizeSQL("UPDATE t SET a = $2 WHERE id = $1 AND s = ANY($5)")
	require.Equal(t, "UPDATE t SET a = ? WHERE id = ? AND s = ANY(?)", got)
	require.Equal(t, []string{"2", "1", "5"}, params)
}

func TestParsePGBenchOutput(t *testing.T) {
	t.Parallel()
	out := `pgbench (15.18 (Debian 15.18-0+deb12u1))
transaction type: /tmp/kasa-pgbench-1/payment.sql
scaling factor: 1
query mode: prepared
number of clients: 4
number of threads: 2
maximum number of tries: 1
duration: 2 s
number of transactions actually processed: 1475
number of failed transactions: 3 (0.203%)
latency average = 5.319 ms
initial connection time = 59.121 ms
tps = 752.075601 (without initial connection time)
`
	r, err := parsePGBenchOutput(out)
	require.NoError(t, err)
	require.Equal(t, PGBenchResult{Transactions: 1475, Failed: 3, LatencyAvgMS: 5.319, TPS: 752.075601}, r)
	_, err = parsePGBenchOutput("pgbench: error: connection to server failed\n")
	require.Error(t, err)
}

func TestReadPGBenchLogs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	prefix := filepath.Join(dir, "tx")
	// The run starts at 1000.0 (client 0's first transaction: 1000.5 minus 500 ms) and ends at
	// 1003.0 (the last one). With a 1 s warmup the window opens at 1001.5, when client 1 has done
	// its fifth transaction.
	require.NoError(t, os.WriteFile(prefix+".100", []byte(`0 1 500000 0 1000 500000
0 2 1000 0 1000 600000
0 3 1000 0 1000 700000
0 4 1000 0 1000 800000
0 5 1000 0 1000 900000
0 6 1500 0 1001 100000
0 7 failed 0 1002 0
0 8 skipped 0 1002 100000
0 9 900 0 1003 0
`), 0o644))
	require.NoError(t, os.WriteFile(prefix+".100.1", []byte(`1 1 100 0 1000 100000
1 2 100 0 1000 200000
1 3 100 0 1000 300000
1 4 100 0 1000 400000
1 5 100 0 1001 500000
1 6 2500 0 1002 999999
`), 0o644))
	txs, err := readPGBenchLogs(prefix)
	require.NoError(t, err)
	require.Len(t, txs, 14)
	r := summarize(txs, time.Second)
	require.InDelta(t, 2/1.5, r.TPS, 1e-9)
	r.TPS = 0
	require.Equal(t, PGBenchResult{Duration: 1.5, LatencyAvgMS: 1.7, P50MS: 0.9, P99MS: 2.5, MaxMS: 2.5, Transactions: 2, Failed: 1}, r)
	// Without a warmup the window opens at the last client's fifth transaction all the same.
	require.Equal(t, int64(2), summarize(txs, 0).Transactions)
	// A run too short (or a machine too busy) for every client to warm up: the time alone counts.
	var short []pgbenchTx
	for _, tx := range txs {
		if tx.client == 1 && tx.n <= 5 {
			short = append(short, tx)
		}
	}
	require.Equal(t, int64(1), summarize(short, time.Second).Transactions, "client 1's fifth ends after the 1 s warmup")
	require.Equal(t, 0.5, quantileMS([]int64{500, 1500, 2500}, 0))
	_, err = readPGBenchLogs(filepath.Join(dir, "none"))
	require.Error(t, err)
}

func TestWithSearchPath(t *testing.T) {
	t.Parallel()
	got, err := withSearchPath("postgres://u:p@127.0.0.1:5432/kasa?sslmode=disable&options=-cstatement_timeout%3D0", "kasa_pgbench_x")
	require.NoError(t, err)
	require.Equal(t, "postgres://u:p@127.0.0.1:5432/kasa?options=-cstatement_timeout%3D0%20-c%20search_path%3Dkasa_pgbench_x&sslmode=disable", got)
	_, err = withSearchPath("host=127.0.0.1 dbname=kasa", "s")
	require.ErrorContains(t, err, "postgres:// URL")
}

// TestPGBench runs every script against a throwaway PostgreSQL with kasa's schema and a little
// real data, and checks that only the fixture schema was written, and that it is gone afterwards.
func TestPGBench(t *testing.T) {
	ctx := context.Background()
	env := testkit.Start(t, testkit.Options{})
	db := env.Store

	// Some real rows, so that "untouched" means something.
	m := testkit.NewMerchant(t, db, testkit.MerchantOptions{Name: "real", Deposit: 10_000})
	req := payment.Request{InvoiceID: "inv-1", AmountMinor: 100, Currency: "TRY", AccountID: m.Account, PaymentType: payment.DefaultPaymentType}
	_, p, _, err := db.Begin(ctx, store.BeginInput{MerchantID: m.ID, Key: "k1", Request: req, OperationID: payment.NewID(), Lease: time.Minute})
	require.NoError(t, err)
	require.NoError(t, db.Reserve(ctx, p.ID))
	_, err = db.Finalize(ctx, p.ID, "ch_1")
	require.NoError(t, err)

	snapshot := func() string {
		out, err := psql(ctx, env.DatabaseURL, nil, "-A", "-t", "-c", `SELECT concat_ws(' ',
			(SELECT count(*) FROM merchants), (SELECT count(*) FROM accounts), (SELECT sum(balance) || '/' || sum(reserved) FROM accounts),
			(SELECT count(*) FROM idempotency_records), (SELECT count(*) FROM payments), (SELECT count(*) FROM balance_reservations),
			(SELECT count(*) FROM ledger_postings), (SELECT count(*) FROM ledger_entries), (SELECT count(*) FROM outbox),
			(SELECT max(updated_at) FROM accounts), (SELECT max(updated_at) FROM idempotency_records))`)
		require.NoError(t, err)
		return strings.TrimSpace(out)
	}
	schemas := func() string {
		out, err := psql(ctx, env.DatabaseURL, nil, "-A", "-t", "-c", `SELECT string_agg(nspname, ',') FROM pg_namespace WHERE nspname LIKE 'kasa\_pgbench%'`)
		require.NoError(t, err)
		return strings.TrimSpace(out)
	}
	before := snapshot()
	require.True(t, strings.HasPrefix(before, "1 3 "), "real rows: %s", before)

	t.Run("fixture clones constraints, foreign keys and triggers", func(t *testing.T) {
		o := PGBenchOptions{DatabaseURL: env.DatabaseURL, Rows: 3, Payers: 2}.withDefaults()
		schema, err := newPGBenchSchema()
		require.NoError(t, err)
		require.NoError(t, setupPGBenchFixture(ctx, o, schema))
		defer func() { require.NoError(t, dropPGBenchSchema(ctx, env.DatabaseURL, schema)) }()
		u, err := withSearchPath(env.DatabaseURL, schema)
		require.NoError(t, err)
		q := func(sql string) (string, error) {
			out, err := psql(ctx, u, nil, "-A", "-t", "-c", sql)
			return strings.TrimSpace(out), err
		}
		out, err := q(`SELECT (SELECT count(*) FROM merchants), (SELECT count(*) FROM accounts), (SELECT count(*) FROM idempotency_records)`)
		require.NoError(t, err)
		require.Equal(t, "3|9|3", out)
		// The -D values PGBench passes to the replay scripts are merchant 1's.
		out, err = q(`SELECT m.id || ' ' || m.api_key_hash FROM merchants m WHERE m.name = 'bench-1'`)
		require.NoError(t, err)
		vars := strings.Join(pgbenchVariables(o), " ")
		f := strings.Fields(out)
		require.Len(t, f, 2)
		require.Contains(t, vars, "merchant_id="+f[0])
		require.Contains(t, vars, "api_key_hash="+f[1])
		_, err = q(`BEGIN; INSERT INTO ledger_postings (id, kind, reference) VALUES (gen_random_uuid(), 'payment', 'x');
			INSERT INTO ledger_entries (id, posting_id, account_id, currency, amount_minor)
			SELECT gen_random_uuid(), id, md5('payer/1/1')::uuid, 'TRY', 5 FROM ledger_postings; COMMIT;`)
		require.ErrorContains(t, err, "does not balance")
		_, err = q(`INSERT INTO payments (id, merchant_id, idempotency_key, account_id, amount_minor, currency, invoice_id, payment_type, status)
			VALUES (gen_random_uuid(), md5('merchant/1')::uuid, 'no-record', md5('payer/1/1')::uuid, 1, 'TRY', 'i', 'purchase', 'processing')`)
		require.ErrorContains(t, err, "foreign key")
		_, err = q(`UPDATE accounts SET reserved = balance + 1 WHERE id = md5('payer/1/1')::uuid`)
		require.ErrorContains(t, err, "accounts_funds")
	})

	for _, script := range []string{PGBenchPayment, PGBenchReplay, PGBenchReplayPath} {
		t.Run(script, func(t *testing.T) {
			r, err := PGBench(ctx, PGBenchOptions{DatabaseURL: env.DatabaseURL, Clients: 4, Duration: 2 * time.Second, Warmup: time.Second, Script: script, Rows: 100})
			require.NoError(t, err)
			t.Logf("%s: %.0f tx/s, avg %.2f ms, p50 %.2f ms, p99 %.2f ms, %d transactions", script, r.TPS, r.LatencyAvgMS, r.P50MS, r.P99MS, r.Transactions)
			require.Equal(t, script, r.Script)
			require.Equal(t, 4, r.Clients)
			require.Greater(t, r.TPS, 0.0)
			require.Positive(t, r.Transactions)
			require.Zero(t, r.Failed)
			require.Positive(t, r.P50MS)
			require.Positive(t, r.PGBenchTPS)
			require.InDelta(t, 2, r.Duration, 0.2)
			require.GreaterOrEqual(t, r.P99MS, r.P50MS)
			require.Equal(t, before, snapshot(), "kasa's tables were written")
			require.Empty(t, schemas(), "fixture schema left behind")
		})
	}

	t.Run("errors", func(t *testing.T) {
		_, err := PGBench(ctx, PGBenchOptions{DatabaseURL: env.DatabaseURL, Script: "setup"})
		require.ErrorContains(t, err, "unknown script")
		// More clients than max_connections: pgbench fails, and says why.
		_, err = PGBench(ctx, PGBenchOptions{DatabaseURL: env.DatabaseURL, Script: PGBenchReplay, Clients: 300, Duration: time.Second, Rows: 1})
		require.ErrorContains(t, err, "too many clients")
		require.Empty(t, schemas(), "fixture schema left behind")
	})

	problems, err := db.Verify(ctx)
	require.NoError(t, err)
	require.Empty(t, problems)
	require.Equal(t, before, snapshot())
}
