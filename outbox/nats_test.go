package outbox

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/tools/testkit"
)

// pki is a throwaway certificate authority with a server and a client certificate, as PEM files.
type pki struct {
	ca, serverCert, serverKey, clientCert, clientKey string
}

func newPKI(t *testing.T) pki {
	t.Helper()
	ca := testkit.NewCA(t, "kasa test CA")
	p := pki{ca: ca.File}
	p.serverCert, p.serverKey = ca.Issue(t, "server", "127.0.0.1")
	p.clientCert, p.clientKey = ca.Issue(t, "client")
	return p
}

// startSecureBroker runs a NATS server that requires TLS with a client certificate of p's CA
// and a user JWT of its operator (decentralised auth); it returns its URL and a .creds file of a
// user it accepts.
func startSecureBroker(t *testing.T, p pki) (url, creds string) {
	t.Helper()
	okp, err := nkeys.CreateOperator()
	require.NoError(t, err)
	opub, err := okp.PublicKey()
	require.NoError(t, err)
	oc := jwt.NewOperatorClaims(opub)
	ojwt, err := oc.Encode(okp)
	require.NoError(t, err)
	oc, err = jwt.DecodeOperatorClaims(ojwt)
	require.NoError(t, err)

	akp, err := nkeys.CreateAccount()
	require.NoError(t, err)
	apub, err := akp.PublicKey()
	require.NoError(t, err)
	ajwt, err := jwt.NewAccountClaims(apub).Encode(okp)
	require.NoError(t, err)

	ukp, err := nkeys.CreateUser()
	require.NoError(t, err)
	upub, err := ukp.PublicKey()
	require.NoError(t, err)
	ujwt, err := jwt.NewUserClaims(upub).Encode(akp)
	require.NoError(t, err)
	seed, err := ukp.Seed()
	require.NoError(t, err)
	cb, err := jwt.FormatUserConfig(ujwt, seed)
	require.NoError(t, err)
	creds = filepath.Join(t.TempDir(), "kasa.creds")
	require.NoError(t, os.WriteFile(creds, cb, 0o600))

	resolver := &server.MemAccResolver{}
	require.NoError(t, resolver.Store(apub, ajwt))
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: p.serverCert, KeyFile: p.serverKey, CaFile: p.ca, Verify: true})
	require.NoError(t, err)
	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, NoSigs: true, NoLog: true,
		TLS: true, TLSVerify: true, TLSConfig: tc, TLSTimeout: 2,
		TrustedOperators: []*jwt.OperatorClaims{oc}, AccountResolver: resolver,
	})
	require.NoError(t, err)
	go ns.Start()
	require.True(t, ns.ReadyForConnections(10*time.Second))
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns.ClientURL(), creds
}

// An external broker that wants TLS with a client certificate and a user's credentials: kasa
// connects with all of them, and each missing one is a clear error.
func TestConnectWithCredentialsAndTLS(t *testing.T) {
	p := newPKI(t)
	url, creds := startSecureBroker(t, p)
	full := BrokerAuth{Creds: creds, TLSCA: p.ca, TLSCert: p.clientCert, TLSKey: p.clientKey}
	noCreds, noCert, noCA := full, full, full
	noCreds.Creds = ""
	noCert.TLSCert, noCert.TLSKey = "", ""
	noCA.TLSCA = ""
	for _, tc := range []struct {
		name string
		auth BrokerAuth
		want string // in the error; empty: connects
	}{
		{"everything", full, ""},
		{"nothing", BrokerAuth{}, "certificate"},
		{"no credentials", noCreds, "Authorization Violation"},
		// TLS 1.3 finishes the client's side of the handshake before the server checks its
		// certificate: the refusal comes as a "certificate required" alert or a closed connection.
		{"no client certificate", noCert, "tls"},
		{"no CA", noCA, "certificate signed by unknown authority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc, js, err := Connect(url, "auth-test", tc.auth)
			if tc.want != "" {
				require.Error(t, err)
				require.Contains(t, err.Error(), tc.want)
				return
			}
			require.NoError(t, err)
			defer nc.Close()
			require.NotNil(t, js)
			require.True(t, nc.IsConnected())
			require.True(t, nc.TLSRequired())
			cs, err := nc.TLSConnectionState()
			require.NoError(t, err)
			require.Equal(t, uint16(tls.VersionTLS13), cs.Version)
			require.NoError(t, nc.Publish("kasa.auth.check", []byte("x")))
			require.NoError(t, nc.Flush(), "the broker accepted a message from the authenticated user")
		})
	}
	_, _, err := Connect(url, "auth-test", BrokerAuth{Creds: filepath.Join(t.TempDir(), "missing.creds"), TLSCA: p.ca})
	require.ErrorContains(t, err, "missing.creds")
	_, _, err = Connect(url, "auth-test", BrokerAuth{TLSCert: p.clientCert})
	require.ErrorContains(t, err, "both")
}

// One embedded broker per store directory: a second (another relay, or kasa dev, on the same
// KASA_DATA_DIR) would write the same stream files as the first. It is refused until the first
// stops.
func TestEmbeddedBrokerOwnsItsDirectory(t *testing.T) {
	dir := t.TempDir()
	_, stop, err := StartEmbedded(dir)
	require.NoError(t, err)
	_, _, err = StartEmbedded(dir)
	require.ErrorContains(t, err, "another embedded NATS server runs on "+dir)
	stop()
	_, stop, err = StartEmbedded(dir)
	require.NoError(t, err)
	stop()
}
