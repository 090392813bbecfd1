//go:build e2e

package e2e

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/serve"
	"github.com/nodeguard/nodeguard/internal/constraints"
)

// collector is a decision log service: it takes OPA's batches (gzip'd JSON
// arrays of events) on /logs, or refuses them all while down.
type collector struct {
	srv  *httptest.Server
	mu   sync.Mutex
	got  map[string]map[string]any // by decision_id
	down bool
}

func newCollector(t *testing.T) *collector {
	c := &collector{got: map[string]map[string]any{}}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		down := c.down
		c.mu.Unlock()
		if down || r.URL.Path != "/logs" {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		raw, err := io.ReadAll(zr)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var batch []map[string]any
		if err := json.Unmarshal(raw, &batch); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		for _, e := range batch {
			c.got[e["decision_id"].(string)] = e
		}
		c.mu.Unlock()
	}))
	t.Cleanup(c.srv.Close)
	return c
}

// about returns the events it holds about Node name.
func (c *collector) about(name string) []map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []map[string]any
	for _, e := range c.got {
		if review, ok := e["input"].(map[string]any)["review"].(map[string]any); ok && review["name"] == name {
			out = append(out, e)
		}
	}
	return out
}

// auditAnnotations returns, from the API server's audit log, the
// annotations of the ResponseComplete events of Node name's deletes.
func auditAnnotations(t require.TestingT, path, name string) []map[string]any {
	f, err := os.Open(path)
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var ev struct {
			Stage       string         `json:"stage"`
			Verb        string         `json:"verb"`
			ObjectRef   map[string]any `json:"objectRef"`
			Annotations map[string]any `json:"annotations"`
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &ev))
		if ev.Stage == "ResponseComplete" && ev.Verb == "delete" && ev.ObjectRef["resource"] == "nodes" && ev.ObjectRef["name"] == name {
			out = append(out, ev.Annotations)
		}
	}
	require.NoError(t, sc.Err())
	return out
}

// Every answer `nodeguard serve` gives reaches a decision log service as
// OPA's event (decision_id, path, masked input, result, bundle revision),
// and the API server's audit log records the same decision_id; with the
// service down, deletes are answered as fast and the events that do not fit
// the plugin's buffer are counted.
func TestDecisionLogsReachTheCollectorAndTheAuditLog(t *testing.T) {
	dir := t.TempDir()
	auditLog := filepath.Join(dir, "audit.log")
	policy := filepath.Join(dir, "audit-policy.yaml")
	require.NoError(t, os.WriteFile(policy, []byte("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n"+
		"- level: Metadata\n  resources: [{group: \"\", resources: [nodes]}]\n  verbs: [delete]\n- level: None\n"), 0o600))
	cfg, _ := apiServerWith(t, current, func(env *envtest.Environment) {
		api := env.ControlPlane.GetAPIServer().Configure()
		api.Set("audit-policy-file", policy)
		api.Set("audit-log-path", auditLog)
	})
	ctx := context.Background()
	kube, dyn := clientsFor(t, cfg)
	col := newCollector(t)
	config := filepath.Join(dir, "opa.yaml")
	require.NoError(t, os.WriteFile(config, []byte("services:\n  collector:\n    url: "+col.srv.URL+"\n"+
		"decision_logs:\n  service: collector\n  reporting:\n    buffer_type: event\n    buffer_size_limit_events: 50\n"+
		"    min_delay_seconds: 1\n    max_delay_seconds: 1\n"), 0o600))
	metricsAt := make(chan net.Addr, 1)
	nodeguardWith(t, cfg, serve.Options{DecisionLogs: serve.DecisionLogOptions{ConfigFile: config},
		MetricsBindAddress: "127.0.0.1:0", SideListening: func(name string, a net.Addr) {
			if name == "metrics" {
				metricsAt <- a
			}
		}})
	metrics := (<-metricsAt).String()

	capdMachine(t, dyn, "blocked-md-0", false)
	_, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "free-md-0"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Error(c, dryRunDelete(ctx, kube, "blocked-md-0"), "nodeguard denies once ready")
	}, 30*time.Second, 100*time.Millisecond)
	require.NoError(t, dryRunDelete(ctx, kube, "free-md-0"))

	info, err := constraints.LoadInfo()
	require.NoError(t, err)
	for name, allowed := range map[string]bool{"blocked-md-0": false, "free-md-0": true} {
		// The rule's answer (denials before nodeguard was ready are logged
		// too, as not-ready).
		want := map[bool]string{false: "blocked", true: "no-link"}[allowed]
		var e map[string]any
		require.Eventually(t, func() bool {
			for _, ev := range col.about(name) {
				if ev["result"].(map[string]any)["reason"] == want {
					e = ev
				}
			}
			return e != nil && len(auditAnnotations(t, auditLog, name)) > 0
		}, 15*time.Second, 100*time.Millisecond, "the collector and the audit log have %s's decision", name)
		assert.Equal(t, "nodeguard/decision", e["path"])
		assert.Equal(t, map[string]any{"nodeguard": map[string]any{"revision": info.Version}}, e["bundles"])
		assert.Equal(t, allowed, e["result"].(map[string]any)["allowed"], name)
		input := e["input"].(map[string]any)
		assert.Contains(t, input, "inventory", "what the rule read")
		assert.Contains(t, input, "parameters")
		assert.NotContains(t, input["review"].(map[string]any)["userInfo"], "extra", "masked")
		assert.Equal(t, true, e["custom"].(map[string]any)["dryRun"])
		var ids []any
		for _, a := range auditAnnotations(t, auditLog, name) {
			ids = append(ids, a[admission.WebhookName+"/"+admission.DecisionIDAuditAnnotation])
		}
		assert.True(t, slices.Contains(ids, e["decision_id"]), "the audit log holds decision %s of %s: %v", e["decision_id"], name, ids)
	}

	// The service down: the plugin keeps what its buffer holds (50 items,
	// failed uploads requeued as chunks) and drops the rest, counted; no
	// answer waits for it.
	col.mu.Lock()
	col.down = true
	col.mu.Unlock()
	latencies := func(n int) time.Duration {
		var d []time.Duration
		for range n {
			start := time.Now()
			require.Error(t, dryRunDelete(ctx, kube, "blocked-md-0"))
			d = append(d, time.Since(start))
		}
		slices.Sort(d)
		return d[len(d)/2]
	}
	down := latencies(150)
	// More than the buffer takes between two upload attempts, until some
	// are dropped: how many depends on the pace of the deletes.
	var dropped float64
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		latencies(20)
		var ok bool
		dropped, ok = scrape(c, metrics, `nodeguard_decision_logs_dropped_total{where="buffer"}`)
		assert.True(c, ok)
		assert.Positive(c, dropped, "events beyond the buffer are dropped and counted")
	}, 60*time.Second, 10*time.Millisecond)
	col.mu.Lock()
	col.down = false
	col.mu.Unlock()
	up := latencies(150)
	t.Logf("dry-run delete p50: collector down %s, up %s; %v events dropped by the buffer while it was down", down, up, dropped)
	assert.Less(t, down, up+50*time.Millisecond, "the collector being down does not slow the answers")
}
