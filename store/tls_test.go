package store_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/devenv"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// kasa connects to a PostgreSQL that requires TLS with sslmode=verify-full and the server's CA
// (docs/deployment.md, "The database over TLS"): the connection is made when the server's
// certificate chains to that CA and names the host, and refused when it chains to another.
func TestDatabaseOverVerifiedTLS(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ca, other := testkit.NewCA(t, "kasa test CA"), testkit.NewCA(t, "another CA")
	certFile, keyFile := ca.Issue(t, "postgres", "localhost") // not 127.0.0.1: see "another name"

	// The cluster's files go in its data directory, owned by whoever runs the server.
	dir := filepath.Join(t.TempDir(), "pg")
	pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: dir, Ephemeral: true})
	require.NoError(t, err)
	require.NoError(t, pg.Stop())
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	owner := fi.Sys().(*syscall.Stat_t)
	for name, from := range map[string]string{"server.crt": certFile, "server.key": keyFile} {
		b, err := os.ReadFile(from)
		require.NoError(t, err)
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, b, 0o600))
		require.NoError(t, os.Chown(path, int(owner.Uid), int(owner.Gid)))
	}
	pg, err = devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: dir, Ephemeral: true, Settings: []string{"ssl=on"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pg.Stop() })

	url := func(host, root string) string {
		u := strings.Replace(pg.URL, "127.0.0.1", host, 1)
		return strings.Replace(u, "sslmode=disable", "sslmode=verify-full&sslrootcert="+root, 1)
	}
	for _, tc := range []struct {
		name, host, root string
		ok               bool
	}{
		{"the server's CA", "localhost", ca.File, true},
		{"another name than the certificate's", "127.0.0.1", ca.File, false},
		{"another CA", "localhost", other.File, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := store.Open(ctx, store.Options{URL: url(tc.host, tc.root), SecretKey: testkit.SecretKey})
			if !tc.ok {
				require.ErrorContains(t, err, "certificate")
				return
			}
			require.NoError(t, err)
			defer st.Close()
		})
	}
}
