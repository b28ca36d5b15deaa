package devenv

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// A PostgreSQL port another server holds is refused: otherwise pg_isready and createdb reach
// that server, and a launcher migrates and seeds a database that is not its own.
func TestPostgresRefusesATakenPort(t *testing.T) {
	ctx := context.Background()
	tmp := t.TempDir()
	port, err := FreePort()
	require.NoError(t, err)
	first, err := StartPostgres(ctx, PostgresOptions{Dir: filepath.Join(tmp, "a"), Port: port, Ephemeral: true})
	require.NoError(t, err)
	defer first.Stop()
	_, err = StartPostgres(ctx, PostgresOptions{Dir: filepath.Join(tmp, "b"), Port: port, Ephemeral: true})
	require.ErrorContains(t, err, "is taken by another process")
}
