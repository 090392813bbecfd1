package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/metrics"
	"github.com/nodeguard/nodeguard/enforcer/record"
)

// Metrics are the fleet's Prometheus series, one set per Cluster: their
// number is the fleet's size.
type Metrics struct {
	guarded, unguarded, lastProof *prometheus.GaugeVec
}

// NewMetrics registers nodeguard_workload_cluster_guarded,
// nodeguard_workload_cluster_unguarded_reason and
// nodeguard_workload_cluster_last_proof_timestamp_seconds.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	r := metrics.New(reg)
	m := &Metrics{
		guarded: r.GaugeVec("nodeguard_workload_cluster_guarded",
			"1 when nodeguard's configuration in the CAPI workload cluster is as nodeguard wants it and its last dry-run proof reached nodeguard's route for that Cluster; 0 otherwise.",
			"cluster_namespace", "cluster_name"),
		unguarded: r.GaugeVec("nodeguard_workload_cluster_unguarded_reason",
			"1 for the reason a CAPI workload cluster is not guarded (no-kubeconfig, unreachable, not-installed, stale-ca-bundle, review-not-received, no-nodes, opted-out, not-selected, mode-unsupported, deleting, dryrun).",
			"cluster_namespace", "cluster_name", "reason"),
		lastProof: r.GaugeVec("nodeguard_workload_cluster_last_proof_timestamp_seconds",
			"When a dry-run Node delete in the CAPI workload cluster last came back judged by nodeguard's route for it (Unix seconds).",
			"cluster_namespace", "cluster_name"),
	}
	if err := r.Err("fleet metrics"); err != nil {
		return nil, err
	}
	return m, nil
}

// Report sets a Cluster's series from its State.
func (m *Metrics) Report(s State) {
	if m == nil {
		return
	}
	ns, name, _ := record.SplitKey("cluster", s.Cluster) // a key of the informer: valid
	v := 0.0
	if s.Guarded {
		v = 1
	}
	m.guarded.WithLabelValues(ns, name).Set(v)
	m.unguarded.DeletePartialMatch(prometheus.Labels{"cluster_namespace": ns, "cluster_name": name})
	if !s.Guarded {
		m.unguarded.WithLabelValues(ns, name, s.Reason).Set(1)
	}
	if !s.LastProof.IsZero() {
		m.lastProof.WithLabelValues(ns, name).Set(float64(s.LastProof.Unix()))
	}
}

// Forget drops a Cluster's series.
func (m *Metrics) Forget(key string) {
	if m == nil {
		return
	}
	ns, name, _ := record.SplitKey("cluster", key) // a key of the informer: valid
	l := prometheus.Labels{"cluster_namespace": ns, "cluster_name": name}
	m.guarded.DeletePartialMatch(l)
	m.unguarded.DeletePartialMatch(l)
	m.lastProof.DeletePartialMatch(l)
}

// StatusName is the ConfigMap in nodeguard's namespace that holds every
// Cluster's State, for `nodeguard clusters`: one key per Cluster
// (NAMESPACE.NAME: a namespace holds no dot), its State as JSON. At about
// 300 bytes a Cluster it holds some 3,000 Clusters below the API server's
// 1 MiB object limit.
const StatusName = "nodeguard-fleet"

var configMaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

// StatusKey is a Cluster's key in the status ConfigMap.
func StatusKey(cluster string) string { return strings.Replace(cluster, "/", ".", 1) }

// Status writes the fleet's States into the status ConfigMap: within a
// second of anything in a Cluster's State changing but its proof time, and
// otherwise (a newer proof time) at most every Interval, so a fleet proven
// every few minutes costs one write per Interval, not one per proof.
type Status struct {
	Client    dynamic.Interface
	Namespace string
	Interval  time.Duration // default DefaultStatusInterval
	Log       *slog.Logger

	mu      sync.Mutex
	states  map[string]State
	dirty   bool // something changed
	urgent  bool // a verdict changed
	written time.Time
}

// DefaultStatusInterval bounds how stale a proof time in the status
// ConfigMap may be.
const DefaultStatusInterval = time.Minute

// Report takes a State (Options.Report).
func (s *Status) Report(st State) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.states == nil {
		s.states = map[string]State{}
	}
	before, ok := s.states[st.Cluster]
	if before != st {
		s.states[st.Cluster], s.dirty = st, true
		// Anything but a newer proof time is news.
		a, b := before, st
		a.LastProof, a.Since, b.LastProof, b.Since = time.Time{}, time.Time{}, time.Time{}, time.Time{}
		s.urgent = s.urgent || !ok || a != b
	}
}

// Forget drops a Cluster that is gone (Options.Forgotten).
func (s *Status) Forget(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.states[key]; ok {
		delete(s.states, key)
		s.dirty, s.urgent = true, true
	}
}

// Run writes until ctx is done.
func (s *Status) Run(ctx context.Context) {
	kube.SetDefault(&s.Interval, DefaultStatusInterval)
	wait.UntilWithContext(ctx, s.flush, time.Second)
}

func (s *Status) flush(ctx context.Context) {
	s.mu.Lock()
	if !s.dirty || (!s.urgent && time.Since(s.written) < s.Interval) {
		s.mu.Unlock()
		return
	}
	data := make(map[string]any, len(s.states))
	for k, st := range s.states {
		b, err := json.Marshal(st)
		if err != nil {
			continue
		}
		data[StatusKey(k)] = string(b)
	}
	s.dirty, s.urgent, s.written = false, false, time.Now()
	s.mu.Unlock()
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"namespace": s.Namespace, "name": StatusName,
			"labels": map[string]any{"app.kubernetes.io/name": "nodeguard", kube.ManagedByLabel: "nodeguard"}},
		"data": data,
	}}
	if _, err := kube.ApplyOwned(ctx, s.Client, kube.Owned{Resource: configMaps, Object: obj}); err != nil {
		s.mu.Lock()
		s.dirty, s.urgent = true, true
		s.mu.Unlock()
		if s.Log != nil {
			s.Log.Error("fleet: cannot write the status ConfigMap; `nodeguard clusters` shows older states", "error", err.Error())
		}
	}
}

// ReadStatus reads the States the reconciler wrote, by Cluster key.
func ReadStatus(ctx context.Context, client dynamic.Interface, namespace string) (map[string]State, error) {
	cm, err := client.Resource(configMaps).Namespace(namespace).Get(ctx, StatusName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read ConfigMap %s/%s: %w", namespace, StatusName, err)
	}
	data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	out := make(map[string]State, len(data))
	for _, k := range slices.Sorted(maps.Keys(data)) {
		var st State
		if err := json.Unmarshal([]byte(data[k]), &st); err != nil {
			return nil, fmt.Errorf("ConfigMap %s/%s key %s: %w", namespace, StatusName, k, err)
		}
		out[st.Cluster] = st
	}
	return out, nil
}
