package tests

import (
	"context"
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
	certs := t.TempDir()
	require.Contains(t, runScript(t, "temporal-certs.sh", "CERTS_DIR="+certs), "temporal certificates made")
	require.NoFileExists(t, filepath.Join(certs, "ca-key.pem"), "the CA's key is gone once both are signed")
	require.Contains(t, runScript(t, "temporal-certs.sh", "CERTS_DIR="+certs), "kept", "a second start keeps them")

	dir := t.TempDir()
	pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: filepath.Join(dir, "pg"), Ephemeral: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pg.Stop() })
	at := func(name string) string { return filepath.Join(certs, name) }
	ts, err := devenv.StartTemporalServer(ctx, pg, devenv.TemporalServerOptions{Dir: filepath.Join(dir, "temporal"),
		TLS: &devenv.TemporalTLS{CA: at("ca.pem"), Cert: at("temporal.pem"), Key: at("temporal-key.pem"), ServerName: "temporal"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ts.Stop() })

	cli, err := devenv.FindTemporalCLI()
	require.NoError(t, err)
	env := []string{"PATH=" + filepath.Dir(cli) + ":" + os.Getenv("PATH"), "TEMPORAL_ADDRESS=" + ts.Address(),
		"TEMPORAL_NAMESPACE=kasa-compose", "TEMPORAL_RETENTION=7d",
		"TEMPORAL_TLS_CERT=" + at("client.pem"), "TEMPORAL_TLS_KEY=" + at("client-key.pem"),
		"TEMPORAL_TLS_CA=" + at("ca.pem"), "TEMPORAL_TLS_SERVER_NAME=temporal"}
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
	runScript(t, "postgres-init.sh", "PATH="+filepath.Dir(psql)+":"+os.Getenv("PATH"),
		"PGHOST=127.0.0.1", fmt.Sprintf("PGPORT=%d", pg.Port), "POSTGRES_USER=postgres", "POSTGRES_DB=kasa",
		"KASA_DB_OWNER_PASSWORD=ownerpw", "KASA_DB_APP_PASSWORD=app'pw", "KASA_TEMPORAL_DB_PASSWORD=temporalpw")

	conn, err := pgx.Connect(ctx, pg.URL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	for role, password := range map[string]string{"kasa_owner": "ownerpw", "kasa_app": "app'pw", "temporal": "temporalpw"} {
		var stored string
		require.NoError(t, conn.QueryRow(ctx, `SELECT rolpassword FROM pg_authid WHERE rolname = $1 AND rolcanlogin AND NOT rolsuper`, role).Scan(&stored))
		require.True(t, strings.HasPrefix(stored, "SCRAM-SHA-256$"), "%s has a password, hashed", role)
		require.NotContains(t, stored, password)
	}
	for db, owner := range map[string]string{"kasa": "kasa_owner", "temporal": "temporal", "temporal_visibility": "temporal"} {
		var got string
		require.NoError(t, conn.QueryRow(ctx, `SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = $1`, db).Scan(&got))
		require.Equal(t, owner, got, db)
	}
}
