// Package testpki makes throwaway certificates for tests that run real TLS
// (and for the processes they start: the CAPI manager's and Gatekeeper's
// webhook servers), serves handlers behind nodeguard's TLS server with them,
// and calls them.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// CA is a throwaway certificate authority that signs server and client
// certificates: the one certificate helper of the tests and of the
// processes they run (package localcluster).
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	dir  string
}

// validity is each certificate's: longer than any test run.
const validity = 24 * time.Hour

// NewCA creates a CA whose files (CAFile, ServerFiles) go into dir.
func NewCA(dir string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "nodeguard test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(validity),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	return &CA{cert: cert, key: key, dir: dir}, nil
}

// New creates a CA whose files live in a test temp dir.
func New(t testing.TB) *CA {
	t.Helper()
	p, err := NewCA(t.TempDir())
	require.NoError(t, err)
	return p
}

// Pool trusts the CA.
func (p *CA) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(p.cert)
	return pool
}

// PEM is the CA's certificate: a CA bundle.
func (p *CA) PEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.cert.Raw})
}

// Leaf signs a certificate for 127.0.0.1 with these uses; its serial tells
// certificates apart.
func (p *CA) Leaf(serial int64, usages ...x509.ExtKeyUsage) (certPEM, keyPEM []byte, err error) {
	return p.leaf(big.NewInt(serial), "nodeguard", usages)
}

// LeafNamed is Leaf with the common name cn (and a serial of its own).
func (p *CA) LeafNamed(cn string, usages ...x509.ExtKeyUsage) (certPEM, keyPEM []byte, err error) {
	return p.leaf(big.NewInt(time.Now().UnixNano()), cn, usages)
}

func (p *CA) leaf(serial *big.Int, cn string, usages []x509.ExtKeyUsage) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(validity),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usages,
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.cert, &key.PublicKey, p.key)
	if err != nil {
		return nil, nil, fmt.Errorf("certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

// Issue signs a leaf for 127.0.0.1; its serial tells certificates apart.
func (p *CA) Issue(t testing.TB, serial int64, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
	t.Helper()
	certPEM, keyPEM, err := p.Leaf(serial, usage)
	require.NoError(t, err)
	return certPEM, keyPEM
}

// WriteTLS writes into dir a leaf for serving and client authentication
// (tls.crt, tls.key) and the CA (ca.crt), the layout controller-runtime's
// and Gatekeeper's servers read.
func (p *CA) WriteTLS(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("cert dir: %w", err)
	}
	certPEM, keyPEM, err := p.Leaf(time.Now().UnixNano(), x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM, "ca.crt": p.PEM()} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	return nil
}

// ServerFiles writes a server certificate and key to files named for tag.
func (p *CA) ServerFiles(t testing.TB, tag string) (certFile, keyFile string) {
	t.Helper()
	certPEM, keyPEM := p.Issue(t, time.Now().UnixNano(), x509.ExtKeyUsageServerAuth)
	certFile, keyFile = filepath.Join(p.dir, tag+".crt"), filepath.Join(p.dir, tag+".key")
	require.NoError(t, os.WriteFile(certFile, certPEM, 0o600))
	require.NoError(t, os.WriteFile(keyFile, keyPEM, 0o600))
	return certFile, keyFile
}

// CAFile writes the CA certificate and returns its path.
func (p *CA) CAFile(t testing.TB) string {
	t.Helper()
	f := filepath.Join(p.dir, "ca.crt")
	require.NoError(t, os.WriteFile(f, p.PEM(), 0o600))
	return f
}

// KeyFile writes the CA's private key (PKCS#8 PEM) and returns its path:
// for a process that issues certificates with this CA.
func (p *CA) KeyFile(t testing.TB) string {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(p.key)
	require.NoError(t, err)
	f := filepath.Join(p.dir, "ca.key")
	require.NoError(t, os.WriteFile(f, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600))
	return f
}

// CAPEM is the PEM certificate of a new CA: a CA bundle for tests that
// need one and never serve with it.
func CAPEM(t testing.TB) []byte {
	t.Helper()
	return New(t).PEM()
}
