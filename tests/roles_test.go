package tests

// The deployment with two database roles (docs/operations.md, "Database roles"): migrations run
// as the owner of the tables, every long-running process as a role with only the grants of
// schema/grants.sql. Raw SQL here goes through pgx directly: these tests play the operator and
// the attacker, not kasa.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
	"github.com/kasa-pay/kasa/workflows"
)

// roleDB is a database of the test's own owned by a login role of its own, and a second login
// role for the application; the roles are dropped when the test ends.
type roleDB struct {
	superURL, ownerURL, appURL string
	owner, app                 string
}

func newRoleDB(t *testing.T) roleDB {
	t.Helper()
	ctx := context.Background()
	suffix := strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	r := roleDB{owner: "kasa_owner_" + suffix, app: "kasa_app_" + suffix}
	super := connect(t, env.DatabaseURL)
	for _, role := range []string{r.owner, r.app} {
		_, err := super.Exec(ctx, "CREATE ROLE "+role+" LOGIN")
		require.NoError(t, err)
	}
	// Registered before the database, so it runs after the database is dropped.
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), env.DatabaseURL)
		if err != nil {
			t.Logf("drop roles: %v", err)
			return
		}
		defer c.Close(context.Background())
		for _, role := range []string{r.app, r.owner} {
			if _, err := c.Exec(context.Background(), "DROP ROLE "+role); err != nil {
				t.Logf("drop role %s: %v", role, err)
			}
		}
	})
	r.superURL = env.OwnDatabase(t)
	su := connect(t, r.superURL)
	u, err := url.Parse(r.superURL)
	require.NoError(t, err)
	_, err = su.Exec(ctx, "ALTER DATABASE "+strings.TrimPrefix(u.Path, "/")+" OWNER TO "+r.owner)
	require.NoError(t, err)
	r.ownerURL, r.appURL = withUser(t, r.superURL, r.owner), withUser(t, r.superURL, r.app)
	return r
}

func withUser(t *testing.T, rawURL, user string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	u.User = url.User(user)
	return u.String()
}

// connect opens one connection that is closed when the test ends.
func connect(t *testing.T, dbURL string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// migrateAsOwner runs `kasa migrate` as the deployment would: the owner's URL to migrate with,
// the application's URL and role for everything else.
func migrateAsOwner(t *testing.T, dir, bin string, r roleDB) {
	t.Helper()
	out, code := runKasa(t, dir, bin, kasaEnv(map[string]string{
		"KASA_DATABASE_URL": r.appURL, "KASA_DATABASE_MIGRATE_URL": r.ownerURL, "KASA_DATABASE_APP_ROLE": r.app,
	}), "migrate")
	require.Zero(t, code, "kasa migrate:\n%s", out)
}

// roleStack is a crash stack (banksim, worker, API) on a role database, with every kasa process
// connected as the application role; previous: migrated by the previous release (s.old).
func roleStack(t *testing.T, r roleDB, previous bool) *crashStack {
	t.Helper()
	dir := crashDir(t)
	s := &crashStack{
		t: t, dir: dir, bin: kasaBinary(t, dir), capability: string(workflows.CapabilityIdempotent),
		queue: "roles-" + uuid.NewString(), temporal: env.TemporalAddress, dbURL: r.appURL,
		syncWait: "5s", providerTimeout: "2s", apiAddr: testkit.FreeAddr(t), simAddr: testkit.FreeAddr(t),
	}
	s.providerURL = "http://" + s.simAddr
	migrator := s.bin
	if previous {
		s.old = previousKasa(t, dir)
		migrator = s.old
	}
	migrateAsOwner(t, dir, migrator, r)
	s.st = openStore(t, r.appURL)
	return s
}

// requireDenied runs each statement as the connection's role and wants PostgreSQL's
// insufficient_privilege (42501) for every one.
func requireDenied(t *testing.T, c *pgx.Conn, statements map[string]string) {
	t.Helper()
	for name, sql := range statements {
		_, err := c.Exec(context.Background(), sql)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%s: want permission denied, got %v", name, err)
		require.Equal(t, "42501", pgErr.Code, "%s: %s", name, pgErr.Message)
	}
}

// The application role makes payments end to end (API, worker, relay, webhooks and retention)
// and cannot rewrite the ledger: no UPDATE, DELETE or TRUNCATE on it, no DDL, no way around
// the immutability triggers.
func TestAppRolePaysButCannotRewriteTheLedger(t *testing.T) {
	t.Parallel()
	r := newRoleDB(t)
	s := roleStack(t, r, false)
	s.start()
	relay, _, _ := s.startRelay("KASA_WEBHOOK_ALLOW_PRIVATE", "true")

	hook := newSink(t)
	resp := s.mustCall("POST", s.apiURL()+"/admin/v1/merchants", adminToken, fmt.Sprintf(`{"name":"Roles","webhook_url":%q}`, hook.URL))
	require.Equal(t, http.StatusCreated, resp.Status, "%s", resp.Body)
	m := merchant{ID: resp.json(t)["id"].(string), APIKey: resp.json(t)["api_key"].(string)}
	acct := s.account(m, "TRY", "100.00")

	ok, err := s.pay(m, "roles-ok", payBody("inv-ok", "10.00", "TRY", acct))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, ok.Status, "%s", ok.Body)
	s.setFaults(`{"rules":[{"on":"charge","action":"decline","count":1}]}`)
	declined, err := s.pay(m, "roles-declined", payBody("inv-declined", "5.00", "TRY", acct))
	require.NoError(t, err)
	require.Equal(t, http.StatusPaymentRequired, declined.Status, "%s", declined.Body)
	balance, reserved := s.balances(m, acct)
	require.Equal(t, []string{"90.00", "0.00"}, []string{balance, reserved}, "one payment posted, the declined one released")
	require.Eventually(t, func() bool { return hook.Count() >= 2 }, 30*time.Second, 50*time.Millisecond,
		"both outcomes reach the merchant through the relay\n%s", testkit.Tail(relay.log, 30))
	s.verify()

	// Retention, as the relay runs it, deletes published events and finished deliveries.
	ctx := context.Background()
	require.Eventually(t, func() bool {
		p, err := s.st.PurgeEvents(ctx, 0, 100)
		require.NoError(t, err)
		return p.Outbox > 0 && p.Inbox > 0 && p.Deliveries > 0
	}, 10*time.Second, 100*time.Millisecond, "retention deletes events as the application role")

	app := connect(t, r.appURL)
	requireDenied(t, app, map[string]string{
		"update entries":   `UPDATE ledger_entries SET amount_minor = amount_minor * 2`,
		"delete entries":   `DELETE FROM ledger_entries`,
		"update postings":  `UPDATE ledger_postings SET reference = 'x'`,
		"delete postings":  `DELETE FROM ledger_postings`,
		"truncate":         `TRUNCATE ledger_entries, ledger_postings`,
		"truncate outbox":  `TRUNCATE outbox`,
		"disable trigger":  `ALTER TABLE ledger_entries DISABLE TRIGGER ledger_entries_immutable`,
		"drop trigger":     `DROP TRIGGER ledger_entries_immutable ON ledger_entries`,
		"drop table":       `DROP TABLE ledger_entries`,
		"add column":       `ALTER TABLE accounts ADD COLUMN note text`,
		"replace function": `CREATE OR REPLACE FUNCTION ledger_immutable() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$`,
		"deposit rewrite":  `UPDATE deposits SET amount_minor = 1`,
		"migrations":       `DELETE FROM goose_db_version`,
		"create table":     `CREATE TABLE ledger_shadow (id int)`,
	})
}

// metricValue reads one unlabelled sample from a Prometheus text page; -1 when it is absent.
func metricValue(t *testing.T, page []byte, name string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindSubmatch(page)
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	require.NoError(t, err)
	return v
}

// The worker checks the ledger periodically and exports what it found: a ledger corrupted by
// someone with more power than the application (here a superuser who switches the triggers off)
// shows as kasa_ledger_violations > 0 on the worker's /metrics.
func TestWorkerVerifiesTheLedgerPeriodically(t *testing.T) {
	t.Parallel()
	r := newRoleDB(t)
	s := roleStack(t, r, false)
	metricsAddr := testkit.FreeAddr(t)
	s.startBanksim()
	s.worker = startProc(t, s.dir, s.bin, "worker", s.env("KASA_WORKER_METRICS_ADDR", metricsAddr, "KASA_VERIFY_INTERVAL", "200ms"), "worker")
	s.worker.waitHTTP("http://" + metricsAddr + "/healthz")
	s.startAPI()
	m := s.merchant()
	acct := s.account(m, "TRY", "100.00")
	resp, err := s.pay(m, "verify-1", payBody("inv-verify-1", "10.00", "TRY", acct))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.Status, "%s", resp.Body)

	scrape := func() []byte {
		return s.mustCall("GET", "http://"+metricsAddr+"/metrics", "", "").Body
	}
	require.Eventually(t, func() bool {
		page := scrape()
		return metricValue(t, page, "kasa_ledger_verify_last_success_timestamp_seconds") > float64(time.Now().Add(-time.Minute).Unix())
	}, 10*time.Second, 50*time.Millisecond, "the worker verified the ledger")
	require.Zero(t, metricValue(t, scrape(), "kasa_ledger_violations"), "a sound ledger")

	su := connect(t, r.superURL)
	ctx := context.Background()
	_, err = su.Exec(ctx, `SET session_replication_role = replica`) // no triggers for this session
	require.NoError(t, err)
	_, err = su.Exec(ctx, `UPDATE ledger_entries SET amount_minor = amount_minor + 1 WHERE account_id = $1`, acct)
	require.NoError(t, err)

	var page []byte
	require.Eventually(t, func() bool {
		page = scrape()
		return metricValue(t, page, "kasa_ledger_violations") > 0
	}, 10*time.Second, 50*time.Millisecond, "the corruption shows on the worker's metrics\n%s", testkit.Tail(s.worker.log, 20))
	require.Contains(t, string(page), "kasa_ledger_verify_duration_seconds")
	require.Contains(t, testkit.Tail(s.worker.log, 50), "ledger verification found violations")
}

// Every table a query in store/queries writes to grants the application role that verb, and
// every table it reads from grants SELECT: a new statement on a new table or with a new verb
// fails here, not in production under the application role.
func TestGrantsCoverEveryQuery(t *testing.T) {
	t.Parallel()
	r := newRoleDB(t)
	ctx := context.Background()
	st, err := store.Open(ctx, store.Options{URL: r.ownerURL, SecretKey: testkit.SecretKey, Migrate: true, AppRole: r.app})
	require.NoError(t, err)
	st.Close()

	files, err := filepath.Glob("../store/queries/*.sql")
	require.NoError(t, err)
	embedded, err := filepath.Glob("../store/queries/embedded/*.sql")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	want := map[string]map[string]bool{} // table -> privileges the queries use
	add := func(table, privilege string) {
		if want[table] == nil {
			want[table] = map[string]bool{}
		}
		want[table][privilege] = true
	}
	statement := regexp.MustCompile(`(?i)\b(INSERT INTO|UPDATE|DELETE FROM|FROM|JOIN)\s+([a-z_]+)`)
	for _, f := range append(files, embedded...) {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		// Queries whose comment says "Owner only" run as the tables' owner (kasa migrate, kasa
		// rotate-secret-key): the application role must not hold what they use.
		var code strings.Builder
		for _, query := range strings.Split(string(b), "-- name:") {
			if strings.Contains(query, "Owner only") {
				continue
			}
			for _, line := range strings.Split(query, "\n") {
				if !strings.HasPrefix(strings.TrimSpace(line), "--") {
					code.WriteString(line + "\n")
				}
			}
		}
		for _, m := range statement.FindAllStringSubmatch(code.String(), -1) {
			verb := map[string]string{"insert into": "INSERT", "update": "UPDATE", "delete from": "DELETE", "from": "SELECT", "join": "SELECT"}[strings.ToLower(m[1])]
			add(m[2], verb)
		}
	}
	su := connect(t, r.superURL)
	checked := 0
	for table, privileges := range want {
		var kasaTable bool
		require.NoError(t, su.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = current_schema() AND tablename = $1)`, table).Scan(&kasaTable))
		if !kasaTable { // a catalog view, a CTE's name or a column after FROM (extract(... FROM x))
			continue
		}
		for p := range privileges {
			var ok bool
			require.NoError(t, su.QueryRow(ctx, `SELECT has_table_privilege($1, $2, $3)`, r.app, table, p).Scan(&ok))
			require.True(t, ok, "store/queries use %s on %s: schema/grants.sql must grant it", p, table)
			checked++
		}
	}
	require.Greater(t, checked, 20, "the queries were parsed")
}

// kasa migrate refuses an application role that could act as the owner, and a table that
// schema/grants.sql does not name; the grants it applies are exactly the file's.
func TestMigrateGrantsOnlyToASeparateRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	migrate := func(r roleDB, role string) error {
		st, err := store.Open(ctx, store.Options{URL: r.ownerURL, SecretKey: testkit.SecretKey, Migrate: true, AppRole: role})
		if err == nil {
			st.Close()
		}
		return err
	}
	for _, tc := range []struct {
		name  string
		setup func(r roleDB, su *pgx.Conn) (role string)
		want  string
	}{
		{"the owner itself", func(r roleDB, _ *pgx.Conn) string { return r.owner }, "member of it"},
		{"a member of the owner", func(r roleDB, su *pgx.Conn) string {
			_, err := su.Exec(ctx, "GRANT "+r.owner+" TO "+r.app)
			require.NoError(t, err)
			return r.app
		}, "member of it"},
		{"a superuser", func(r roleDB, su *pgx.Conn) string {
			_, err := su.Exec(ctx, "ALTER ROLE "+r.app+" SUPERUSER")
			require.NoError(t, err)
			return r.app
		}, "superuser"},
		{"no such role", func(r roleDB, _ *pgx.Conn) string { return "kasa_nobody_" + r.app }, "does not exist"},
		{"a table without grants", func(r roleDB, _ *pgx.Conn) string {
			require.NoError(t, migrate(r, r.app))
			owner := connect(t, r.ownerURL)
			_, err := owner.Exec(ctx, "CREATE TABLE ledger_notes (id int)")
			require.NoError(t, err)
			return r.app
		}, "does not name table(s) ledger_notes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRoleDB(t)
			su := connect(t, r.superURL)
			role := tc.setup(r, su)
			err := migrate(r, role)
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
		})
	}

	// A privilege granted by hand is taken away by the next migrate.
	r := newRoleDB(t)
	require.NoError(t, migrate(r, r.app))
	su := connect(t, r.superURL)
	_, err := su.Exec(ctx, "GRANT UPDATE, DELETE, TRUNCATE ON ledger_entries TO "+r.app)
	require.NoError(t, err)
	require.NoError(t, migrate(r, r.app))
	var privileges string
	require.NoError(t, su.QueryRow(ctx, `SELECT string_agg(privilege_type, ',' ORDER BY privilege_type) FROM information_schema.role_table_grants
		WHERE grantee = $1 AND table_name = 'ledger_entries'`, r.app).Scan(&privileges))
	require.Equal(t, "INSERT,SELECT", privileges)
}

// `kasa worker` and `kasa api` started before `kasa migrate` (they cannot migrate as the
// application role) wait for the schema, saying so, and serve once it is there.
func TestProcessesWaitForTheMigration(t *testing.T) {
	t.Parallel()
	r := newRoleDB(t)
	dir := crashDir(t)
	s := &crashStack{
		t: t, dir: dir, bin: kasaBinary(t, dir), capability: string(workflows.CapabilityIdempotent),
		queue: "roles-" + uuid.NewString(), temporal: env.TemporalAddress, dbURL: r.appURL,
		syncWait: "5s", providerTimeout: "2s", apiAddr: testkit.FreeAddr(t), simAddr: testkit.FreeAddr(t),
	}
	s.providerURL = "http://" + s.simAddr
	s.startBanksim()
	s.startWorker()
	s.api = startProc(t, s.dir, s.bin, "api", s.env(), "api")
	require.Eventually(t, func() bool {
		for _, p := range []*proc{s.worker, s.api} {
			p.requireRunning(t, "before the migration")
			b, err := os.ReadFile(p.log)
			require.NoError(t, err)
			if !strings.Contains(string(b), "waiting for kasa migrate") {
				return false
			}
		}
		return true
	}, 30*time.Second, 100*time.Millisecond, "both processes wait for the schema")

	migrateAsOwner(t, dir, s.bin, r)
	s.st = openStore(t, r.appURL)
	s.api.waitHTTP(s.apiURL() + "/readyz")
	m := s.merchant()
	acct := s.account(m, "TRY", "100.00")
	resp, err := s.pay(m, "after-migrate", payBody("inv-1", "10.00", "TRY", acct))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.Status, "%s", resp.Body)
}

// Every kasa process may migrate at start: several at once, with the application role, all
// succeed (the grants are serialised as the migrations are).
func TestConcurrentMigrationsGrantTheAppRole(t *testing.T) {
	t.Parallel()
	r := newRoleDB(t)
	ctx := context.Background()
	for round := range 4 {
		errs := make([]error, 3)
		var wg sync.WaitGroup
		for i := range errs {
			wg.Go(func() {
				st, err := store.Open(ctx, store.Options{URL: r.ownerURL, MaxConns: 2, SecretKey: testkit.SecretKey, Migrate: true, AppRole: r.app})
				if err == nil {
					st.Close()
				}
				errs[i] = err
			})
		}
		wg.Wait()
		for i, err := range errs {
			require.NoError(t, err, "round %d, migration %d", round, i)
		}
	}
}
