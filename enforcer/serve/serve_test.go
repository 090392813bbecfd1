package serve_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/serve"
	"github.com/nodeguard/nodeguard/internal/testcluster"
)

// TestServeJudgesAgainstTheAPIServer runs `nodeguard serve` end to end over
// a fake API server: informers, fresh reads, routes, probes and metrics.
func TestServeJudgesAgainstTheAPIServer(t *testing.T) {
	s, err := startServeWith(t, serve.Options{Orphans: serve.ReapOptions{Interval: 50 * time.Millisecond}})
	require.NoError(t, err)
	ask := func(path string) *admissionv1.AdmissionResponse {
		r, err := s.post(path)
		require.NoError(t, err)
		return r
	}
	assert.False(t, ask("/validate").Allowed)
	assert.False(t, ask("/validate/clusters/default/dev").Allowed)
	unknown := ask("/validate/clusters/default/nope")
	assert.False(t, unknown.Allowed)
	assert.Contains(t, unknown.Result.Message, "Cluster default/nope")

	// CAPI deletes the DockerMachine; a fresh read sees it before the cache.
	gvr := schema.GroupVersionResource{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Resource: "dockermachines"}
	require.NoError(t, s.api.Resource(gvr).Namespace("default").Delete(context.Background(), s.node, metav1.DeleteOptions{}))
	assert.True(t, ask("/validate").Allowed)

	resp, err := s.client.Get(s.base + "/metrics")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "metrics are not on the review port")
	metrics := s.metrics(t)
	assert.Contains(t, metrics, `nodeguard_decisions_total{cluster="",enforcement_action="deny",reason="blocked",result="denied",route="/validate"} 1`)
	assert.Contains(t, metrics, `nodeguard_cached_objects{group="cluster.x-k8s.io",kind="Machine",version="v1beta2"} 1`)
	assert.Contains(t, metrics, "go_goroutines")
	// The orphan scan runs without --reap-orphan-nodes: the Node's Machine exists.
	assert.Eventually(t, func() bool { return strings.Contains(s.metrics(t), `nodeguard_orphan_nodes{cluster=""} 0`) },
		5*time.Second, 50*time.Millisecond)

	require.NoError(t, s.stop())
	var line map[string]any
	for _, l := range strings.Split(s.logs.String(), "\n") {
		if strings.Contains(l, `"msg":"decision"`) {
			require.NoError(t, json.Unmarshal([]byte(l), &line))
			break
		}
	}
	require.NotNil(t, line, s.logs.String())
	for _, k := range []string{"node", "cluster", "user", "allowed", "blockers", "duration"} {
		assert.Contains(t, line, k)
	}
	assert.Equal(t, []any{"DockerMachine default/" + s.node}, line["blockers"])
}

func TestServeRefusesToReapWithoutAConfig(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // stops the informers
	client, mapper := testcluster.CAPD(t, "../../examples/capd-v1beta2")
	err := serve.RunWith(ctx, kube.Clients{Dynamic: client, Mapper: mapper},
		serve.Options{Listen: "127.0.0.1:0", Orphans: serve.ReapOptions{Enabled: true, Interval: time.Second}}, slog.New(slog.DiscardHandler), nil)
	assert.ErrorContains(t, err, "reaping orphan Nodes needs a kubeconfig")
	err = serve.RunWith(ctx, kube.Clients{Dynamic: client, Mapper: mapper},
		serve.Options{Listen: "127.0.0.1:0", Orphans: serve.ReapOptions{Enabled: true}}, slog.New(slog.DiscardHandler), nil)
	assert.ErrorContains(t, err, "--reap-orphan-nodes needs a positive --orphan-scan-interval")
}

func TestServeRefusesToStartWithoutCertificates(t *testing.T) {
	client, mapper := testcluster.CAPD(t, "../../examples/capd-v1beta2")
	err := serve.RunWith(context.Background(), kube.Clients{Dynamic: client, Mapper: mapper}, serve.Options{Listen: "127.0.0.1:0"}, slog.New(slog.DiscardHandler), nil)
	assert.ErrorContains(t, err, "--tls-cert-file")
}
