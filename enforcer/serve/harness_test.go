package serve_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/enforcer/serve"
	"github.com/nodeguard/nodeguard/internal/testcluster"
	"github.com/nodeguard/nodeguard/internal/testlog"
	"github.com/nodeguard/nodeguard/internal/testpki"
)

// server is a running `nodeguard serve` over a fake API server holding the
// CAPD example (its Node is blocked by its DockerMachine).
type server struct {
	api    *dynamicfake.FakeDynamicClient
	base   string
	side   map[string]string // "metrics" and "health probes": their http base URLs
	client *http.Client
	node   string // the example's Node
	review []byte // a DELETE of it
	logs   *testlog.Buffer
	stop   func() error
}

func startServe(t *testing.T, bundle rule.BundleOptions) (*server, error) {
	t.Helper()
	return startServeWith(t, serve.Options{Bundle: bundle})
}

// startServeWith is startServe with more of serve's options (its addresses,
// certificate and readiness are the harness's); it returns once serve is
// ready, or with the error serve stopped with.
func startServeWith(t *testing.T, opts serve.Options) (*server, error) {
	t.Helper()
	api, mapper := testcluster.CAPD(t, "../../examples/capd-v1beta2", [2]string{"default", "dev"})
	ca := testpki.New(t)
	cert, key := ca.ServerFiles(t, "serving")
	ctx, cancel := context.WithCancel(context.Background())
	s := &server{api: api, client: &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}}}}
	done := make(chan error, 1)
	var once sync.Once
	var stopErr error
	s.stop = func() error { once.Do(func() { cancel(); stopErr = <-done }); return stopErr }
	var log *slog.Logger
	log, s.logs = testlog.JSON()
	addr := make(chan net.Addr, 1)
	side := make(chan string, 2)
	opts.Listen, opts.CertFile, opts.KeyFile = "127.0.0.1:0", cert, key
	opts.MetricsBindAddress, opts.HealthProbeBindAddress = "127.0.0.1:0", "127.0.0.1:0"
	opts.SideListening = func(name string, a net.Addr) { side <- name + "=" + a.String() }
	go func() {
		done <- serve.RunWith(ctx, kube.Clients{Dynamic: api, Mapper: mapper}, opts, log, func(a net.Addr) { addr <- a })
	}()
	select {
	case a := <-addr:
		s.base = "https://" + a.String()
	case err := <-done:
		cancel()
		return nil, err
	}
	s.side = map[string]string{}
	for range 2 {
		name, a, _ := strings.Cut(<-side, "=")
		s.side[name] = "http://" + a
	}
	t.Cleanup(func() { assert.NoError(t, s.stop()) })
	require.Eventually(t, func() bool {
		resp, err := s.client.Get(s.side["health probes"] + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 10*time.Second, 20*time.Millisecond)
	objs, err := facts.LoadManifests("../../examples/capd-v1beta2/node.yaml")
	require.NoError(t, err)
	s.node = objs[0].GetName()
	node, _ := json.Marshal(objs[0].Object)
	s.review, _ = json.Marshal(map[string]any{
		"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
		"request": map[string]any{"uid": "u1", "operation": "DELETE", "name": s.node,
			"kind": map[string]any{"group": "", "version": "v1", "kind": "Node"}, "oldObject": json.RawMessage(node),
			"userInfo": map[string]any{"username": "alice"}},
	})
	return s, nil
}

// post sends the review to path and returns the answer.
func (s *server) post(path string) (*admissionv1.AdmissionResponse, error) {
	return testpki.Ask(s.client, s.base+path, s.review)
}

// ask is post where an error is any answer that is not a decision (no
// response, or a denial for want of one).
func (s *server) ask(path string) (*admissionv1.AdmissionResponse, error) {
	r, err := s.post(path)
	if err == nil && r.Result != nil && r.Result.Code >= 500 {
		return nil, fmt.Errorf("no decision: %s", r.Result.Message)
	}
	return r, err
}

func (s *server) metrics(t *testing.T) string {
	t.Helper()
	resp, err := s.client.Get(s.side["metrics"] + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}
