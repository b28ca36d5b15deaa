package store_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/devenv"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// issue makes a certificate for template, signed by parent's key (self-signed when parent is
// nil), and returns it with its key, both PEM.
func issue(t *testing.T, template, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey, []byte, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	if parent == nil {
		parent, parentKey = template, key
	}
	der, err := x509.CreateCertificate(rand.Reader, template, parent, &key.PublicKey, parentKey)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	return cert, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// kasa connects to a PostgreSQL that requires TLS with sslmode=verify-full and the server's CA
// (docs/deployment.md, "The database over TLS"): the connection is made when the server's
// certificate chains to that CA and names the host, and refused when it chains to another.
func TestDatabaseOverVerifiedTLS(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kasa test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	ca, caKey, caPEM, _ := issue(t, caTmpl, nil, nil)
	_, _, otherCA, _ := issue(t, &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "another CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}, nil, nil)
	_, _, serverPEM, serverKey := issue(t, &x509.Certificate{SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, ca, caKey)

	// The cluster's files go in its data directory, owned by whoever runs the server.
	dir := filepath.Join(t.TempDir(), "pg")
	pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: dir, Ephemeral: true})
	require.NoError(t, err)
	require.NoError(t, pg.Stop())
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	owner := fi.Sys().(*syscall.Stat_t)
	for name, b := range map[string][]byte{"server.crt": serverPEM, "server.key": serverKey} {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, b, 0o600))
		require.NoError(t, os.Chown(path, int(owner.Uid), int(owner.Gid)))
	}
	pg, err = devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: dir, Ephemeral: true, Settings: []string{"ssl=on"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pg.Stop() })

	certs := t.TempDir()
	for name, b := range map[string][]byte{"ca.pem": caPEM, "other.pem": otherCA} {
		require.NoError(t, os.WriteFile(filepath.Join(certs, name), b, 0o644))
	}
	url := func(host, root string) string {
		u := strings.Replace(pg.URL, "127.0.0.1", host, 1)
		return strings.Replace(u, "sslmode=disable", "sslmode=verify-full&sslrootcert="+filepath.Join(certs, root), 1)
	}
	for _, tc := range []struct {
		name, host, root string
		ok               bool
	}{
		{"the server's CA", "localhost", "ca.pem", true},
		{"by address", "127.0.0.1", "ca.pem", true},
		{"another CA", "localhost", "other.pem", false},
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
