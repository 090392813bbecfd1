package admission_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/events"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/internal/testpki"
)

func TestClientCertificateRequiredForReviews(t *testing.T) {
	g, _, nodes := example(t)
	p := testpki.New(t)
	certFile, keyFile := p.ServerFiles(t, "server")
	h := admission.NewWebhook(admission.WebhookOptions{Decider: g, ClientCAs: p.Pool()})
	opts := admission.TLSOptions{CertFile: certFile, KeyFile: keyFile, ClientCAFiles: []string{p.CAFile(t)}}
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

// A cluster route's denial is recorded as an Event only for a caller the
// client CA authenticated: anyone reaching an exposed port could otherwise
// have Events written naming any Node and user. /validate's is recorded
// either way (the in-cluster API server's route).
func TestClusterRouteEventsOnlyForAuthenticatedReviews(t *testing.T) {
	g, _, nodes := example(t)
	p := testpki.New(t)
	certFile, keyFile := p.ServerFiles(t, "server")
	body := review(admissionv1.Delete, "Node", nodes[linkedNode].Object)
	exists := admission.ClustersFunc(func(context.Context, string) (bool, rule.Action, error) { return true, "", nil })
	var mu sync.Mutex
	var told []string
	denied := func(d events.Denial) {
		mu.Lock()
		defer mu.Unlock()
		told = append(told, d.Cluster+"|"+d.Node)
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(told)
	}

	open := serveWith(t, p, admission.NewWebhook(admission.WebhookOptions{Decider: g, Clusters: exists, Denied: denied}),
		admission.TLSOptions{CertFile: certFile, KeyFile: keyFile}, nil)
	_, _, out := open.post(t, "/validate/clusters/default/dev", "application/json", body)
	assert.False(t, out.Response.Allowed, "denied all the same")
	_, _, out = open.post(t, "/validate", "application/json", body)
	assert.False(t, out.Response.Allowed)
	assert.Equal(t, 1, count(), "only /validate's denial is told without a client CA")

	certPEM, keyPEM := p.Issue(t, 9, x509.ExtKeyUsageClientAuth)
	clientCert, err := tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(t, err)
	authenticated := serveWith(t, p, admission.NewWebhook(admission.WebhookOptions{Decider: g, Clusters: exists, Denied: denied, ClientCAs: p.Pool()}),
		admission.TLSOptions{CertFile: certFile, KeyFile: keyFile, ClientCAFiles: []string{p.CAFile(t)}}, &clientCert)
	_, _, out = authenticated.post(t, "/validate/clusters/default/dev", "application/json", body)
	assert.False(t, out.Response.Allowed)
	assert.Equal(t, 2, count(), "an authenticated cluster route's denial is told")
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, "default/dev|x", told[1], "the review names Node x")
}

// The cluster routes alone can require client certificates: the workload
// API servers present one, the cluster's own API server (/validate) need
// not.
func TestClusterRoutesAloneRequireClientCertificates(t *testing.T) {
	g, _, nodes := example(t)
	p := testpki.New(t)
	certFile, keyFile := p.ServerFiles(t, "server")
	exists := admission.ClustersFunc(func(context.Context, string) (bool, rule.Action, error) { return true, "", nil })
	h := admission.NewWebhook(admission.WebhookOptions{Decider: g, Clusters: exists, ClusterClientCAs: p.Pool()})
	opts := admission.TLSOptions{CertFile: certFile, KeyFile: keyFile, ClientCAFiles: []string{p.CAFile(t)}}
	body := review(admissionv1.Delete, "Node", nodes[linkedNode].Object)
	anonymous := serveWith(t, p, h, opts, nil)
	code, msg, _ := anonymous.post(t, "/validate/clusters/default/dev", "application/json", body)
	assert.Equal(t, 401, code, msg)
	code, _, out := anonymous.post(t, "/validate", "application/json", body)
	assert.Equal(t, 200, code, "the self route takes the cluster's own API server without one")
	assert.False(t, out.Response.Allowed)

	certPEM, keyPEM := p.Issue(t, 10, x509.ExtKeyUsageClientAuth)
	clientCert, err := tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(t, err)
	workload := serveWith(t, p, h, opts, &clientCert)
	code, _, out = workload.post(t, "/validate/clusters/default/dev", "application/json", body)
	assert.Equal(t, 200, code)
	assert.False(t, out.Response.Allowed)
}

// With per-Cluster identities, a cluster route takes only the certificate
// issued for its own Cluster: another Cluster's, though of the same CA, is
// refused (401, counted as wrong-cluster-certificate), on the registration
// route too; /validate is not a cluster route.
func TestClusterRoutesTakeOnlyTheirOwnClustersCertificate(t *testing.T) {
	g, _, nodes := example(t)
	p := testpki.New(t)
	certFile, keyFile := p.ServerFiles(t, "server")
	exists := admission.ClustersFunc(func(context.Context, string) (bool, rule.Action, error) { return true, "", nil })
	h := admission.NewWebhook(admission.WebhookOptions{Decider: g, Clusters: exists, ClusterIdentities: p.Pool()})
	opts := admission.TLSOptions{CertFile: certFile, KeyFile: keyFile, ClientCAFiles: []string{p.CAFile(t)}}
	body := review(admissionv1.Delete, "Node", nodes[linkedNode].Object)
	issued := func(cluster string) *tls.Certificate {
		certPEM, keyPEM, err := p.LeafNamed(admission.ClusterClientName(cluster), x509.ExtKeyUsageClientAuth)
		require.NoError(t, err)
		c, err := tls.X509KeyPair(certPEM, keyPEM)
		require.NoError(t, err)
		return &c
	}
	dev := serveWith(t, p, h, opts, issued("default/dev"))
	code, _, out := dev.post(t, "/validate/clusters/default/dev", "application/json", body)
	assert.Equal(t, 200, code)
	assert.False(t, out.Response.Allowed, "judged")
	code, msg, _ := dev.post(t, "/validate/clusters/default/two", "application/json", body)
	assert.Equal(t, 401, code)
	assert.Contains(t, msg, "was not issued for Cluster default/two")
	code, _, _ = dev.post(t, "/register/clusters/default/two", "application/json", body)
	assert.Equal(t, 401, code)
	code, _, _ = dev.post(t, "/validate", "application/json", body)
	assert.Equal(t, 200, code, "the self route is no cluster's")
	// A certificate of the CA that names no Cluster at all.
	certPEM, keyPEM := p.Issue(t, 11, x509.ExtKeyUsageClientAuth)
	plain, err := tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(t, err)
	code, _, _ = serveWith(t, p, h, opts, &plain).post(t, "/validate/clusters/default/dev", "application/json", body)
	assert.Equal(t, 401, code)
}
