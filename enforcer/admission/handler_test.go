package admission_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	eventsfake "k8s.io/client-go/kubernetes/typed/events/v1/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/events"
	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/internal/testcluster"
	"github.com/nodeguard/nodeguard/internal/testlog"
	"github.com/nodeguard/nodeguard/internal/testpki"
)

const linkedNode = "dev-md-0-x7k2p-abcde" // its DockerMachine exists in the example

// example is a Guard over the CAPD example, where ops is an exempt group.
func example(t testing.TB) (*guard.Guard, *facts.Inventory, map[string]*unstructured.Unstructured) {
	return testcluster.ExampleGuard(t, "../../examples/capd-v1beta2", guard.Options{Parameters: map[string]any{"exemptGroups": []any{"ops"}}})
}

// review is an AdmissionReview of one operation on one object.
func review(op admissionv1.Operation, kind string, obj any, groups ...string) []byte {
	raw, _ := json.Marshal(obj)
	r := map[string]any{
		"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
		"request": map[string]any{
			"uid": "7f0b2f6c-1111-2222-3333-444455556666", "operation": op, "name": "x",
			"kind":     map[string]any{"group": "", "version": "v1", "kind": kind},
			"resource": map[string]any{"group": "", "version": "v1", "resource": strings.ToLower(kind) + "s"},
			"userInfo": map[string]any{"username": "alice", "groups": groups},
		},
	}
	if op == admissionv1.Delete {
		r["request"].(map[string]any)["oldObject"] = json.RawMessage(raw)
	} else {
		r["request"].(map[string]any)["object"] = json.RawMessage(raw)
	}
	b, _ := json.Marshal(r)
	return b
}

type server struct {
	url    string
	client *http.Client
	stop   func() error
}

// serve runs the handler behind nodeguard's TLS server on a loopback port,
// with a certificate from a new CA unless opts names one from pki.
func serve(t testing.TB, h http.Handler, opts admission.TLSOptions, clientCert *tls.Certificate) *server {
	return serveWith(t, testpki.New(t), h, opts, clientCert)
}

func serveWith(t testing.TB, pki *testpki.CA, h http.Handler, opts admission.TLSOptions, clientCert *tls.Certificate) *server {
	t.Helper()
	url, stop := pki.Serve(t, h, opts)
	tlsCfg := &tls.Config{RootCAs: pki.Pool(), MinVersion: tls.VersionTLS12, ServerName: "127.0.0.1"}
	if clientCert != nil {
		tlsCfg.Certificates = []tls.Certificate{*clientCert}
	}
	return &server{
		url:    url,
		client: &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg, MaxIdleConnsPerHost: 64}, Timeout: 10 * time.Second},
		stop:   stop,
	}
}

func (s *server) post(t testing.TB, path, contentType string, body []byte) (int, string, *admissionv1.AdmissionReview) {
	t.Helper()
	return testpki.Post[admissionv1.AdmissionReview](t, s.client, s.url+path, contentType, body)
}

func TestDecisions(t *testing.T) {
	g, _, nodes := example(t)
	s := serve(t, admission.NewWebhook(admission.WebhookOptions{Decider: g}), admission.TLSOptions{}, nil)

	_, _, out := s.post(t, "/validate", "application/json", review(admissionv1.Delete, "Node", nodes[linkedNode].Object))
	require.NotNil(t, out.Response)
	assert.Equal(t, "7f0b2f6c-1111-2222-3333-444455556666", string(out.Response.UID))
	assert.Equal(t, "admission.k8s.io/v1", out.APIVersion)
	assert.False(t, out.Response.Allowed)
	require.NotNil(t, out.Response.Result)
	assert.EqualValues(t, http.StatusForbidden, out.Response.Result.Code)
	assert.Contains(t, out.Response.Result.Message, "DockerMachine default/"+linkedNode)

	_, _, out = s.post(t, "/validate", "application/json", review(admissionv1.Delete, "Node", nodes[linkedNode].Object, "ops"))
	assert.True(t, out.Response.Allowed, "ops is exempt")
	require.Len(t, out.Response.Warnings, 1)
	assert.Contains(t, out.Response.Warnings[0], `group "ops" is exempt`)

	unlinked := map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": "bare-metal-1"}}
	_, _, out = s.post(t, "/validate", "application/json", review(admissionv1.Delete, "Node", unlinked))
	assert.True(t, out.Response.Allowed)
	assert.Nil(t, out.Response.Result)

	for _, body := range [][]byte{
		review(admissionv1.Update, "Node", nodes[linkedNode].Object),
		review(admissionv1.Delete, "Pod", map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": "p"}}),
	} {
		_, _, out = s.post(t, "/validate", "application/json", body)
		assert.True(t, out.Response.Allowed, "not a Node DELETE: the rule allows it")
		assert.Empty(t, out.Response.Warnings)
	}

	// A Node DELETE without oldObject reaches the rule, which denies it: it
	// cannot tell what is linked to a Node it does not see.
	for _, groups := range [][]string{nil, {"ops"}} {
		withoutOld := bytes.Replace(review(admissionv1.Delete, "Node", nodes[linkedNode].Object, groups...), []byte(`"oldObject"`), []byte(`"object"`), 1)
		code, body, out := s.post(t, "/validate", "application/json", withoutOld)
		require.Equal(t, http.StatusOK, code, body)
		assert.False(t, out.Response.Allowed, "groups %v", groups)
		assert.EqualValues(t, http.StatusForbidden, out.Response.Result.Code)
		assert.Contains(t, out.Response.Result.Message, `Node "x" cannot be judged: the DELETE request carries no oldObject`)
	}
}

func TestClusterRoute(t *testing.T) {
	g, _, nodes := example(t)
	known := map[string]bool{"default/dev": true, "default/other": true}
	exists := admission.ClustersFunc(func(_ context.Context, key string) (bool, rule.Action, error) {
		ns, name, _ := strings.Cut(key, "/")
		if ns == "broken" {
			return false, "", errors.New("connection refused")
		}
		return known[ns+"/"+name], "", nil
	})
	s := serve(t, admission.NewWebhook(admission.WebhookOptions{Decider: g, Clusters: exists}), admission.TLSOptions{}, nil)
	body := review(admissionv1.Delete, "Node", nodes[linkedNode].Object)

	_, _, out := s.post(t, "/validate/clusters/default/dev", "application/json", body)
	assert.False(t, out.Response.Allowed, "the Machine belongs to default/dev")

	// The Node's CAPI annotations name Cluster default/dev: on other's
	// route it is misrouted, not judged against other's Machines.
	_, _, out = s.post(t, "/validate/clusters/default/other", "application/json", body)
	assert.False(t, out.Response.Allowed, "misrouted")
	assert.Contains(t, out.Response.Result.Message, "this review came on the route of Cluster default/other")

	// Without the annotations, only Cluster default/other's Machines count.
	bare := nodes[linkedNode].DeepCopy()
	bare.SetAnnotations(nil)
	_, _, out = s.post(t, "/validate/clusters/default/other", "application/json", review(admissionv1.Delete, "Node", bare.Object))
	assert.True(t, out.Response.Allowed, "only Cluster default/other's Machines count")

	_, _, out = s.post(t, "/validate/clusters/default/typo", "application/json", body)
	assert.False(t, out.Response.Allowed, "an unknown Cluster in the URL must not allow everything")
	assert.Contains(t, out.Response.Result.Message, "does not have")

	_, _, out = s.post(t, "/validate/clusters/broken/x", "application/json", body)
	assert.False(t, out.Response.Allowed)
	assert.Contains(t, out.Response.Result.Message, "connection refused")

	code, _, _ := s.post(t, "/validate/clusters/default", "application/json", body)
	assert.Equal(t, http.StatusNotFound, code)
}

func TestBadInput(t *testing.T) {
	g, _, nodes := example(t)
	s := serve(t, admission.NewWebhook(admission.WebhookOptions{Decider: g,
		Register: func(context.Context, admission.Registration) (admission.RegistrationAnswer, error) {
			return admission.RegistrationAnswer{Allowed: true}, nil
		}}), admission.TLSOptions{}, nil)
	node := nodes[linkedNode].Object
	noRequest := []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`)
	notANode := review(admissionv1.Delete, "Node", map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": "p"}})
	nameless := review(admissionv1.Delete, "Node", map[string]any{"apiVersion": "v1", "kind": "Node", "spec": map[string]any{"providerID": "p"}})
	undecodable := review(admissionv1.Delete, "Node", "just a string")
	v1beta1 := bytes.Replace(review(admissionv1.Delete, "Node", node), []byte(`admission.k8s.io/v1"`), []byte(`admission.k8s.io/v1beta1"`), 1)
	noUID := bytes.Replace(review(admissionv1.Delete, "Node", node), []byte(`"uid":"7f0b2f6c-1111-2222-3333-444455556666"`), []byte(`"uid":""`), 1)
	badObject := registration(admissionv1.Create, map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": "n"},
		"spec": map[string]any{"providerID": 7}}, nil)

	// One codec reads every route's reviews: each fault has its own answer
	// on the review and the registration routes alike.
	for _, tc := range []struct {
		name, contentType string
		body              []byte
		code              int
		says              string
		routes            []string
	}{
		{"wrong content type", "text/plain", review(admissionv1.Delete, "Node", node), http.StatusUnsupportedMediaType, "want application/json", nil},
		{"too big", "application/json", bytes.Repeat([]byte(" "), admission.MaxBodyBytes+1), http.StatusRequestEntityTooLarge, "body over", nil},
		{"malformed JSON", "application/json", []byte(`{"apiVersion":`), http.StatusBadRequest, "malformed AdmissionReview JSON", nil},
		{"no request", "application/json", noRequest, http.StatusBadRequest, "has no request", nil},
		{"no uid", "application/json", noUID, http.StatusBadRequest, "no uid", nil},
		{"v1beta1", "application/json", v1beta1, http.StatusBadRequest, "want apiVersion admission.k8s.io/v1", nil},
		{"oldObject not a Node", "application/json", notANode, http.StatusBadRequest, "want a named v1 Node (the request's kind)", []string{"/validate"}},
		{"oldObject without a name", "application/json", nameless, http.StatusBadRequest, "want a named v1 Node", []string{"/validate"}},
		{"oldObject does not decode", "application/json", undecodable, http.StatusBadRequest, "oldObject does not decode", nil},
		{"object does not decode", "application/json", badObject, http.StatusBadRequest, "object does not decode", []string{"/register"}},
	} {
		routes := tc.routes
		if routes == nil {
			routes = []string{"/validate", "/register"}
		}
		for _, route := range routes {
			t.Run(tc.name+" on "+route, func(t *testing.T) {
				code, body, _ := s.post(t, route, tc.contentType, tc.body)
				assert.Equal(t, tc.code, code, body)
				assert.Contains(t, body, tc.says)
			})
		}
	}

	resp, err := s.client.Get(s.url + "/validate")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	assert.Equal(t, http.MethodPost, resp.Header.Get("Allow"))

	// charset parameters are fine.
	code, _, out := s.post(t, "/validate", "application/json; charset=utf-8", review(admissionv1.Delete, "Node", node))
	assert.Equal(t, http.StatusOK, code)
	assert.False(t, out.Response.Allowed)
}

type deciderFunc func(ctx context.Context, req guard.Request) (rule.Decision, error)

func (f deciderFunc) Decide(ctx context.Context, req guard.Request) (rule.Decision, error) {
	return f(ctx, req)
}

// KeepGroup keeps every group: these deciders read none.
func (deciderFunc) KeepGroup(string) bool { return true }

// Model is the embedded policy's link model.
func (deciderFunc) Model() *rule.Model { return rule.MustEmbeddedModel() }

func (deciderFunc) Policy() rule.Policy { return rule.Policy{Source: rule.SourceEmbedded} }

func TestNoDecisionDenies(t *testing.T) {
	_, _, nodes := example(t)
	body := review(admissionv1.Delete, "Node", nodes[linkedNode].Object)

	failing := deciderFunc(func(context.Context, guard.Request) (rule.Decision, error) {
		return rule.Decision{}, errors.New("rego: eval_conflict_error")
	})
	s := serve(t, admission.NewWebhook(admission.WebhookOptions{Decider: failing}), admission.TLSOptions{}, nil)
	_, _, out := s.post(t, "/validate", "application/json", body)
	assert.False(t, out.Response.Allowed)
	assert.EqualValues(t, http.StatusInternalServerError, out.Response.Result.Code)
	assert.Contains(t, out.Response.Result.Message, "eval_conflict_error")

	// A decision that outlives the deadline is cut off and denied in time.
	hanging := deciderFunc(func(ctx context.Context, _ guard.Request) (rule.Decision, error) {
		<-ctx.Done()
		return rule.Decision{}, ctx.Err()
	})
	s = serve(t, admission.NewWebhook(admission.WebhookOptions{Decider: hanging, Intake: admission.NewIntake(admission.IntakeOptions{Timeout: 200 * time.Millisecond})}), admission.TLSOptions{}, nil)
	start := time.Now()
	_, _, out = s.post(t, "/validate", "application/json", body)
	assert.Less(t, time.Since(start), 2*time.Second)
	assert.False(t, out.Response.Allowed)
	assert.Contains(t, out.Response.Result.Message, "context deadline exceeded")
}

// The review port serves reviews only: probes and metrics live on ports a
// NetworkPolicy can keep from whoever reaches the review port.
func TestReviewPortServesOnlyReviews(t *testing.T) {
	g, _, _ := example(t)
	s := serve(t, admission.NewWebhook(admission.WebhookOptions{Decider: g}), admission.TLSOptions{}, nil)
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		resp, err := s.client.Get(s.url + path)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusNotFound, resp.StatusCode, path)
	}
}

func TestMetrics(t *testing.T) {
	g, _, nodes := example(t)
	reg := prometheus.NewRegistry()
	m, err := admission.NewWebhookMetrics(reg)
	require.NoError(t, err)
	im, err := admission.NewIntakeMetrics(reg)
	require.NoError(t, err)
	h := admission.NewWebhook(admission.WebhookOptions{Decider: g, Metrics: m, Intake: admission.NewIntake(admission.IntakeOptions{Metrics: im})})
	s := serve(t, h, admission.TLSOptions{}, nil)
	metrics := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer metrics.Close()
	s.post(t, "/validate", "application/json", review(admissionv1.Delete, "Node", nodes[linkedNode].Object))
	s.post(t, "/validate", "application/json", review(admissionv1.Delete, "Node", nodes[linkedNode].Object))
	s.post(t, "/validate/clusters/default/other", "application/json", review(admissionv1.Delete, "Node", nodes[linkedNode].Object))
	s.post(t, "/validate", "application/json", review(admissionv1.Update, "Node", nodes[linkedNode].Object))
	s.post(t, "/validate", "application/json", bytes.Replace(review(admissionv1.Delete, "Node", nodes[linkedNode].Object), []byte(`"oldObject"`), []byte(`"object"`), 1))
	s.post(t, "/validate", "text/plain", nil)

	resp, err := metrics.Client().Get(metrics.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	text := string(raw)
	for _, want := range []string{
		`nodeguard_decisions_total{cluster="",enforcement_action="deny",reason="blocked",result="denied",route="/validate"} 2`,
		`nodeguard_decisions_total{cluster="default/other",enforcement_action="deny",reason="misrouted",result="denied",route="/validate/clusters/{namespace}/{name}"} 1`,
		`nodeguard_decisions_total{cluster="",enforcement_action="deny",reason="not-judged",result="allowed",route="/validate"} 1`,
		`nodeguard_decisions_total{cluster="",enforcement_action="deny",reason="unjudgeable",result="denied",route="/validate"} 1`,
		`nodeguard_decisions_total{cluster="",enforcement_action="deny",reason="bad-request",result="error",route="/validate"} 1`,
		`nodeguard_decision_duration_seconds_count{route="/validate"} 5`,
		`nodeguard_rejected_requests_total{reason="content-type"} 1`,
	} {
		assert.Contains(t, text, want)
	}
}

// A delete denied for want of a fresh read is counted by its reason, in
// nodeguard_decisions_total alone (the alerts read it there).
func TestFreshReadErrorsAreCountedByTheirReason(t *testing.T) {
	_, _, nodes := example(t)
	reg := prometheus.NewRegistry()
	m, err := admission.NewWebhookMetrics(reg)
	require.NoError(t, err)
	failing := deciderFunc(func(_ context.Context, req guard.Request) (rule.Decision, error) {
		return rule.Denial(rule.ReasonFreshReadFailed, "could not re-read"), nil
	})
	s := serve(t, admission.NewWebhook(admission.WebhookOptions{Decider: failing, Metrics: m}), admission.TLSOptions{}, nil)
	s.post(t, "/validate", "application/json", review(admissionv1.Delete, "Node", nodes[linkedNode].Object))
	assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP nodeguard_decisions_total Admission reviews answered, by result (allowed, denied, error: the answer given), reason (the rule's), route, cluster (the CAPI Cluster NAMESPACE/NAME of a cluster route, "" on /validate: as many clusters as the fleet has) and enforcement_action (deny, warn, dryrun: a reason that denies, answered allowed, is a denial warn or dryrun admitted).
# TYPE nodeguard_decisions_total counter
nodeguard_decisions_total{cluster="",enforcement_action="deny",reason="fresh-read-failed",result="denied",route="/validate"} 1
`), "nodeguard_decisions_total", "nodeguard_fresh_read_errors_total"))
}

func TestConcurrentReviews(t *testing.T) {
	g, _, nodes := example(t)
	s := serve(t, admission.NewWebhook(admission.WebhookOptions{Decider: g}), admission.TLSOptions{}, nil)
	denied := review(admissionv1.Delete, "Node", nodes[linkedNode].Object)
	exempt := review(admissionv1.Delete, "Node", nodes[linkedNode].Object, "ops")
	bodies := make([][]byte, 200)
	for i := range bodies {
		bodies[i] = denied
		if i%2 == 1 {
			bodies[i] = exempt
		}
	}
	s.answerAll(t, bodies, func(i int) bool { return i%2 == 1 })
}

func TestGracefulShutdownFinishesInFlightReviews(t *testing.T) {
	_, _, nodes := example(t)
	started, finish := make(chan struct{}), make(chan struct{})
	slow := deciderFunc(func(context.Context, guard.Request) (rule.Decision, error) {
		close(started)
		<-finish
		return rule.Decision{Allowed: true, Reason: rule.ReasonNoLink}, nil
	})
	s := serve(t, admission.NewWebhook(admission.WebhookOptions{Decider: slow}), admission.TLSOptions{}, nil)
	result := make(chan *admissionv1.AdmissionReview, 1)
	go func() {
		_, _, out := s.post(t, "/validate", "application/json", review(admissionv1.Delete, "Node", nodes[linkedNode].Object))
		result <- out
	}()
	<-started
	stopped := make(chan error, 1)
	go func() { stopped <- s.stop() }()
	// Shutdown closes the listener first, then drains: once nothing is
	// accepted, it is draining the review still deciding.
	addr := strings.TrimPrefix(s.url, "https://")
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			_ = c.Close()
		}
		return err != nil
	}, 10*time.Second, 10*time.Millisecond, "shutdown begins: the listener is closed")
	select {
	case err := <-stopped:
		t.Fatalf("Serve returned (%v) while a review was still deciding", err)
	default:
	}
	close(finish)
	require.NoError(t, <-stopped, "Serve returns cleanly after draining")
	out := <-result
	require.NotNil(t, out)
	assert.True(t, out.Response.Allowed)
}

// Each denied Node delete is reported once its answer is written, with what
// an Event on the Node says: the Node's UID, the user, the reason, the
// message and the blockers; not an allowed one, a dry run or another kind.
func TestDeniedNodeDeletesAreReported(t *testing.T) {
	g, _, nodes := example(t)
	var mu sync.Mutex
	var got []events.Denial
	h := admission.NewWebhook(admission.WebhookOptions{Decider: g, Clusters: admission.ClustersFunc(func(context.Context, string) (bool, rule.Action, error) { return true, "", nil }),
		Denied: func(d events.Denial) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, d)
		}})
	s := serve(t, h, admission.TLSOptions{}, nil)
	node := nodes[linkedNode].DeepCopy()
	node.SetUID("0b8d0b0e-5a5e-4c1a-9d5e-7a5b7c1d2e3f")

	// (A cluster route's denials are told for authenticated callers only:
	// TestClusterRouteEventsOnlyForAuthenticatedReviews.)
	_, _, out := s.post(t, "/validate", "application/json", review(admissionv1.Delete, "Node", node.Object))
	require.False(t, out.Response.Allowed)
	mu.Lock()
	require.Len(t, got, 1)
	d := got[0]
	mu.Unlock()
	assert.Equal(t, "", d.Cluster, "the cluster nodeguard runs in")
	assert.Equal(t, "x", d.Node, "the request's name")
	assert.EqualValues(t, "0b8d0b0e-5a5e-4c1a-9d5e-7a5b7c1d2e3f", d.NodeUID)
	assert.Equal(t, "alice", d.User)
	assert.Equal(t, rule.ReasonBlocked, d.Reason)
	assert.Equal(t, out.Response.Result.Message, strings.Join(d.Messages, " "))
	require.Len(t, d.Blockers, 1)
	assert.Equal(t, "DockerMachine", d.Blockers[0].Kind)

	dryRun := bytes.Replace(review(admissionv1.Delete, "Node", node.Object), []byte(`"operation"`), []byte(`"dryRun":true,"operation"`), 1)
	unlinked := map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": "bare-metal-1"}}
	for name, body := range map[string][]byte{
		"dry run": dryRun,
		"allowed": review(admissionv1.Delete, "Node", unlinked),
		"exempt":  review(admissionv1.Delete, "Node", node.Object, "ops"),
	} {
		_, _, out := s.post(t, "/validate", "application/json", body)
		require.NotNil(t, out.Response, name)
		assert.Equal(t, name != "dry run", out.Response.Allowed, name)
	}
	// A denial of another kind (here: a Pod on a route naming no Cluster
	// the management cluster has) is not a Node's.
	h = admission.NewWebhook(admission.WebhookOptions{Decider: g, Clusters: admission.ClustersFunc(func(context.Context, string) (bool, rule.Action, error) { return false, "", nil }),
		Denied: func(d events.Denial) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, d)
		}})
	s = serve(t, h, admission.TLSOptions{}, nil)
	_, _, out = s.post(t, "/validate/clusters/default/typo", "application/json",
		review(admissionv1.Delete, "Pod", map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": "p"}}))
	assert.False(t, out.Response.Allowed)
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, got, 1, "only the first denial was reported")
}

// What recording a denial adds to a denied review: the handler alone (no
// TLS), the example's linked Node, with and without a recorder behind the
// Denied hook.
// go test ./enforcer/admission/ -run '^$' -bench DeniedReview -benchtime 2000x
func BenchmarkDeniedReview(b *testing.B) {
	g, _, nodes := example(b)
	node := nodes[linkedNode].DeepCopy()
	node.SetUID("0b8d0b0e-5a5e-4c1a-9d5e-7a5b7c1d2e3f")
	body := review(admissionv1.Delete, "Node", node.Object)
	// A client that answers every write with nothing: only the handler's
	// side is measured.
	rec, err := events.New(events.Options{Events: &eventsfake.FakeEventsV1{Fake: &clienttesting.Fake{}}})
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go rec.Run(ctx)
	for name, denied := range map[string]func(events.Denial){"events-off": nil, "events-on": rec.Record} {
		h := admission.NewWebhook(admission.WebhookOptions{Decider: g, Denied: denied})
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				w := httptest.NewRecorder()
				r := httptest.NewRequest(http.MethodPost, "/validate", bytes.NewReader(body))
				r.Header.Set("Content-Type", "application/json")
				h.ServeHTTP(w, r)
				if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"allowed":false`) {
					b.Fatalf("want a denial, got %d %s", w.Code, w.Body.String())
				}
			}
		})
	}
}

// A dry run's answer names the route that judged it, allowed or denied: the
// fleet's proof that a workload cluster's reviews arrive, whichever replica
// answers. A review that is not a dry run carries no such warning.
func TestDryRunAnswerNamesTheRoute(t *testing.T) {
	g, _, nodes := example(t)
	s := serve(t, admission.NewWebhook(admission.WebhookOptions{Decider: g}), admission.TLSOptions{}, nil)
	dryRun := func(body []byte) []byte {
		return bytes.Replace(body, []byte(`"request":{`), []byte(`"request":{"dryRun":true,`), 1)
	}
	bare := nodes[linkedNode].DeepCopy()
	bare.SetAnnotations(nil)
	for path, want := range map[string]string{
		"/validate":                      "nodeguard: dry run judged on route /validate",
		"/validate/clusters/default/dev": "nodeguard: dry run judged on route /validate/clusters/default/dev",
	} {
		_, _, out := s.post(t, path, "application/json", dryRun(review(admissionv1.Delete, "Node", nodes[linkedNode].Object)))
		assert.False(t, out.Response.Allowed, path)
		assert.Contains(t, out.Response.Warnings, want, "a denied dry run on %s", path)
		_, _, out = s.post(t, path, "application/json", dryRun(review(admissionv1.Delete, "Node", bare.Object)))
		assert.Contains(t, out.Response.Warnings, want, "a dry run on %s", path)
		assert.Equal(t, want, admission.DryRunWarning(strings.TrimPrefix(strings.TrimPrefix(path, "/validate"), "/clusters/")))
		_, _, out = s.post(t, path, "application/json", review(admissionv1.Delete, "Node", nodes[linkedNode].Object))
		assert.Empty(t, out.Response.Warnings, "not a dry run")
	}
}

// nodeguard's own workload identity may dry-run a Node delete on a cluster
// route (the fleet's proofs) but not delete: RBAC cannot tell the two
// apart. Others, and /validate, are judged as ever.
func TestDryRunOnlyUserMayNotDelete(t *testing.T) {
	g, _, nodes := example(t)
	s := serve(t, admission.NewWebhook(admission.WebhookOptions{Decider: g, DryRunOnlyUser: "system:serviceaccount:nodeguard-system:nodeguard"}), admission.TLSOptions{}, nil)
	bare := nodes[linkedNode].DeepCopy()
	bare.SetAnnotations(nil)
	bare.SetName("unlinked")
	require.NoError(t, unstructured.SetNestedField(bare.Object, "docker:////unlinked", "spec", "providerID"))
	as := func(user string, dryRun bool) []byte {
		body := bytes.Replace(review(admissionv1.Delete, "Node", bare.Object), []byte(`"username":"alice"`), []byte(`"username":"`+user+`"`), 1)
		if dryRun {
			body = bytes.Replace(body, []byte(`"request":{`), []byte(`"request":{"dryRun":true,`), 1)
		}
		return body
	}
	const route = "/validate/clusters/default/dev"
	self := "system:serviceaccount:nodeguard-system:nodeguard"
	_, _, out := s.post(t, route, "application/json", as(self, false))
	require.False(t, out.Response.Allowed)
	assert.Contains(t, out.Response.Result.Message, "nodeguard's own identity deletes workload Nodes only when its orphan reaper works there")
	assert.EqualValues(t, http.StatusForbidden, out.Response.Result.Code)
	_, _, out = s.post(t, route, "application/json", as(self, true))
	assert.True(t, out.Response.Allowed, "its dry run is judged: the Node links nothing")
	_, _, out = s.post(t, route, "application/json", as("alice", false))
	assert.True(t, out.Response.Allowed, "another user's delete is judged")
	_, _, out = s.post(t, "/validate", "application/json", as(self, false))
	assert.True(t, out.Response.Allowed, "/validate is the management cluster's, where that name is not nodeguard's workload identity")
}

// --self-cluster scopes /validate as a cluster route is scoped: a Node of
// another Cluster is misrouted there, one of its own judged by its Machines.
func TestSelfClusterScopesTheSelfRoute(t *testing.T) {
	g, _, nodes := example(t)
	exists := admission.ClustersFunc(func(context.Context, string) (bool, rule.Action, error) { return true, "", nil })
	for cluster, want := range map[string]string{"default/dev": "DockerMachine", "default/mgmt": "this review came on the route of Cluster default/mgmt"} {
		s := serve(t, admission.NewWebhook(admission.WebhookOptions{Decider: g, Clusters: exists, SelfCluster: cluster}), admission.TLSOptions{}, nil)
		_, _, out := s.post(t, "/validate", "application/json", review(admissionv1.Delete, "Node", nodes[linkedNode].Object))
		assert.False(t, out.Response.Allowed, cluster)
		assert.Contains(t, out.Response.Result.Message, want, cluster)
	}
}

// Under warn a denial is admitted with the denial as a warning and told as
// one that would be denied; under dryrun it is admitted silently; both are
// counted by their action. A Cluster's annotation overrides the default on
// its route; nodeguard's own dry-run-only rule is enforced under any.
func TestEnforcementActions(t *testing.T) {
	g, _, nodes := example(t)
	var mu sync.Mutex
	var told []events.Denial
	reg := prometheus.NewRegistry()
	m, err := admission.NewWebhookMetrics(reg)
	require.NoError(t, err)
	actions := map[string]rule.Action{"default/dev": "", "default/audit": rule.ActionDryRun, "default/strict": rule.ActionDeny}
	h := admission.NewWebhook(admission.WebhookOptions{Decider: g, Action: func() rule.Action { return rule.ActionWarn }, Metrics: m, DryRunOnlyUser: "alice",
		Clusters: admission.ClustersFunc(func(_ context.Context, key string) (bool, rule.Action, error) {
			ns, name, _ := strings.Cut(key, "/")
			a, ok := actions[ns+"/"+name]
			return ok, a, nil
		}),
		Denied: func(d events.Denial) {
			mu.Lock()
			defer mu.Unlock()
			told = append(told, d)
		}})
	s := serve(t, h, admission.TLSOptions{}, nil)
	body := review(admissionv1.Delete, "Node", nodes[linkedNode].Object)
	would := "nodeguard (enforcement action warn, blocked): this delete would be denied: "

	_, _, out := s.post(t, "/validate", "application/json", body)
	require.True(t, out.Response.Allowed, "warn admits")
	require.Len(t, out.Response.Warnings, 1)
	assert.True(t, strings.HasPrefix(out.Response.Warnings[0], would), out.Response.Warnings[0])
	assert.Contains(t, out.Response.Warnings[0], "DockerMachine")
	mu.Lock()
	require.Len(t, told, 1)
	assert.True(t, told[0].Admitted, "told as a denial warn admitted")
	mu.Unlock()

	dryRun := bytes.Replace(body, []byte(`"operation"`), []byte(`"dryRun":true,"operation"`), 1)
	_, _, out = s.post(t, "/validate/clusters/default/audit", "application/json", dryRun)
	require.True(t, out.Response.Allowed, "dryrun admits")
	assert.Equal(t, []string{admission.DryRunWarning("default/audit"), "nodeguard: enforcement action on this route: dryrun"}, out.Response.Warnings,
		"dryrun adds no warning of the denial; a dry run says which route judged it, and under which action")
	assert.Equal(t, rule.ActionDryRun, admission.DryRunAction(out.Response.Warnings), "what the fleet's proof reads")

	_, _, out = s.post(t, "/validate/clusters/default/strict", "application/json", dryRun)
	assert.False(t, out.Response.Allowed, "the Cluster's deny overrides the default warn")
	assert.Equal(t, rule.ActionDeny, admission.DryRunAction(out.Response.Warnings), "deny says nothing more")

	// (The Node names Cluster default/dev: on the other routes it is
	// misrouted, a denial like any.) alice may only dry-run on a cluster
	// route: enforced under warn too.
	_, _, out = s.post(t, "/validate/clusters/default/dev", "application/json", body)
	assert.False(t, out.Response.Allowed)
	assert.Contains(t, out.Response.Result.Message, "nodeguard's own identity")

	assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP nodeguard_decisions_total Admission reviews answered, by result (allowed, denied, error: the answer given), reason (the rule's), route, cluster (the CAPI Cluster NAMESPACE/NAME of a cluster route, "" on /validate: as many clusters as the fleet has) and enforcement_action (deny, warn, dryrun: a reason that denies, answered allowed, is a denial warn or dryrun admitted).
# TYPE nodeguard_decisions_total counter
nodeguard_decisions_total{cluster="",enforcement_action="warn",reason="blocked",result="allowed",route="/validate"} 1
nodeguard_decisions_total{cluster="default/audit",enforcement_action="dryrun",reason="misrouted",result="allowed",route="/validate/clusters/{namespace}/{name}"} 1
nodeguard_decisions_total{cluster="default/dev",enforcement_action="deny",reason="dry-run-only",result="denied",route="/validate/clusters/{namespace}/{name}"} 1
nodeguard_decisions_total{cluster="default/strict",enforcement_action="deny",reason="misrouted",result="denied",route="/validate/clusters/{namespace}/{name}"} 1
`), "nodeguard_decisions_total"))
}

// With a decision log, every answer carries its decision_id as an audit
// annotation, the denial Event its series' first, and the event logged is
// the rule's decision on what it read, with the answer given.
func TestAnAnswerCarriesItsDecisionID(t *testing.T) {
	g, _, nodes := example(t)
	var console testlog.Buffer
	dlog, err := rule.StartDecisionLog(context.Background(), rule.DecisionLogOptions{Console: true, ConsoleOutput: &console})
	require.NoError(t, err)
	var denied []events.Denial
	var mu sync.Mutex
	s := serve(t, admission.NewWebhook(admission.WebhookOptions{Decider: g, DecisionLog: dlog, Denied: func(d events.Denial) {
		mu.Lock()
		defer mu.Unlock()
		denied = append(denied, d)
	}}), admission.TLSOptions{}, nil)
	_, _, out := s.post(t, "/validate", "application/json", review(admissionv1.Delete, "Node", nodes[linkedNode].Object))
	require.False(t, out.Response.Allowed)
	id := out.Response.AuditAnnotations[admission.DecisionIDAuditAnnotation]
	require.NotEmpty(t, id)
	mu.Lock()
	require.Len(t, denied, 1)
	assert.Equal(t, id, denied[0].DecisionID)
	mu.Unlock()
	_, _, out = s.post(t, "/validate", "application/json", review(admissionv1.Delete, "Node", nodes[linkedNode].Object, "ops"))
	other := out.Response.AuditAnnotations[admission.DecisionIDAuditAnnotation]
	assert.NotEqual(t, id, other, "each answer its own")

	lines := console.LinesAfter(t, dlog.Stop)
	require.Len(t, lines, 2)
	first := lines[0]
	assert.Equal(t, id, first["decision_id"])
	assert.Equal(t, "blocked", first["result"].(map[string]any)["reason"])
	assert.Equal(t, "x", first["input"].(map[string]any)["review"].(map[string]any)["name"], "the review's name")
	assert.NotEmpty(t, first["input"].(map[string]any)["inventory"], "what the rule read")
	assert.Equal(t, map[string]any{"route": "/validate", "cluster": "", "uid": "7f0b2f6c-1111-2222-3333-444455556666",
		"allowed": false, "enforcementAction": "deny", "dryRun": false}, first["custom"])

	plain := serve(t, admission.NewWebhook(admission.WebhookOptions{Decider: g}), admission.TLSOptions{}, nil)
	_, _, out = plain.post(t, "/validate", "application/json", review(admissionv1.Delete, "Node", nodes[linkedNode].Object))
	assert.Empty(t, out.Response.AuditAnnotations, "no decision log: no decision_id")
}
