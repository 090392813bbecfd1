package webhook_test

import (
	"crypto/tls"
	"crypto/x509"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"

	"github.com/nodeguard/nodeguard/enforcer/tlsserver"
	"github.com/nodeguard/nodeguard/enforcer/webhook"
	"github.com/nodeguard/nodeguard/internal/testpki"
)

func TestClientCertificateRequiredForReviews(t *testing.T) {
	g, _, nodes := example(t)
	p := testpki.New(t)
	certFile, keyFile := p.ServerFiles(t, "server")
	h := webhook.New(webhook.Options{Decider: g, ClientCAs: p.Pool()})
	opts := tlsserver.Options{CertFile: certFile, KeyFile: keyFile, ClientCAFiles: []string{p.CAFile(t)}}
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
