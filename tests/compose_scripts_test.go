package tests

import (
	"context"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/kasa-pay/kasa/tools/devenv"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// runScript runs one of deploy/'s shell scripts with env added to this process's environment.
func runScript(t *testing.T, script string, env ...string) string {
	t.Helper()
	cmd := exec.Command("sh", filepath.Join(repoDir(t), "deploy", script))
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s:\n%s", script, out)
	return string(out)
}

func repoDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("..")
	require.NoError(t, err)
	return dir
}

// What docker-compose.yml's Temporal runs, without Docker: deploy/temporal-certs.sh makes the
// certificates, a real Temporal Server requires them (as compose's environment configures it),
// deploy/temporal-setup.sh creates the namespace and the search attributes through mutual TLS,
// twice without harm, and the server's healthcheck command answers.
func TestComposeTemporalScripts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	server, client := t.TempDir(), t.TempDir()
	dirs := []string{"SERVER_DIR=" + server, "CLIENT_DIR=" + client}
	// A first run that died half way (the CA there, no key yet) is done again.
	require.NoError(t, os.WriteFile(filepath.Join(server, "ca.pem"), []byte("partial"), 0o644))
	require.Contains(t, runScript(t, "temporal-certs.sh", dirs...), "temporal certificates made")
	list := func(dir string) (names []string) {
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return names
	}
	require.Equal(t, []string{"ca.pem", "temporal-key.pem", "temporal.pem"}, list(server), "the server's directory")
	require.Equal(t, []string{"ca.pem", "client-key.pem", "client.pem"}, list(client), "the clients' directory: no server key, no CA key")
	made, err := os.ReadFile(filepath.Join(client, "client.pem"))
	require.NoError(t, err)
	require.Contains(t, runScript(t, "temporal-certs.sh", dirs...), "kept", "a second start keeps them")
	again, err := os.ReadFile(filepath.Join(client, "client.pem"))
	require.NoError(t, err)
	require.Equal(t, made, again)
	certs := server
	at := func(name string) string { return filepath.Join(certs, name) }
	atClient := func(name string) string { return filepath.Join(client, name) }

	dir := t.TempDir()
	pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: filepath.Join(dir, "pg"), Ephemeral: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pg.Stop() })
	ts, err := devenv.StartTemporalServer(ctx, pg, devenv.TemporalServerOptions{Dir: filepath.Join(dir, "temporal"),
		TLS: &devenv.TemporalTLS{CA: at("ca.pem"), Cert: at("temporal.pem"), Key: at("temporal-key.pem"), ServerName: "temporal"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ts.Stop() })

	cli, err := devenv.FindTemporalCLI()
	require.NoError(t, err)
	env := []string{"PATH=" + filepath.Dir(cli) + ":" + os.Getenv("PATH"), "TEMPORAL_ADDRESS=" + ts.Address(),
		"TEMPORAL_NAMESPACE=kasa-compose", "TEMPORAL_RETENTION=7d",
		"TEMPORAL_TLS_CERT=" + atClient("client.pem"), "TEMPORAL_TLS_KEY=" + atClient("client-key.pem"),
		"TEMPORAL_TLS_CA=" + atClient("ca.pem"), "TEMPORAL_TLS_SERVER_NAME=temporal"}
	for range 2 {
		require.Contains(t, runScript(t, "temporal-setup.sh", env...), "namespace kasa-compose ready")
	}

	// The healthcheck, as compose runs it in the server's container.
	var compose struct {
		Services map[string]struct {
			Healthcheck struct{ Test []string }
		}
	}
	b, err := os.ReadFile(filepath.Join(repoDir(t), "docker-compose.yml"))
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, &compose))
	args := compose.Services["temporal"].Healthcheck.Test[2:] // after CMD temporal
	for i, a := range args {
		args[i] = strings.NewReplacer("127.0.0.1:7233", ts.Address(), "/certs/", certs+"/").Replace(a)
	}
	out, err := exec.Command(cli, args...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "SERVING")
}

// deploy/postgres-init.sh on a new cluster, as the postgres image runs it: the roles log in with
// the passwords the environment gives, and the databases belong to whom compose expects.
func TestComposePostgresInit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: filepath.Join(t.TempDir(), "pg"), Ephemeral: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pg.Stop() })
	psql := testkit.PGTool(t, "psql")
	initdb := func(passwords map[string]string) {
		t.Helper()
		env := []string{"PATH=" + filepath.Dir(psql) + ":" + os.Getenv("PATH"),
			"PGHOST=127.0.0.1", fmt.Sprintf("PGPORT=%d", pg.Port), "POSTGRES_USER=postgres", "POSTGRES_DB=kasa"}
		for k, v := range passwords {
			env = append(env, k+"="+v)
		}
		runScript(t, "postgres-init.sh", env...)
	}
	conn, err := pgx.Connect(ctx, pg.URL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	stored := func(role string) string {
		t.Helper()
		var s string
		require.NoError(t, conn.QueryRow(ctx, `SELECT rolpassword FROM pg_authid WHERE rolname = $1 AND rolcanlogin AND NOT rolsuper`, role).Scan(&s))
		require.True(t, strings.HasPrefix(s, "SCRAM-SHA-256$"), "%s has a password, hashed", role)
		return s
	}

	initdb(map[string]string{"KASA_DB_OWNER_PASSWORD": "ownerpw", "KASA_DB_APP_PASSWORD": "app'pw", "KASA_TEMPORAL_DB_PASSWORD": "temporalpw"})
	first := map[string]string{}
	for _, role := range []string{"kasa_owner", "kasa_app", "temporal"} {
		first[role] = stored(role)
	}
	// Again, as on a volume an earlier compose file made: nothing fails, the passwords change.
	initdb(map[string]string{"KASA_DB_OWNER_PASSWORD": "ownerpw2", "KASA_DB_APP_PASSWORD": "apppw2", "KASA_TEMPORAL_DB_PASSWORD": "temporalpw2"})
	for role, password := range map[string]string{"kasa_owner": "ownerpw2", "kasa_app": "apppw2", "temporal": "temporalpw2"} {
		require.True(t, scramMatches(t, stored(role), password), "%s's password is set from the environment again", role)
		require.False(t, scramMatches(t, first[role], password))
	}
	require.True(t, scramMatches(t, first["kasa_app"], "app'pw"), "a quote in a password is kept as it is")
	for db, owner := range map[string]string{"kasa": "kasa_owner", "temporal": "temporal", "temporal_visibility": "temporal"} {
		var got string
		require.NoError(t, conn.QueryRow(ctx, `SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = $1`, db).Scan(&got))
		require.Equal(t, owner, got, db)
	}
}

// scramMatches is whether PostgreSQL's stored SCRAM-SHA-256 verifier was made from password.
func scramMatches(t *testing.T, stored, password string) bool {
	t.Helper()
	var iter int
	var salt64, stored64, server64 string
	_, err := fmt.Sscanf(strings.NewReplacer("$", " ", ":", " ").Replace(stored), "SCRAM-SHA-256 %d %s %s %s", &iter, &salt64, &stored64, &server64)
	require.NoError(t, err, stored)
	salt, err := base64.StdEncoding.DecodeString(salt64)
	require.NoError(t, err)
	salted, err := pbkdf2.Key(sha256.New, password, salt, iter, sha256.Size)
	require.NoError(t, err)
	mac := hmac.New(sha256.New, salted)
	mac.Write([]byte("Server Key"))
	return base64.StdEncoding.EncodeToString(mac.Sum(nil)) == server64
}
