package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/config"
)

// writePEMPair writes a self-signed certificate and its key for cn under dir.
func writePEMPair(t *testing.T, dir, cn string) (certPath, keyPath string, cert *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, DNSNames: []string{cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err = x509.ParseCertificate(der)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certPath, keyPath = filepath.Join(dir, cn+".crt"), filepath.Join(dir, cn+".key")
	require.NoError(t, os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))
	return certPath, keyPath, cert
}

// TestTemporalOptionsSecurity: the TLS and API key settings become the client's connection
// options, and a setting that cannot work is refused before anything is dialed.
func TestTemporalOptionsSecurity(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	clientCert, clientKey, client := writePEMPair(t, dir, "kasa-client")
	caCert, _, ca := writePEMPair(t, dir, "temporal-ca")
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
			_, err = tc.rootCA.Verify(x509.VerifyOptions{Roots: c.RootCAs, DNSName: tc.rootCA.Subject.CommonName})
			require.NoError(t, err, "the CA file's certificate is a root")
		})
	}
}
