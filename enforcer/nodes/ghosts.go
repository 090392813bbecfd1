// This file acts on ghost Nodes, the hosts that outlived their deletion
// (policies/nodeguard/ghosts decides which Node is one; the orphan scan
// judges them): it counts them (nodeguard_ghost_nodes), records a Warning
// Event GhostNode on each naming what was deleted and when, and, where a
// cluster's protection is taint, keeps nodeguard's NoExecute taint on it so
// no Pod is scheduled or kept there, removing it once the Node is no ghost
// any more. It never deletes one: deleting it again would free its Pods'
// identities while the host runs.

package nodes

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"

	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/metrics"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// Protection is what nodeguard does about a cluster's ghosts besides
// reporting them.
type Protection string

// The protections.
const (
	// ProtectionOff reports ghosts (metric, Event, `nodeguard ghosts`) and does
	// nothing else.
	ProtectionOff Protection = "off"
	// ProtectionDeny has the registration webhook (its own entry, failurePolicy
	// Ignore) deny a ghost's Node CREATE, and the UPDATE that sets a
	// tombstoned providerID: the kubelet keeps retrying, nothing is
	// scheduled there. Ghosts that registered anyway are reported.
	ProtectionDeny Protection = "deny"
	// ProtectionTaint lets the ghost register and taints it NoExecute (TaintKey):
	// nothing is scheduled there, nothing without a toleration kept.
	ProtectionTaint Protection = "taint"
)

// Protections lists them, for flags and errors.
func Protections() []Protection { return []Protection{ProtectionOff, ProtectionDeny, ProtectionTaint} }

// GhostAnnotation on a CAPI Cluster sets its protection, over the default
// (serve --ghost-protection).
const GhostAnnotation = "nodeguard.io/ghost-protection"

// What nodeguard writes on a ghost: its taint, its Event's reason, and the
// log line of a Node first seen a ghost.
const (
	GhostTaintKey   = "nodeguard.io/ghost"
	GhostReason     = "GhostNode"
	GhostLogMessage = "ghost Node: its host outlived its deletion"
)

// ParseProtection reads a protection; "" is def.
func ParseProtection(s string, def Protection) (Protection, error) {
	if s == "" {
		return def, nil
	}
	p := Protection(s)
	if !slices.Contains(Protections(), p) {
		return "", fmt.Errorf("ghost protection %q: want one of %v", s, Protections())
	}
	return p, nil
}

// ProtectionOf is a Cluster's protection: its annotation, else def.
func ProtectionOf(annotations map[string]string, def Protection) (Protection, error) {
	p, err := ParseProtection(annotations[GhostAnnotation], def)
	if err != nil {
		return def, fmt.Errorf("annotation %s: %w", GhostAnnotation, err)
	}
	return p, nil
}

// GhostTarget is one cluster whose ghosts are acted on.
type GhostTarget struct {
	// Cluster is "" for the cluster nodeguard runs in, else the workload
	// Cluster's "namespace/name".
	Cluster string
	// Nodes reads and taints that cluster's Nodes.
	Nodes dynamic.Interface
	// Recorder records the GhostNode Events; nil records none.
	Recorder events.EventRecorder
}

// GhostOptions configure a GhostTracker.
type GhostOptions struct {
	// Protection is a cluster's protection (nil: ProtectionOff everywhere).
	Protection func(cluster string) Protection
	// Confirm is how long a Node must stay a ghost before it is reported
	// and acted on (default DefaultGhostConfirm).
	Confirm time.Duration
	Metrics *GhostMetrics
	// DecisionLog, when set, gets each ghost confirmed and each ghost no more.
	DecisionLog *rule.DecisionLog
	Log         *slog.Logger
}

// DefaultGhostConfirm: a new InfraMachine (management cluster) and the Node its
// host registers (workload cluster) reach nodeguard through informers of
// two API servers, so for some milliseconds a legitimate reuse of a
// providerID can look like a ghost; a verdict that holds this long is no
// informer's lag.
const DefaultGhostConfirm = 2 * time.Second

// GhostTracker remembers the ghosts seen; safe for concurrent use.
type GhostTracker struct {
	opts GhostOptions
	perNode[*ghost]
}

// ghost is one Node seen a ghost, and what was done about it.
type ghost struct {
	verdict   guard.Ghost
	since     time.Time
	confirmed bool // a ghost for Confirm: reported
	tainted   bool
}

// GhostRecord is a ghost as `nodeguard ghosts` and the logs show it.
type GhostRecord struct {
	Cluster string      `json:"cluster"`
	Ghost   guard.Ghost `json:"ghost"`
	Since   time.Time   `json:"since"`
	Tainted bool        `json:"tainted"`
}

// NewGhostTracker returns a GhostTracker with no ghost.
func NewGhostTracker(opts GhostOptions) *GhostTracker {
	if opts.Confirm <= 0 {
		opts.Confirm = DefaultGhostConfirm
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	return &GhostTracker{opts: opts, perNode: newPerNode[*ghost]()}
}

func (tr *GhostTracker) protection(cluster string) Protection {
	if tr.opts.Protection == nil {
		return ProtectionOff
	}
	return tr.opts.Protection(cluster)
}

// Observe takes one verdict on a Node of t at now, and acts. A ghost (a
// Node, or a Node of a new UID) is reported once it stayed one for Confirm:
// Observe returns when to judge it again for that. Reported, it is logged
// and counted, gets its Event and, in taint mode, the taint. A Node that is
// no ghost loses the taint nodeguard set; untaint asks to make sure of that
// even when this process never set it (its tombstone changed: it may have
// been set before a restart).
func (tr *GhostTracker) Observe(ctx context.Context, t GhostTarget, g guard.Ghost, now time.Time, untaint bool) (time.Time, error) {
	k := nodeKey{cluster: t.Cluster, node: g.Node}
	tr.mu.Lock()
	if tr.gone[t.Cluster] {
		tr.mu.Unlock()
		return time.Time{}, nil
	}
	have := tr.known[k]
	if !g.Ghost {
		delete(tr.known, k)
		tr.mu.Unlock()
		if have != nil && have.confirmed {
			tr.report(t.Cluster)
			tr.opts.Log.Info("ghost Node no more", "cluster", t.Cluster, "node", g.Node, "kept", g.Kept)
			tr.logVerdict(t.Cluster, g, "ghost-no-more")
		}
		if (have != nil && have.tainted) || untaint {
			return time.Time{}, tr.setTaint(ctx, t, g, false)
		}
		return time.Time{}, nil
	}
	if have == nil || have.verdict.UID != g.UID {
		have = &ghost{since: now}
		tr.known[k] = have
	}
	have.verdict = g
	if due := have.since.Add(tr.opts.Confirm); now.Before(due) {
		tr.mu.Unlock()
		return due, nil
	}
	report := !have.confirmed
	have.confirmed = true
	taint := tr.protection(t.Cluster) == ProtectionTaint && !have.tainted
	tr.mu.Unlock()
	if report {
		tr.report(t.Cluster)
		tr.opts.Log.Warn(GhostLogMessage, "cluster", t.Cluster, "node", g.Node, "providerID", g.ProviderID,
			"reason", g.Reason)
		tr.logVerdict(t.Cluster, g, "ghost")
		if t.Recorder != nil {
			t.Recorder.Eventf(nodeRef(g), nil, "Warning", GhostReason, "Detect",
				"Ghost Node: %s. Stop that host (docs/runbook.md#nodeguardghostnode); nodeguard never deletes this Node.", g.Reason)
		}
	}
	if !taint {
		return time.Time{}, nil
	}
	if err := tr.setTaint(ctx, t, g, true); err != nil {
		return time.Time{}, err
	}
	tr.mu.Lock()
	if cur := tr.known[k]; cur != nil && cur.verdict.UID == g.UID {
		cur.tainted = true
	}
	tr.mu.Unlock()
	return time.Time{}, nil
}

// nodeRef is what the Event is about: the Node, by name and UID.
func nodeRef(g guard.Ghost) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("v1")
	u.SetKind("Node")
	u.SetName(g.Node)
	u.SetUID(g.UID)
	return u
}

// setTaint adds or removes nodeguard's taint on the Node judged (the same
// UID: a Node re-created under the name is judged again on its own),
// reading it first: client-go's strategic merge replaces a Node's taints
// whole, so an update with its resourceVersion keeps everyone else's.
func (tr *GhostTracker) setTaint(ctx context.Context, t GhostTarget, g guard.Ghost, on bool) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := t.Nodes.Resource(guard.NodeGVR).Get(ctx, g.Node, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if n.GetUID() != g.UID && g.UID != "" {
			return nil
		}
		taints, _, _ := unstructured.NestedSlice(n.Object, "spec", "taints")
		has := slices.IndexFunc(taints, func(x any) bool {
			m, _ := x.(map[string]any)
			return m["key"] == GhostTaintKey
		})
		switch {
		case on && has >= 0, !on && has < 0:
			return nil
		case on:
			taints = append(taints, map[string]any{"key": GhostTaintKey, "effect": "NoExecute", "value": "true"})
		default:
			taints = slices.Delete(taints, has, has+1)
		}
		if err := unstructured.SetNestedSlice(n.Object, taints, "spec", "taints"); err != nil {
			return err
		}
		_, err = t.Nodes.Resource(guard.NodeGVR).Update(ctx, n, metav1.UpdateOptions{FieldManager: kube.FieldManager})
		return err
	})
	what := "remove nodeguard's taint from"
	if on {
		what = "taint"
	}
	if err != nil {
		return fmt.Errorf("%s ghost Node %q: %w", what, g.Node, err)
	}
	if on {
		tr.opts.Log.Info("ghost Node tainted "+GhostTaintKey+":NoExecute", "cluster", t.Cluster, "node", g.Node)
	}
	return nil
}

// Forget drops a Node that is gone.
func (tr *GhostTracker) Forget(cluster, node string) {
	if g, had := tr.forget(cluster, node); had && g.confirmed {
		tr.report(cluster)
	}
}

// ForgetCluster drops every ghost of a cluster no longer judged, and its
// gauge, and ignores its verdicts until AddCluster.
func (tr *GhostTracker) ForgetCluster(cluster string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.forgetCluster(cluster)
	tr.opts.Metrics.forget(cluster)
}

// report sets a cluster's gauge to its ghosts reported now; under the lock,
// so a report counted before ForgetCluster cannot set it after.
func (tr *GhostTracker) report(cluster string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.gone[cluster] {
		return
	}
	n := 0
	for k, g := range tr.known {
		if k.cluster == cluster && g.confirmed {
			n++
		}
	}
	tr.opts.Metrics.set(cluster, n)
}

// Ghosts returns every ghost reported now, by cluster and Node name.
func (tr *GhostTracker) Ghosts() []GhostRecord {
	tr.mu.Lock()
	out := make([]GhostRecord, 0, len(tr.known))
	for k, g := range tr.known {
		if !g.confirmed {
			continue
		}
		out = append(out, GhostRecord{Cluster: k.cluster, Ghost: g.verdict, Since: g.since, Tainted: g.tainted})
	}
	tr.mu.Unlock()
	slices.SortFunc(out, func(a, b GhostRecord) int {
		return strings.Compare(a.Cluster+"\x00"+a.Ghost.Node, b.Cluster+"\x00"+b.Ghost.Node)
	})
	return out
}

// GhostMetrics are the ghosts' Prometheus series.
type GhostMetrics struct {
	ghosts *prometheus.GaugeVec
}

// NewGhostMetrics registers nodeguard_ghost_nodes{cluster}.
func NewGhostMetrics(reg prometheus.Registerer) (*GhostMetrics, error) {
	r := metrics.New(reg)
	m := &GhostMetrics{ghosts: r.GaugeVec("nodeguard_ghost_nodes",
		"Ghost Nodes known now, by cluster (\"\" for the cluster nodeguard runs in): Nodes alive again with the providerID of a "+
			"Machine, InfraMachine or pool membership that went away, linked by nothing. Their hosts were not destroyed.", "cluster")}
	if err := r.Err("ghost metrics"); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *GhostMetrics) set(cluster string, n int) {
	if m != nil {
		m.ghosts.WithLabelValues(cluster).Set(float64(n))
	}
}

func (m *GhostMetrics) forget(cluster string) {
	if m != nil {
		m.ghosts.DeleteLabelValues(cluster)
	}
}

// logVerdict hands a ghost verdict that changed what is reported (a ghost
// confirmed, a ghost no more) to the decision log.
func (tr *GhostTracker) logVerdict(cluster string, g guard.Ghost, transition string) {
	if !tr.opts.DecisionLog.Enabled() {
		return
	}
	tr.opts.DecisionLog.Log(rule.DecisionEvent{Path: rule.GhostEntry.Path(),
		Input: map[string]any{"cluster": cluster, "node": g.Node, "uid": string(g.UID), "providerID": g.ProviderID}, Result: g,
		Custom: map[string]any{"transition": transition, "protection": string(tr.protection(cluster))}})
}
