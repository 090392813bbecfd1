package serve_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeguard/nodeguard/enforcer/kubeclient"
	"github.com/nodeguard/nodeguard/enforcer/manifest"
	"github.com/nodeguard/nodeguard/enforcer/serve"
	"github.com/nodeguard/nodeguard/internal/testcluster"
	"github.com/nodeguard/nodeguard/internal/testpki"
)

// TestServeJudgesAgainstTheAPIServer runs `nodeguard serve` end to end over
// a fake API server: informers, fresh reads, routes, probes and metrics.
func TestServeJudgesAgainstTheAPIServer(t *testing.T) {
	client, mapper := testcluster.CAPD(t, "../../examples/capd-v1beta2", [2]string{"default", "dev"})
	ca := testpki.New(t)
	cert, key := ca.ServerFiles(t, "serving")
	var logs bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan net.Addr, 1)
	side := make(chan string, 2)
	done := make(chan error, 1)
	go func() {
		done <- serve.RunWith(ctx, kubeclient.Clients{Dynamic: client, Mapper: mapper},
			serve.Options{Listen: "127.0.0.1:0", CertFile: cert, KeyFile: key, Orphans: serve.ReapOptions{Interval: 50 * time.Millisecond},
				MetricsBindAddress: "127.0.0.1:0", HealthProbeBindAddress: "127.0.0.1:0",
				SideListening: func(name string, a net.Addr) { side <- name + "=" + a.String() }},
			log, func(a net.Addr) { addr <- a })
	}()
	var base string
	select {
	case a := <-addr:
		base = "https://" + a.String()
	case err := <-done:
		t.Fatal(err)
	}
	ports := map[string]string{}
	for range 2 {
		name, a, _ := strings.Cut(<-side, "=")
		ports[name] = "http://" + a
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}}}
	require.Eventually(t, func() bool {
		resp, err := http.Get(ports["health probes"] + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 10*time.Second, 20*time.Millisecond)

	objs, err := manifest.Load("../../examples/capd-v1beta2/node.yaml")
	require.NoError(t, err)
	node, _ := json.Marshal(objs[0].Object)
	body, _ := json.Marshal(map[string]any{
		"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
		"request": map[string]any{"uid": "u1", "operation": "DELETE", "name": objs[0].GetName(),
			"kind": map[string]any{"group": "", "version": "v1", "kind": "Node"}, "oldObject": json.RawMessage(node),
			"userInfo": map[string]any{"username": "alice"}},
	})
	ask := func(path string) *admissionv1.AdmissionResponse {
		resp, err := c.Post(base+path, "application/json", bytes.NewReader(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		var out admissionv1.AdmissionReview
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		return out.Response
	}
	assert.False(t, ask("/validate").Allowed)
	assert.False(t, ask("/validate/clusters/default/dev").Allowed)
	unknown := ask("/validate/clusters/default/nope")
	assert.False(t, unknown.Allowed)
	assert.Contains(t, unknown.Result.Message, "Cluster default/nope")

	// CAPI deletes the DockerMachine; a fresh read sees it before the cache.
	gvr := schema.GroupVersionResource{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Resource: "dockermachines"}
	require.NoError(t, client.Resource(gvr).Namespace("default").Delete(ctx, objs[0].GetName(), metav1.DeleteOptions{}))
	assert.True(t, ask("/validate").Allowed)

	resp, err := c.Get(base + "/metrics")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "metrics are not on the review port")
	resp, err = http.Get(ports["metrics"] + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(metrics), `nodeguard_decisions_total{reason="blocked",result="denied",route="/validate"} 1`)
	assert.Contains(t, string(metrics), `nodeguard_cached_objects{group="cluster.x-k8s.io",kind="Machine",version="v1beta2"} 1`)
	assert.Contains(t, string(metrics), "go_goroutines")
	// The orphan scan runs without --reap-orphan-nodes: the Node's Machine exists.
	assert.Eventually(t, func() bool {
		resp, err := http.Get(ports["metrics"] + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(b), `nodeguard_orphan_nodes{cluster=""} 0`)
	}, 5*time.Second, 50*time.Millisecond)

	cancel()
	require.NoError(t, <-done)
	var line map[string]any
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, `"msg":"decision"`) {
			require.NoError(t, json.Unmarshal([]byte(l), &line))
			break
		}
	}
	require.NotNil(t, line, logs.String())
	for _, k := range []string{"node", "cluster", "user", "allowed", "blockers", "duration"} {
		assert.Contains(t, line, k)
	}
	assert.Equal(t, []any{"DockerMachine default/" + objs[0].GetName()}, line["blockers"])
}

func TestServeRefusesToReapWithoutAConfig(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // stops the informers
	client, mapper := testcluster.CAPD(t, "../../examples/capd-v1beta2")
	err := serve.RunWith(ctx, kubeclient.Clients{Dynamic: client, Mapper: mapper},
		serve.Options{Listen: "127.0.0.1:0", Orphans: serve.ReapOptions{Enabled: true, Interval: time.Second}}, slog.New(slog.DiscardHandler), nil)
	assert.ErrorContains(t, err, "reaping orphan Nodes needs a kubeconfig")
	err = serve.RunWith(ctx, kubeclient.Clients{Dynamic: client, Mapper: mapper},
		serve.Options{Listen: "127.0.0.1:0", Orphans: serve.ReapOptions{Enabled: true}}, slog.New(slog.DiscardHandler), nil)
	assert.ErrorContains(t, err, "--reap-orphan-nodes needs a positive --orphan-scan-interval")
}

func TestServeRefusesToStartWithoutCertificates(t *testing.T) {
	client, mapper := testcluster.CAPD(t, "../../examples/capd-v1beta2")
	err := serve.RunWith(context.Background(), kubeclient.Clients{Dynamic: client, Mapper: mapper}, serve.Options{Listen: "127.0.0.1:0"}, slog.New(slog.DiscardHandler), nil)
	assert.ErrorContains(t, err, "--tls-cert-file")
}
