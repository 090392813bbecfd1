package webhook_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"

	"github.com/nodeguard/nodeguard/enforcer/webhook"
	"github.com/nodeguard/nodeguard/internal/testpki"
)

func TestCertificateIsReloadedWhenTheFilesChange(t *testing.T) {
	g, _, _ := example(t)
	p := testpki.New(t)
	certFile, keyFile := p.ServerFiles(t, "server")
	first, err := tls.LoadX509KeyPair(certFile, keyFile)
	require.NoError(t, err)
	s := serveWith(t, p, webhook.New(webhook.Options{Decider: g}),
		webhook.TLSOptions{CertFile: certFile, KeyFile: keyFile, WatchInterval: 100 * time.Millisecond}, nil)
	served := func() []byte {
		conn, err := tls.Dial("tcp", s.url[len("https://"):], &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // reads the served certificate only
		require.NoError(t, err)
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].Raw
	}
	assert.Equal(t, first.Certificate[0], served())

	// cert-manager renews: new files in place.
	certPEM, keyPEM := p.Issue(t, 4242, x509.ExtKeyUsageServerAuth)
	require.NoError(t, os.WriteFile(keyFile, keyPEM, 0o600))
	require.NoError(t, os.WriteFile(certFile, certPEM, 0o600))
	block, _ := pem.Decode(certPEM)
	assert.Eventually(t, func() bool { return string(served()) == string(block.Bytes) }, 10*time.Second, 50*time.Millisecond,
		"the server must present the renewed certificate without a restart")
}

func TestClientCertificateRequiredForReviews(t *testing.T) {
	g, _, nodes := example(t)
	p := testpki.New(t)
	certFile, keyFile := p.ServerFiles(t, "server")
	h := webhook.New(webhook.Options{Decider: g, ClientCAs: p.Pool()})
	opts := webhook.TLSOptions{CertFile: certFile, KeyFile: keyFile, ClientCAFiles: []string{p.CAFile(t)}}
	body := review(admissionv1.Delete, "Node", nodes[linkedNode].Object)

	anonymous := serveWith(t, p, h, opts, nil)
	code, msg, _ := anonymous.post(t, "/validate", "application/json", body)
	assert.Equal(t, 401, code, msg)

	certPEM, keyPEM := p.Issue(t, 7, x509.ExtKeyUsageClientAuth)
	clientCert, err := tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(t, err)
	apiServer := serveWith(t, p, h, opts, &clientCert)
	code, _, out := apiServer.post(t, "/validate", "application/json", body)
	assert.Equal(t, 200, code)
	assert.False(t, out.Response.Allowed)

	stranger := testpki.New(t)
	certPEM, keyPEM = stranger.Issue(t, 8, x509.ExtKeyUsageClientAuth)
	foreign, err := tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(t, err)
	other := serveWith(t, p, h, opts, &foreign)
	_, err = other.client.Post(other.url+"/validate", "application/json", nil)
	assert.Error(t, err, "a certificate from another CA fails the handshake")
}

func TestTLSBelow12IsRefused(t *testing.T) {
	g, _, _ := example(t)
	s := serve(t, webhook.New(webhook.Options{Decider: g}), webhook.TLSOptions{}, nil)
	_, err := tls.Dial("tcp", s.url[len("https://"):], &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS11}) //nolint:gosec // the point of the test
	assert.Error(t, err)
}

func TestServerNeedsCertificates(t *testing.T) {
	_, err := webhook.NewServer(nil, webhook.TLSOptions{}, nil)
	assert.ErrorContains(t, err, "--tls-cert-file")
}
