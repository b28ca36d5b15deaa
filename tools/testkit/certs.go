package testkit

import (
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
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// CA is a throwaway certificate authority for TLS tests; its certificate is in File.
type CA struct {
	File string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	dir  string
}

// NewCA makes a CA valid for an hour, its files in a directory of the test's.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	ca := &CA{dir: t.TempDir()}
	tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: name}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	ca.cert, ca.key, ca.File, _ = ca.issue(t, "ca", tmpl, nil, nil)
	return ca
}

// Issue makes a certificate the CA signed, for hosts (names or addresses), usable as a server's
// and a client's; it returns the PEM files of the certificate and its key.
func (ca *CA) Issue(t testing.TB, name string, hosts ...string) (certFile, keyFile string) {
	t.Helper()
	tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: name}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	_, _, certFile, keyFile = ca.issue(t, name, tmpl, ca.cert, ca.key)
	return certFile, keyFile
}

func (ca *CA) issue(t testing.TB, name string, tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey, string, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	require.NoError(t, err)
	tmpl.SerialNumber, tmpl.NotBefore, tmpl.NotAfter = serial, time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile := filepath.Join(ca.dir, name+".pem"), filepath.Join(ca.dir, name+"-key.pem")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))
	return cert, key, certFile, keyFile
}

// ReadCert parses the first certificate of a PEM file.
func ReadCert(t testing.TB, file string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	block, _ := pem.Decode(b)
	require.NotNil(t, block, "%s holds no PEM block", file)
	cert, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	return cert
}
