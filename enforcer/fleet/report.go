package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
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

// DefaultProofRefresh bounds how stale a ClusterGuard's lastProof may be
// while nothing else of its State changes: a fleet proven every few minutes
// costs one status write per Cluster per DefaultProofRefresh, not one per
// proof (10,000 Clusters: 17 writes a second). The metric
// nodeguard_workload_cluster_last_proof_timestamp_seconds is live.
const DefaultProofRefresh = 10 * time.Minute

// Status keeps one ClusterGuard per Cluster (clusterguard.go): its status
// is written within a second of anything in the Cluster's State changing but
// its proof time, and for a newer proof time at most every ProofRefresh. Only
// the leader writes.
type Status struct {
	Client dynamic.Interface
	// Owner is the Cluster of a key, for the ClusterGuard's owner reference.
	Owner func(key string) (kube.ClusterMeta, bool)
	// Leading, when set, says whether this replica writes.
	Leading func() bool
	// WatchFilter, when set, labels the ClusterGuards this install writes
	// (kube.WatchFilterLabel), takes over one another install wrote, and
	// deletes only its own: a Cluster moved to another shard keeps the
	// ClusterGuard the new one writes.
	WatchFilter  string
	ProofRefresh time.Duration // default DefaultProofRefresh
	Workers      int           // writes at once (default 4)
	Log          *slog.Logger

	once    sync.Once
	loop    *kube.Loop[string]
	mu      sync.Mutex
	states  map[string]State // to be written; a key absent is to be deleted
	written map[string]written
}

// written is what this replica last wrote of a Cluster.
type written struct {
	state      State
	at         time.Time
	generation int64
	conditions []metav1.Condition
}

func (s *Status) init() {
	s.once.Do(func() {
		kube.SetDefault(&s.ProofRefresh, DefaultProofRefresh)
		kube.SetDefault(&s.Workers, 4)
		s.states, s.written = map[string]State{}, map[string]written{}
		s.loop = kube.NewLoop(kube.LoopOptions{Name: "nodeguard_clusterguards", Workers: s.Workers}, s.write)
	})
}

// Report takes a State (Options.Report).
func (s *Status) Report(st State) {
	s.init()
	s.mu.Lock()
	s.states[st.Cluster] = st
	w, ok := s.written[st.Cluster]
	s.mu.Unlock()
	// Anything but a newer proof time is news.
	a, b := w.state, st
	a.LastProof, a.Since, b.LastProof, b.Since = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	if !ok || a != b || (st.LastProof.After(w.state.LastProof) && time.Since(w.at) >= s.ProofRefresh) {
		s.loop.Add(st.Cluster)
	}
}

// Lead is told that this replica leads now: another leader may have
// written since this one last did, so every State is written afresh.
func (s *Status) Lead() {
	s.init()
	s.mu.Lock()
	clear(s.written)
	s.mu.Unlock()
}

// Forget deletes the ClusterGuard of a Cluster that is gone
// (Options.Forgotten); its owner reference has the garbage collector do the
// same when nodeguard is not running.
func (s *Status) Forget(key string) {
	s.init()
	s.mu.Lock()
	delete(s.states, key)
	s.mu.Unlock()
	s.loop.Add(key)
}

// Run writes until ctx is done.
func (s *Status) Run(ctx context.Context) {
	s.init()
	s.loop.Run(ctx)
}

func (s *Status) write(ctx context.Context, key string) kube.Result {
	if s.Leading != nil && !s.Leading() {
		return kube.Result{} // a new leader writes every Cluster it proves
	}
	ns, name, err := record.SplitKey("cluster", key)
	if err != nil {
		return kube.Result{}
	}
	s.mu.Lock()
	st, want := s.states[key]
	w := s.written[key]
	s.mu.Unlock()
	if !want {
		mine := func(u *unstructured.Unstructured) bool { return u.GetLabels()[kube.WatchFilterLabel] == s.WatchFilter }
		if _, err := kube.DeleteOwnedIf(ctx, s.Client, ClusterGuards, ns, name, mine); err != nil {
			s.failed(key, err)
			return kube.Result{Retry: true}
		}
		s.mu.Lock()
		if _, again := s.states[key]; !again {
			delete(s.written, key)
		}
		s.mu.Unlock()
		return kube.Result{}
	}
	meta, ok := s.Owner(key)
	if !ok {
		return kube.Result{} // the Cluster is gone: Forget follows
	}
	owner := metav1.OwnerReference{APIVersion: meta.APIVersion, Kind: "Cluster", Name: name, UID: meta.UID}
	obj, conds := clusterGuard(st, ns, name, owner, max(w.generation, 1), w.conditions)
	if s.WatchFilter != "" {
		labels := obj.GetLabels()
		labels[kube.WatchFilterLabel] = s.WatchFilter
		obj.SetLabels(labels)
	}
	stored, err := s.applyStatus(ctx, obj)
	if apierrors.IsNotFound(err) || (err == nil && (!ownedBy(stored, meta.UID) || stored.GetLabels()[kube.WatchFilterLabel] != s.WatchFilter)) {
		// Created here (or taken over from a Cluster of the same name
		// before it, or from the shard the Cluster moved from): the object
		// first, then its status.
		whole := obj.DeepCopy()
		unstructured.RemoveNestedField(whole.Object, "status")
		if _, err = kube.ApplyOwned(ctx, s.Client, kube.Owned{Resource: ClusterGuards, Object: whole}); err == nil {
			stored, err = s.applyStatus(ctx, obj)
		}
	}
	if err != nil {
		s.failed(key, err)
		return kube.Result{Retry: true}
	}
	s.mu.Lock()
	s.written[key] = written{state: st, at: time.Now(), generation: stored.GetGeneration(), conditions: conds}
	s.mu.Unlock()
	return kube.Result{}
}

// applyStatus writes obj's status with server-side apply.
func (s *Status) applyStatus(ctx context.Context, obj *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	status := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": obj.GetAPIVersion(), "kind": obj.GetKind(),
		"metadata": map[string]any{"namespace": obj.GetNamespace(), "name": obj.GetName()},
		"status":   obj.Object["status"],
	}}
	out, err := s.Client.Resource(ClusterGuards).Namespace(obj.GetNamespace()).ApplyStatus(ctx, obj.GetName(), status,
		metav1.ApplyOptions{FieldManager: kube.FieldManager, Force: true})
	if err != nil {
		return nil, fmt.Errorf("apply the status of ClusterGuard %s/%s: %w", obj.GetNamespace(), obj.GetName(), err)
	}
	return out, nil
}

func ownedBy(u *unstructured.Unstructured, uid types.UID) bool {
	for _, r := range u.GetOwnerReferences() {
		if r.UID == uid {
			return true
		}
	}
	return false
}

func (s *Status) failed(key string, err error) {
	if s.Log != nil {
		s.Log.Error("fleet: cannot write the Cluster's ClusterGuard; `nodeguard clusters` and `kubectl get clusterguards` show an older state",
			"cluster", key, "error", err.Error())
	}
}

// ReadStatus reads the States the reconciler wrote, by Cluster key.
func ReadStatus(ctx context.Context, client dynamic.Interface) (map[string]State, error) {
	list, err := client.Resource(ClusterGuards).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ClusterGuards (%s): %w", ClusterGuards.GroupResource(), err)
	}
	out := make(map[string]State, len(list.Items))
	for i := range list.Items {
		st := stateOf(&list.Items[i])
		out[st.Cluster] = st
	}
	return out, nil
}
