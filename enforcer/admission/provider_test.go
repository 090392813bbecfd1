package admission_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/open-policy-agent/frameworks/constraint/pkg/externaldata"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/internal/stacks"
	"github.com/nodeguard/nodeguard/internal/testcluster"
	"github.com/nodeguard/nodeguard/internal/testlog"
	"github.com/nodeguard/nodeguard/internal/testpki"
)

const providerLinkedNode = "dev-md-0-x7k2p-abcde" // its Machine and DockerMachine exist in the example

// exampleGuard is a Guard over the CAPD example (no fresh reads).
func exampleGuard(t testing.TB) (*guard.Guard, map[string]*unstructured.Unstructured) {
	g, _, nodes := testcluster.ExampleGuard(t, "../../examples/capd-v1beta2", guard.Options{})
	return g, nodes
}

// key is what the K8sNodeGuardExternal template sends for a review of node
// (provider_key in policies/lib/nodeguard/provider.rego): the uid and the
// Node's declared fields.
func key(t testing.TB, uid string, node *unstructured.Unstructured) string {
	t.Helper()
	b, err := json.Marshal(map[string]any{"uid": uid, "node": rule.MustEmbeddedModel().NodeShape().FromUnstructured(node).Object()})
	require.NoError(t, err)
	return string(b)
}

func request(keys ...string) []byte {
	b, _ := json.Marshal(externaldata.NewProviderRequest(keys))
	return b
}

type providerServer struct {
	url     string
	pki     *testpki.CA
	reg     *prometheus.Registry
	clients map[string]*http.Client
}

// providerServe runs the provider behind nodeguard's TLS server. Clients: "gatekeeper"
// has a certificate of the provider's client CA, "apiserver" one of the review
// routes' CA, "anonymous" none.
func providerServe(t testing.TB, facts admission.ProviderFacts, clusterExists func(context.Context, string, string) (bool, error)) *providerServer {
	t.Helper()
	return providerServeWith(t, facts, clusterExists, nil)
}

// providerServeWith is providerServe with a decision log.
func providerServeWith(t testing.TB, facts admission.ProviderFacts, clusterExists func(context.Context, string, string) (bool, error),
	dlog *rule.DecisionLog) *providerServer {
	t.Helper()
	pki, gatekeeperCA, apiServerCA := testpki.New(t), testpki.New(t), testpki.New(t)
	reg := prometheus.NewRegistry()
	im, err := admission.NewIntakeMetrics(reg)
	require.NoError(t, err)
	pm, err := admission.NewProviderMetrics(reg)
	require.NoError(t, err)
	in := admission.NewIntake(admission.IntakeOptions{Timeout: 2 * time.Second, Metrics: im})
	var clusters admission.Clusters
	if clusterExists != nil {
		clusters = admission.ClustersFunc(func(ctx context.Context, key string) (bool, rule.Action, error) {
			ns, name, _ := strings.Cut(key, "/")
			ok, err := clusterExists(ctx, ns, name)
			return ok, "", err
		})
	}
	h, err := admission.NewProvider(admission.ProviderOptions{Facts: facts, ClientCAs: gatekeeperCA.Pool(), Clusters: clusters, Intake: in, Metrics: pm,
		DecisionLog: dlog})
	require.NoError(t, err)
	url, _ := pki.Serve(t, h, admission.TLSOptions{ClientCAFiles: []string{gatekeeperCA.CAFile(t), apiServerCA.CAFile(t)}})
	client := func(ca *testpki.CA) *http.Client {
		// As Gatekeeper's client: TLS 1.3, its webhook certificate.
		cfg := &tls.Config{RootCAs: pki.Pool(), MinVersion: tls.VersionTLS13, ServerName: "127.0.0.1"}
		if ca != nil {
			certPEM, keyPEM := ca.Issue(t, 2, x509.ExtKeyUsageClientAuth)
			cert, err := tls.X509KeyPair(certPEM, keyPEM)
			require.NoError(t, err)
			cfg.Certificates = []tls.Certificate{cert}
		}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 10 * time.Second}
	}
	return &providerServer{url: url, pki: pki, reg: reg, clients: map[string]*http.Client{
		"gatekeeper": client(gatekeeperCA), "apiserver": client(apiServerCA), "anonymous": client(nil)}}
}

func (s *providerServer) post(t testing.TB, client, path string, body []byte) (int, string, *externaldata.ProviderResponse) {
	t.Helper()
	return testpki.Post[externaldata.ProviderResponse](t, s.clients[client], s.url+path, "application/json", body)
}

// kinds lists the Kind/namespace/name of an answer's inventory.
func kinds(t testing.TB, value any) []string {
	t.Helper()
	var out []string
	inv := value.(map[string]any)["inventory"].(map[string]any)["namespace"].(map[string]any)
	for ns, byGV := range inv {
		for _, byKind := range byGV.(map[string]any) {
			for kind, byName := range byKind.(map[string]any) {
				for name := range byName.(map[string]any) {
					out = append(out, kind+" "+ns+"/"+name)
				}
			}
		}
	}
	return out
}

func TestEachKeyIsAnsweredWithWhatTheRuleReadsForItsNode(t *testing.T) {
	g, nodes := exampleGuard(t)
	s := providerServe(t, g, nil)
	free := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": "free-0"}, "spec": map[string]any{"providerID": "docker:////free-0"}}}
	linked, unlinked := key(t, "uid-1", nodes[providerLinkedNode]), key(t, "uid-2", free)
	code, raw, out := s.post(t, "gatekeeper", "/externaldata", request(linked, unlinked))
	require.Equal(t, 200, code, raw)
	assert.Equal(t, "ProviderResponse", string(out.Kind))
	assert.Equal(t, "externaldata.gatekeeper.sh/v1beta1", out.APIVersion)
	require.Len(t, out.Response.Items, 2)
	first := out.Response.Items[0]
	assert.Equal(t, linked, first.Key)
	assert.Empty(t, first.Error)
	assert.ElementsMatch(t, []string{"Machine default/" + providerLinkedNode, "DockerMachine default/" + providerLinkedNode}, kinds(t, first.Value))
	params := first.Value.(map[string]any)["parameters"].(map[string]any)
	assert.Contains(t, params, "infraMachineKinds", "the synced kinds, which the rule takes from the answer")
	assert.Equal(t, unlinked, out.Response.Items[1].Key)
	assert.Empty(t, kinds(t, out.Response.Items[1].Value), "nothing links to %s", free.GetName())
	assert.Empty(t, out.Response.SystemError)
	assert.False(t, out.Response.Idempotent, "facts change: an answer is for the review that asked")
}

func TestBadKeysGetAnErrorEachAndTheOthersTheirFacts(t *testing.T) {
	g, nodes := exampleGuard(t)
	s := providerServe(t, g, nil)
	good := key(t, "uid-1", nodes[providerLinkedNode])
	bad := map[string]string{
		"not JSON":          "dev-md-0",
		"no uid":            key(t, "", nodes[providerLinkedNode]),
		"no Node":           `{"uid":"u"}`,
		"no name":           `{"uid":"u","node":{"spec":{"providerID":"docker:////x"}}}`,
		"non-string field":  `{"uid":"u","node":{"metadata":{"name":"x"},"spec":{"providerID":7}}}`,
		"Node not a object": `{"uid":"u","node":"x"}`,
	}
	for name, k := range bad {
		code, raw, out := s.post(t, "gatekeeper", "/externaldata", request(k, good))
		require.Equal(t, 200, code, raw)
		require.Len(t, out.Response.Items, 2, name)
		assert.Contains(t, out.Response.Items[0].Error, "the key is not one the K8sNodeGuardExternal template sends", name)
		assert.Nil(t, out.Response.Items[0].Value, name)
		assert.Empty(t, out.Response.Items[1].Error, name)
		assert.NotEmpty(t, kinds(t, out.Response.Items[1].Value), name)
	}
	n, err := testutil.GatherAndCount(s.reg, "nodeguard_externaldata_key_errors_total")
	require.NoError(t, err)
	assert.Equal(t, 1, n, "one reason: bad-key")
	assert.NoError(t, testutil.GatherAndCompare(s.reg, strings.NewReader(`
# HELP nodeguard_externaldata_key_errors_total Keys answered with an error instead of facts (Gatekeeper then denies the delete), by route and reason.
# TYPE nodeguard_externaldata_key_errors_total counter
nodeguard_externaldata_key_errors_total{reason="bad-key",route="/externaldata"} 6
`), "nodeguard_externaldata_key_errors_total"))
}

// Only Gatekeeper's client certificate opens the routes: not the API
// server's (the review routes' CA), not none.
func TestOnlyGatekeepersCertificateIsAnswered(t *testing.T) {
	g, nodes := exampleGuard(t)
	s := providerServe(t, g, nil)
	body := request(key(t, "uid-1", nodes[providerLinkedNode]))
	for _, client := range []string{"anonymous", "apiserver"} {
		code, raw, _ := s.post(t, client, "/externaldata", body)
		assert.Equal(t, http.StatusUnauthorized, code, client+": "+raw)
		code, _, _ = s.post(t, client, "/externaldata/clusters/default/dev", body)
		assert.Equal(t, http.StatusUnauthorized, code, client)
	}
	code, _, _ := s.post(t, "gatekeeper", "/externaldata", body)
	assert.Equal(t, 200, code)
	assert.NoError(t, testutil.GatherAndCompare(s.reg, strings.NewReader(`
# HELP nodeguard_rejected_requests_total Requests answered with an HTTP error instead of a decision (malformed, wrong method or type, too large, no client certificate), by reason.
# TYPE nodeguard_rejected_requests_total counter
nodeguard_rejected_requests_total{reason="client-cert"} 4
`), "nodeguard_rejected_requests_total"))
	requests, err := testutil.GatherAndCount(s.reg, "nodeguard_externaldata_requests_total")
	require.NoError(t, err)
	assert.Equal(t, 3, requests, "answered and rejected, on two routes")
}

func TestMalformedRequestsAreRejected(t *testing.T) {
	g, nodes := exampleGuard(t)
	s := providerServe(t, g, nil)
	k := key(t, "uid-1", nodes[providerLinkedNode])
	many := make([]string, admission.MaxProviderKeys+1)
	for i := range many {
		many[i] = k
	}
	for name, tc := range map[string]struct {
		body []byte
		code int
		msg  string
	}{
		"not JSON":     {[]byte(`{"kind":`), 400, "malformed ProviderRequest"},
		"not a review": {[]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`), 400, "want kind ProviderRequest"},
		"no keys":      {request(), 400, "want 1 to 16 keys, got 0"},
		"many keys":    {request(many...), 400, "want 1 to 16 keys, got 17"},
	} {
		code, raw, _ := s.post(t, "gatekeeper", "/externaldata", tc.body)
		assert.Equal(t, tc.code, code, name)
		assert.Contains(t, raw, tc.msg, name)
	}
}

// fakeFacts wraps a Guard to fail as a live one can.
type fakeFacts struct {
	*guard.Guard
	notReady   error
	recovering error
	reads      atomic.Int64
	objects    func(context.Context) error
	// parsed counts the keys read: the provider asks for the model to
	// decode each, just before it looks for their facts.
	parsed atomic.Int64
}

func (f *fakeFacts) Ready() error { return f.notReady }

func (f *fakeFacts) Recovering() error { return f.recovering }

func (f *fakeFacts) Model() *rule.Model {
	f.parsed.Add(1)
	return f.Guard.Model()
}

func (f *fakeFacts) Objects(ctx context.Context, node *unstructured.Unstructured, fresh bool) ([]*unstructured.Unstructured, error) {
	f.reads.Add(1)
	if f.objects != nil {
		if err := f.objects(ctx); err != nil {
			return nil, err
		}
	}
	return f.Guard.Objects(ctx, node, fresh)
}

func TestWhatCannotBeReadIsAnErrorNeverAnEmptyAnswer(t *testing.T) {
	g, nodes := exampleGuard(t)
	k := key(t, "uid-1", nodes[providerLinkedNode])

	s := providerServe(t, &fakeFacts{Guard: g, notReady: errors.New("waiting for DockerMachine informer")}, nil)
	_, _, out := s.post(t, "gatekeeper", "/externaldata", request(k))
	assert.Contains(t, out.Response.Items[0].Error, "nodeguard is not ready (waiting for DockerMachine informer)")
	assert.Nil(t, out.Response.Items[0].Value)

	s = providerServe(t, &fakeFacts{Guard: g, recovering: errors.New("the cache of DockerMachine is catching up")}, nil)
	_, _, out = s.post(t, "gatekeeper", "/externaldata", request(k))
	assert.Contains(t, out.Response.Items[0].Error, "the cache of DockerMachine is catching up, so nodeguard cannot tell everything linked")
	assert.Nil(t, out.Response.Items[0].Value, "an answer could lack what was made while the watch was down")

	s = providerServe(t, &fakeFacts{Guard: g, objects: func(context.Context) error { return errors.New("get Machine: connection refused") }}, nil)
	_, _, out = s.post(t, "gatekeeper", "/externaldata", request(k))
	assert.Contains(t, out.Response.Items[0].Error, "could not re-read the objects linked to Node \""+providerLinkedNode+"\"")
	assert.Contains(t, out.Response.Items[0].Error, "connection refused")

	exists := func(_ context.Context, ns, name string) (bool, error) { return ns == "default" && name == "dev", nil }
	s = providerServe(t, g, exists)
	_, _, out = s.post(t, "gatekeeper", "/externaldata/clusters/default/other", request(k))
	assert.Contains(t, out.Response.Items[0].Error, "names Cluster default/other, which the management cluster does not have")
	_, _, out = s.post(t, "gatekeeper", "/externaldata/clusters/default/dev", request(k))
	require.Empty(t, out.Response.Items[0].Error)
	params := out.Response.Items[0].Value.(map[string]any)["parameters"].(map[string]any)
	assert.Equal(t, "dev", params["clusterName"], "the route's cluster scope goes to the rule")
	assert.Equal(t, "default", params["clusterNamespace"])
}

// Concurrent keys of one Node share one read; the uid does not split them.
func TestConcurrentKeysOfOneNodeShareOneRead(t *testing.T) {
	g, nodes := exampleGuard(t)
	release := make(chan struct{})
	f := &fakeFacts{Guard: g, objects: func(context.Context) error { <-release; return nil }}
	s := providerServe(t, f, nil)
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, out := s.post(t, "gatekeeper", "/externaldata", request(key(t, "uid-"+string(rune('a'+i)), nodes[providerLinkedNode])))
			assert.Empty(t, out.Response.Items[0].Error)
		}()
	}
	// All five keys are read, so about to join the first read (a
	// microsecond away), and it waits for release. No event announces the
	// join: the stacks show the four others waiting on the first's flight.
	require.Eventually(t, func() bool { return f.parsed.Load() == 5 }, 10*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return f.reads.Load() == 1 && stacks.Count(flightWaiter...) == 4 }, 10*time.Second, time.Millisecond,
		"the first key reads, the four others wait on its flight")
	close(release)
	wg.Wait()
	assert.EqualValues(t, 1, f.reads.Load())
}

// With a decision log, each key's answer is logged: its facts, or its error.
func TestEachAnswerIsDecisionLogged(t *testing.T) {
	g, nodes := exampleGuard(t)
	var console testlog.Buffer
	dlog, err := rule.StartDecisionLog(context.Background(), rule.DecisionLogOptions{Console: true, ConsoleOutput: &console})
	require.NoError(t, err)
	s := providerServeWith(t, g, nil, dlog)
	linked := key(t, "uid-1", nodes[providerLinkedNode])
	code, raw, _ := s.post(t, "gatekeeper", "/externaldata", request(linked, "not-a-key"))
	require.Equal(t, 200, code, raw)
	lines := console.LinesAfter(t, dlog.Stop)
	require.Len(t, lines, 2)
	for _, l := range lines {
		assert.Equal(t, admission.ExternalDataPath, l["path"])
		result := l["result"].(map[string]any)
		switch l["input"].(map[string]any)["key"] {
		case linked:
			assert.ElementsMatch(t, []string{"Machine default/" + providerLinkedNode, "DockerMachine default/" + providerLinkedNode}, kinds(t, result["value"]))
			assert.Empty(t, result["error"])
		default:
			assert.NotEmpty(t, result["error"])
		}
	}
}
