package main

import (
	"crypto/x509"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/config"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// TestTemporalOptionsSecurity: the TLS and API key settings become the client's connection
// options, and a setting that cannot work is refused before anything is dialed.
func TestTemporalOptionsSecurity(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	authority := testkit.NewCA(t, "temporal-ca")
	clientCert, clientKey := authority.Issue(t, "kasa-client")
	caCert, client, ca := authority.File, testkit.ReadCert(t, clientCert), testkit.ReadCert(t, authority.File)
	notPEM := filepath.Join(dir, "not.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("not a certificate"), 0o600))

	for _, tc := range []struct {
		name                           string
		cert, key, caFile, sni, apiKey string
		wantErr                        string
		tls, credentials, clientCert   bool
		rootCA                         *x509.Certificate
	}{
		{name: "plain (a dev server)"},
		{name: "server CA only", caFile: caCert, tls: true, rootCA: ca},
		{name: "server name only", sni: "temporal.internal", tls: true},
		{name: "mTLS with CA and server name", cert: clientCert, key: clientKey, caFile: caCert, sni: "temporal.internal",
			tls: true, clientCert: true, rootCA: ca},
		{name: "API key alone turns TLS on", apiKey: "key-123", tls: true, credentials: true},
		{name: "API key with a CA", apiKey: "key-123", caFile: caCert, tls: true, credentials: true, rootCA: ca},
		{name: "cert without key", cert: clientCert, wantErr: "KASA_TEMPORAL_TLS_CERT and KASA_TEMPORAL_TLS_KEY go together"},
		{name: "key without cert", key: clientKey, wantErr: "KASA_TEMPORAL_TLS_CERT and KASA_TEMPORAL_TLS_KEY go together"},
		{name: "unreadable cert", cert: filepath.Join(dir, "missing.crt"), key: clientKey, wantErr: "KASA_TEMPORAL_TLS_CERT / KASA_TEMPORAL_TLS_KEY: open"},
		{name: "unreadable CA", caFile: filepath.Join(dir, "missing.pem"), wantErr: "KASA_TEMPORAL_TLS_CA: open"},
		{name: "CA not PEM", caFile: notPEM, wantErr: "KASA_TEMPORAL_TLS_CA: no PEM certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var cfg config.Config
			cfg.Temporal.Namespace = "default"
			cfg.Temporal.TLSCert, cfg.Temporal.TLSKey, cfg.Temporal.TLSCA = tc.cert, tc.key, tc.caFile
			cfg.Temporal.TLSServerName, cfg.Temporal.APIKey = tc.sni, tc.apiKey
			o, err := temporalOptions(cfg, slog.New(slog.DiscardHandler))
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, "default", o.Namespace)
			require.Equal(t, tc.credentials, o.Credentials != nil, "credentials")
			c := o.ConnectionOptions.TLS
			if !tc.tls {
				require.Nil(t, c)
				return
			}
			require.NotNil(t, c)
			require.Equal(t, tc.sni, c.ServerName)
			if tc.clientCert {
				require.Len(t, c.Certificates, 1)
				require.Equal(t, client.Raw, c.Certificates[0].Certificate[0])
			} else {
				require.Empty(t, c.Certificates)
			}
			if tc.rootCA == nil {
				require.Nil(t, c.RootCAs, "the system's roots")
				return
			}
			require.NotNil(t, c.RootCAs)
			_, err = tc.rootCA.Verify(x509.VerifyOptions{Roots: c.RootCAs})
			require.NoError(t, err, "the CA file's certificate is a root")
		})
	}
}
