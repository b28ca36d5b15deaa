package devenv

import (
	"context"
	"net"
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

// So is a Temporal or UI port another process holds: its server would answer for the one
// started here.
func TestTemporalRefusesATakenPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	free, err := FreePort()
	require.NoError(t, err)
	for _, o := range []TemporalOptions{{Port: port}, {Port: free, UIPort: port}} {
		_, err := StartTemporal(context.Background(), o)
		require.ErrorContains(t, err, "is taken by another process")
	}
}
