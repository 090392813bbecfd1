// Package reaper deletes orphan Nodes, safely: a Node is deleted only after
// two observations at least a grace apart found it an orphan, a fresh read of
// the Node and fresh reads of everything the criteria read found it one
// still, by the one replica holding the lease, and with UID and
// resourceVersion preconditions so a Node re-registered under the same name
// is never deleted. The delete goes through admission like any other.
package reaper

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
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"

	"github.com/nodeguard/nodeguard/enforcer/orphans"
)

// Target is one cluster whose Nodes are reconciled.
type Target struct {
	// Cluster scopes the Machines that count: "" for the cluster nodeguard
	// runs in (self-hosted), "namespace/name" for a CAPI workload cluster.
	Cluster string
	// Nodes reads and deletes the Nodes of that cluster.
	Nodes dynamic.Interface
	// Recorder records Events on those Nodes; nil records none.
	Recorder events.EventRecorder
}

// Metrics are the reaper's Prometheus series.
type Metrics struct {
	orphans *prometheus.GaugeVec
	deleted *prometheus.CounterVec
}

// NewMetrics registers nodeguard_orphan_nodes and
// nodeguard_orphan_nodes_deleted_total, both labelled by cluster ("" for
// the cluster nodeguard runs in).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		orphans: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nodeguard_orphan_nodes",
			Help: "Orphan Nodes found by the last pass (CAPI Nodes whose Machine and InfraMachine are gone), by cluster.",
		}, []string{"cluster"}),
		deleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeguard_orphan_nodes_deleted_total",
			Help: "Orphan Nodes deleted by the reaper, by cluster.",
		}, []string{"cluster"}),
	}
	for _, c := range []prometheus.Collector{m.orphans, m.deleted} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register orphan metrics: %w", err)
		}
	}
	return m, nil
}

// Options configure a Reaper.
type Options struct {
	// Finder judges Nodes; its Guard should re-read objects fresh.
	Finder *orphans.Finder
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
	Metrics *Metrics
}

// Reaper remembers, per Node UID, when it first saw it an orphan.
type Reaper struct {
	opts Options

	mu   sync.Mutex
	seen map[seenKey]time.Time
}

type seenKey struct {
	cluster, node string
	uid           types.UID
}

// New returns a Reaper.
func New(opts Options) (*Reaper, error) {
	if opts.Finder == nil {
		return nil, fmt.Errorf("reaper: a Finder is required")
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	return &Reaper{opts: opts, seen: map[seenKey]time.Time{}}, nil
}

// Result says what one pass did.
type Result struct {
	Orphans []string // Nodes found orphan in this pass
	Deleted []string // Nodes deleted (never in dry-run)
	Would   []string // Nodes a dry-run would have deleted
}

// Pass lists the Nodes of t, judges them, and acts on the orphans seen
// a grace ago already. An error leaves the observations as they were.
func (r *Reaper) Pass(ctx context.Context, t Target) (Result, error) {
	nodes, err := orphans.ListNodes(ctx, t.Nodes)
	if err != nil {
		return Result{}, err
	}
	now := r.opts.Clock.Now()
	verdicts, err := r.opts.Finder.Scan(ctx, nodes, t.Cluster, now)
	if err != nil {
		return Result{}, err
	}
	var res Result
	current := map[seenKey]bool{}
	var due []orphans.Verdict
	r.mu.Lock()
	for _, v := range verdicts {
		if !v.Orphan {
			continue
		}
		res.Orphans = append(res.Orphans, v.Node)
		k := seenKey{cluster: t.Cluster, node: v.Node, uid: v.UID}
		current[k] = true
		first, ok := r.seen[k]
		if !ok {
			r.seen[k] = now
			continue
		}
		if now.Sub(first) >= r.opts.Finder.Grace() {
			due = append(due, v)
		}
	}
	// A Node no longer an orphan starts over if it becomes one again.
	for k := range r.seen {
		if k.cluster == t.Cluster && !current[k] {
			delete(r.seen, k)
		}
	}
	r.mu.Unlock()
	if r.opts.Metrics != nil {
		r.opts.Metrics.orphans.WithLabelValues(t.Cluster).Set(float64(len(res.Orphans)))
		// The counter exists at zero from the first pass, so increase()
		// sees a cluster's first deletion (NodeguardOrphanNodesDeleted).
		r.opts.Metrics.deleted.WithLabelValues(t.Cluster)
	}
	if !r.opts.Delete {
		return res, nil
	}
	for _, v := range due {
		// Checked per Node: a lease lost mid-pass stops the pass.
		if r.opts.IsLeader == nil || !r.opts.IsLeader() {
			return res, nil
		}
		deleted, err := r.act(ctx, t, v)
		if err != nil {
			return res, err
		}
		if deleted && r.opts.DryRun {
			res.Would = append(res.Would, v.Node)
		} else if deleted {
			res.Deleted = append(res.Deleted, v.Node)
		}
	}
	return res, nil
}

// act re-reads the Node and everything the criteria read, and deletes it
// only if it is the same Node (UID) and still an orphan.
func (r *Reaper) act(ctx context.Context, t Target, seen orphans.Verdict) (bool, error) {
	log := r.opts.Log.With("node", seen.Node, "uid", string(seen.UID), "cluster", t.Cluster)
	fresh, err := t.Nodes.Resource(orphans.NodeGVR).Get(ctx, seen.Node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		r.forget(t.Cluster, seen)
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("re-read Node %q: %w", seen.Node, err)
	}
	if fresh.GetUID() != seen.UID {
		log.Info("orphan node re-registered under the same name; not deleting", "freshUID", string(fresh.GetUID()))
		r.forget(t.Cluster, seen)
		return false, nil
	}
	verdicts, err := r.opts.Finder.Judge(ctx, []*unstructured.Unstructured{fresh}, t.Cluster, r.opts.Clock.Now())
	if err != nil {
		return false, err
	}
	v := verdicts[0]
	if !v.Orphan {
		log.Info("node no longer an orphan on a fresh read; not deleting", "kept", v.Kept)
		r.forget(t.Cluster, seen)
		return false, nil
	}
	attrs := []any{"machine", v.Machine, "notReadySince", v.NotReadySince, "reason", v.Reason, "resourceVersion", v.ResourceVersion}
	if r.opts.DryRun {
		log.Info("dry run: would delete orphan node", attrs...)
		return true, nil
	}
	if err := orphans.DeleteNode(ctx, t.Nodes, v); err != nil {
		// A precondition failure (re-registered, changed) or a denial by
		// admission: observe again from scratch.
		r.forget(t.Cluster, seen)
		log.Warn("orphan node not deleted", append(attrs, "error", err.Error())...)
		return false, nil
	}
	r.forget(t.Cluster, seen)
	log.Info("deleted orphan node", attrs...)
	if r.opts.Metrics != nil {
		r.opts.Metrics.deleted.WithLabelValues(t.Cluster).Inc()
	}
	if t.Recorder != nil {
		t.Recorder.Eventf(fresh, nil, "Normal", "OrphanNodeDeleted", "Delete",
			"nodeguard deleted orphan Node %s: %s", v.Node, v.Reason)
	}
	return true, nil
}

func (r *Reaper) forget(cluster string, v orphans.Verdict) {
	r.mu.Lock()
	delete(r.seen, seenKey{cluster: cluster, node: v.Node, uid: v.UID})
	r.mu.Unlock()
}

// Run makes a pass over every target each interval until ctx is done;
// targets is called per round (workload clusters come and go). Errors are
// logged, and the next round tries again.
func (r *Reaper) Run(ctx context.Context, interval time.Duration, targets func(context.Context) ([]Target, error)) {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		ts, err := targets(ctx)
		if err != nil {
			r.opts.Log.Error("orphan reaper: list clusters", "error", err.Error())
		}
		for _, t := range ts {
			if _, err := r.Pass(ctx, t); err != nil && ctx.Err() == nil {
				r.opts.Log.Error("orphan reaper: pass failed", "cluster", t.Cluster, "error", err.Error())
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}
