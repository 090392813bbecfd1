// This file deletes orphan Nodes, safely: a Node is deleted only after
// two observations at least a grace apart found it an orphan (the caller
// judges it again when Observe says), a fresh read of
// the Node and fresh reads of everything the criteria read found it one
// still, by the one replica holding the lease, and with UID and
// resourceVersion preconditions so a Node re-registered under the same name
// is never deleted. The delete goes through admission like any other.

package nodes

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"

	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/metrics"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// ReapTarget is one cluster whose Nodes are reconciled.
type ReapTarget struct {
	// Cluster scopes the Machines that count: "" for the cluster nodeguard
	// runs in (self-hosted), "namespace/name" for a CAPI workload cluster.
	Cluster string
	// Nodes reads and deletes the Nodes of that cluster.
	Nodes dynamic.Interface
	// Recorder records Events on those Nodes; nil records none.
	Recorder events.EventRecorder
	// ObserveOnly: the Nodes are watched for another reason (their releases,
	// mode admission-policy) and never deleted, whatever ReaperOptions.Delete says.
	ObserveOnly bool
}

// ReaperMetrics are the reaper's Prometheus series.
type ReaperMetrics struct {
	orphans *prometheus.GaugeVec
	deleted *prometheus.CounterVec
}

// NewReaperMetrics registers nodeguard_orphan_nodes and
// nodeguard_orphan_nodes_deleted_total, both labelled by cluster ("" for
// the cluster nodeguard runs in).
func NewReaperMetrics(reg prometheus.Registerer) (*ReaperMetrics, error) {
	r := metrics.New(reg)
	m := &ReaperMetrics{
		orphans: r.GaugeVec("nodeguard_orphan_nodes",
			"Orphan Nodes known now (CAPI Nodes whose Machine and InfraMachine are gone), by cluster.", "cluster"),
		deleted: r.CounterVec("nodeguard_orphan_nodes_deleted_total",
			"Orphan Nodes deleted by the reaper, by cluster.", "cluster"),
	}
	if err := r.Err("orphan metrics"); err != nil {
		return nil, err
	}
	return m, nil
}

// ReaperOptions configure a Reaper.
type ReaperOptions struct {
	// Finder judges Nodes; its Guard should re-read objects fresh.
	Finder *guard.Finder
	// Delete turns deleting on (--reap-orphan-nodes); off, passes only
	// observe and export the gauge.
	Delete bool
	// DryRun logs what would be deleted instead of deleting.
	DryRun bool
	// IsLeader says whether this replica may act now; nil means never.
	IsLeader func() bool
	// Clock is injectable for tests (default: the real clock).
	Clock clock.PassiveClock
	// Log receives one JSON line per deletion (and per would-be deletion).
	Log *slog.Logger
	// Metrics, when set, exports the gauge and the counter.
	Metrics *ReaperMetrics
	// Permitted, when set, is asked right before every delete, in any
	// cluster: an error (the operator's switch is off) leaves the Node,
	// and the sighting is tried again later. It is what makes one object
	// stop every Node delete at once (serve: SwitchPermits).
	Permitted func(ctx context.Context) error
	// DecisionLog, when set, gets each orphan verdict first seen and each
	// act on one (deleted, would delete, kept on a fresh read).
	DecisionLog *rule.DecisionLog
}

// Reaper remembers, per Node, when it first saw it an orphan.
type Reaper struct {
	opts ReaperOptions
	perNode[sighting]
}

// sighting is a Node seen an orphan: which one (its UID), since when, and
// how many attempts to act on it failed in a row.
type sighting struct {
	uid      types.UID
	first    time.Time
	failures int
}

// NewReaper returns a Reaper.
func NewReaper(opts ReaperOptions) (*Reaper, error) {
	if opts.Finder == nil {
		return nil, fmt.Errorf("reaper: a Finder is required")
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	return &Reaper{opts: opts, perNode: newPerNode[sighting]()}, nil
}

// Outcome says what Observe made of a verdict.
type Outcome int

// The outcomes of Observe.
const (
	Kept        Outcome = iota // not an orphan (any earlier sighting forgotten)
	FirstSeen                  // an orphan, seen for the first time
	Waiting                    // an orphan, first seen less than a grace ago
	Observed                   // an orphan for a grace, not deleted: reaping off, or not the leader
	Deleted                    // deleted
	WouldDelete                // a dry run's delete
	NotDeleted                 // a fresh read or the API server said no; observation starts over
	Failed                     // acting failed; tried again later
)

// retryLimit caps the wait between attempts to act on one Node after errors.
const retryLimit = 5 * time.Minute

// Observe records v, the caches' verdict at now on one Node of t, and acts
// on an orphan first seen at least a grace ago: re-reads it fresh and
// deletes it if it still is one. It returns what it did, and when the Node
// should be judged again for the reaper's sake (zero: not until something
// changes). An error comes with Failed.
func (r *Reaper) Observe(ctx context.Context, t ReapTarget, v guard.OrphanVerdict, now time.Time) (Outcome, time.Time, error) {
	k := nodeKey{cluster: t.Cluster, node: v.Node}
	if !v.Orphan {
		r.Forget(t.Cluster, v.Node)
		return Kept, time.Time{}, nil
	}
	grace := r.opts.Finder.Grace()
	r.mu.Lock()
	if r.gone[t.Cluster] {
		r.mu.Unlock()
		return Kept, time.Time{}, nil
	}
	s, ok := r.known[k]
	if !ok || s.uid != v.UID {
		// First seen, or a Node re-registered under the name: start over.
		r.known[k] = sighting{uid: v.UID, first: now}
		r.mu.Unlock()
		r.Report(t.Cluster)
		r.logVerdict(t.Cluster, v, "first-seen", nil)
		return FirstSeen, now.Add(grace), nil
	}
	r.mu.Unlock()
	if now.Sub(s.first) < grace {
		return Waiting, s.first.Add(grace), nil
	}
	// Checked per Node: a lease lost mid-way stops the deletes.
	if !r.opts.Delete || t.ObserveOnly || !r.Leading() {
		return Observed, time.Time{}, nil
	}
	outcome, err := r.act(ctx, t, v)
	if err != nil {
		r.mu.Lock()
		s, ok := r.known[k]
		if ok {
			s.failures++
			r.known[k] = s
		}
		r.mu.Unlock()
		return Failed, now.Add(min(retryLimit, time.Second<<min(s.failures, 16))), err
	}
	return outcome, time.Time{}, nil
}

// Leading reports whether this replica may delete now.
func (r *Reaper) Leading() bool { return r.opts.IsLeader != nil && r.opts.IsLeader() }

// Forget drops what the reaper knows of a Node: it is gone, or not an
// orphan; if it becomes one again, observation starts over.
func (r *Reaper) Forget(cluster, node string) {
	if _, had := r.forget(cluster, node); had {
		r.Report(cluster)
	}
}

// ForgetCluster drops every Node of a cluster no longer judged, and its
// gauge, and ignores its verdicts until AddCluster.
func (r *Reaper) ForgetCluster(cluster string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forgetCluster(cluster)
	if r.opts.Metrics != nil {
		r.opts.Metrics.orphans.DeleteLabelValues(cluster)
	}
}

// Orphans returns the Nodes of cluster currently seen as orphans, sorted.
func (r *Reaper) Orphans(cluster string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.orphans(cluster)
	sort.Strings(out)
	return out
}

// orphans lists the Nodes of cluster seen as orphans; the caller holds r.mu.
func (r *Reaper) orphans(cluster string) []string {
	var out []string
	for k := range r.known {
		if k.cluster == cluster {
			out = append(out, k.node)
		}
	}
	return out
}

// Report sets nodeguard_orphan_nodes of a cluster to the orphans known now;
// the caller reports each cluster it has judged, so the gauge says 0 rather
// than nothing for a cluster without orphans.
func (r *Reaper) Report(cluster string) {
	if r.opts.Metrics == nil {
		return
	}
	// Under the lock, so a gauge counted before ForgetCluster cannot be set
	// after it.
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gone[cluster] {
		return
	}
	r.opts.Metrics.orphans.WithLabelValues(cluster).Set(float64(len(r.orphans(cluster))))
	// The counter exists at zero from the first report, so increase() sees
	// a cluster's first deletion.
	r.opts.Metrics.deleted.WithLabelValues(cluster)
}

// act re-reads the Node and everything the criteria read, and deletes it
// only if it is the same Node (UID) and still an orphan.
func (r *Reaper) act(ctx context.Context, t ReapTarget, seen guard.OrphanVerdict) (Outcome, error) {
	log := r.opts.Log.With("node", seen.Node, "uid", string(seen.UID), "cluster", t.Cluster)
	fresh, err := t.Nodes.Resource(guard.NodeGVR).Get(ctx, seen.Node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		r.Forget(t.Cluster, seen.Node)
		return NotDeleted, nil
	}
	if err != nil {
		return Failed, fmt.Errorf("re-read Node %q: %w", seen.Node, err)
	}
	if fresh.GetUID() != seen.UID {
		log.Info("orphan node re-registered under the same name; not deleting", "freshUID", string(fresh.GetUID()))
		r.Forget(t.Cluster, seen.Node)
		return NotDeleted, nil
	}
	verdicts, err := r.opts.Finder.Judge(ctx, []*unstructured.Unstructured{fresh}, t.Cluster, r.opts.Clock.Now())
	if err != nil {
		return Failed, err
	}
	v := verdicts[0]
	if !v.Orphan {
		log.Info("node no longer an orphan on a fresh read; not deleting", "kept", v.Kept)
		r.logVerdict(t.Cluster, v, "kept-on-fresh-read", nil)
		r.Forget(t.Cluster, seen.Node)
		return NotDeleted, nil
	}
	attrs := []any{"machine", v.Machine, "notReadySince", v.NotReadySince, "reason", v.Reason, "resourceVersion", v.ResourceVersion}
	if r.opts.DryRun {
		log.Info("dry run: would delete orphan node", attrs...)
		r.logVerdict(t.Cluster, v, "would-delete", nil)
		return WouldDelete, nil
	}
	if r.opts.Permitted != nil {
		if err := r.opts.Permitted(ctx); err != nil {
			return Failed, fmt.Errorf("not deleting orphan Node %q: %w", v.Node, err)
		}
	}
	if err := DeleteNode(ctx, t.Nodes, v); err != nil {
		// A precondition failure (re-registered, changed) or a denial by
		// admission: observe again from scratch.
		r.Forget(t.Cluster, seen.Node)
		log.Warn("orphan node not deleted", append(attrs, "error", err.Error())...)
		r.logVerdict(t.Cluster, v, "not-deleted", err)
		return NotDeleted, nil
	}
	r.Forget(t.Cluster, seen.Node)
	log.Info("deleted orphan node", attrs...)
	r.logVerdict(t.Cluster, v, "deleted", nil)
	if r.opts.Metrics != nil {
		r.opts.Metrics.deleted.WithLabelValues(t.Cluster).Inc()
	}
	if t.Recorder != nil {
		t.Recorder.Eventf(fresh, nil, "Normal", "OrphanNodeDeleted", "Delete",
			"nodeguard deleted orphan Node %s: %s", v.Node, v.Reason)
	}
	return Deleted, nil
}

// DeleteNode deletes the Node the verdict judged, and only that one: the
// preconditions make the API server refuse when the Node was re-registered
// under the same name (UID) or changed since (resourceVersion). The delete
// goes through admission, so nodeguard's own webhook judges it too.
func DeleteNode(ctx context.Context, client dynamic.Interface, v guard.OrphanVerdict) error {
	if v.UID == "" || v.ResourceVersion == "" {
		return fmt.Errorf("delete Node %q: no UID or resourceVersion to make the delete conditional", v.Node)
	}
	uid, rv := v.UID, v.ResourceVersion
	err := client.Resource(guard.NodeGVR).Delete(ctx, v.Node, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
	if err != nil {
		return fmt.Errorf("delete Node %q (uid %s, resourceVersion %s): %w", v.Node, uid, rv, err)
	}
	return nil
}

// logVerdict hands an orphan verdict and what the reaper did about it to
// the decision log.
func (r *Reaper) logVerdict(cluster string, v guard.OrphanVerdict, outcome string, err error) {
	if !r.opts.DecisionLog.Enabled() {
		return
	}
	custom := map[string]any{"outcome": outcome, "reaper": r.opts.Delete && !r.opts.DryRun}
	if err != nil {
		custom["error"] = err.Error()
	}
	r.opts.DecisionLog.Log(rule.DecisionEvent{Path: rule.OrphanEntry.Path(),
		Input: map[string]any{"cluster": cluster, "node": v.Node, "uid": string(v.UID)}, Result: v, Custom: custom})
}
