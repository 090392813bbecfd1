// Package guard is nodeguard's library API: Decide says whether a Node may be
// deleted, from an inventory of Machines and InfraMachines, optionally
// re-reading the few candidate objects from the API server first.
package guard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeguard/nodeguard/enforcer/decision"
	"github.com/nodeguard/nodeguard/enforcer/inventory"
	"github.com/nodeguard/nodeguard/enforcer/linkmodel"
)

// Request is one Node delete to judge.
type Request struct {
	Node *unstructured.Unstructured
	// Cluster, "namespace/name", limits the Machines and InfraMachines that
	// count to one CAPI Cluster; empty means all.
	Cluster  string
	UserInfo authenticationv1.UserInfo
}

// FreshReader reads one object from the API server, bypassing caches. It
// returns nil and no error when the object does not exist.
type FreshReader interface {
	Get(ctx context.Context, gvk schema.GroupVersionKind, namespace, name string) (*unstructured.Unstructured, error)
}

// Options configure a Guard.
type Options struct {
	// Parameters are a Constraint's spec.parameters; missing keys take the
	// rule's defaults.
	Parameters map[string]any
	// SyncedKinds, when set, replaces infraMachineKinds and
	// infraMachinePoolKinds with the kinds actually synced (live use).
	SyncedKinds func() (machines, pools []schema.GroupVersionKind)
	// Ready, when set, returns an error while the inventory is not synced;
	// every decision is then a denial.
	Ready func() error
	// Fresh, when set, re-reads every candidate before deciding.
	Fresh FreshReader
	// FreshTimeout bounds all fresh reads of one decision (default 2s).
	FreshTimeout time.Duration
	// Evaluator, when set, is shared instead of compiling the rule again.
	Evaluator *decision.Evaluator
}

// Guard decides Node deletes; it is safe for concurrent use.
type Guard struct {
	eval   *decision.Evaluator
	inv    *inventory.Inventory
	params map[string]any
	opts   Options
	// exemptGroups is the parameter as a set, nil when it is not a list.
	exemptGroups map[string]bool

	// Converted parameters per cluster route, with the synced kinds they
	// were built from: converting them is a fair share of a decision's cost.
	mu     sync.Mutex
	routes map[string]route
}

type route struct {
	kinds  string
	params decision.Parameters
}

// maxRoutes bounds the converted parameters kept; a caller naming ever new
// clusters then pays the conversion each time instead of growing memory.
const maxRoutes = 1024

// New prepares the rule once.
func New(ctx context.Context, inv *inventory.Inventory, opts Options) (*Guard, error) {
	eval := opts.Evaluator
	if eval == nil {
		var err error
		if eval, err = decision.NewEvaluator(ctx); err != nil {
			return nil, err
		}
	}
	params := eval.DefaultParameters()
	for k, v := range opts.Parameters {
		params[k] = v
	}
	if opts.FreshTimeout == 0 {
		opts.FreshTimeout = 2 * time.Second
	}
	g := &Guard{eval: eval, inv: inv, params: params, opts: opts, routes: map[string]route{}}
	if list, ok := params["exemptGroups"].([]any); ok {
		g.exemptGroups = map[string]bool{}
		for _, item := range list {
			if s, ok := item.(string); ok {
				g.exemptGroups[s] = true
			}
		}
	}
	return g, nil
}

// user keeps what the rule reads of the requesting user: the username, and
// of the groups only those in exemptGroups, the one thing the rule asks of
// them. A forged review with ~100,000 groups would otherwise cost ~17 MB of
// rule input; the decision is the same either way.
func (g *Guard) user(u authenticationv1.UserInfo) authenticationv1.UserInfo {
	if g.exemptGroups == nil {
		return u
	}
	out := authenticationv1.UserInfo{Username: u.Username}
	for _, group := range u.Groups {
		if g.exemptGroups[group] {
			out.Groups = append(out.Groups, group)
		}
	}
	return out
}

// Parameters returns the effective parameters (defaults merged with the
// Constraint's), before synced kinds and cluster scope are applied.
func (g *Guard) Parameters() map[string]any {
	out := make(map[string]any, len(g.params))
	for k, v := range g.params {
		out[k] = v
	}
	return out
}

// Decide judges the delete of req.Node. An error means no decision could be
// made (bad request, rule failure); callers must then deny.
func (g *Guard) Decide(ctx context.Context, req Request) (decision.Decision, error) {
	if req.Node == nil || req.Node.GetName() == "" {
		return decision.Decision{}, errors.New("decide: the request has no Node")
	}
	if g.opts.Ready != nil {
		if err := g.opts.Ready(); err != nil {
			return Deny(decision.ReasonNotReady, fmt.Sprintf("Node %q cannot be deleted yet: nodeguard is not ready (%v), "+
				"so it cannot tell whether an InfraMachine is linked to it; retry once nodeguard reports ready.",
				req.Node.GetName(), err)), nil
		}
	}
	params, err := g.parameters(req.Cluster)
	if err != nil {
		return decision.Decision{}, err
	}
	objs, refs := g.inv.Candidates(req.Node)
	if g.opts.Fresh != nil {
		objs, err = g.refresh(ctx, objs, refs)
		if err != nil {
			return Deny(decision.ReasonFreshReadFailed, fmt.Sprintf("Node %q cannot be deleted right now: nodeguard could not re-read the "+
				"objects linked to it from the API server (%v), so it cannot prove their hosts are gone; retry shortly.",
				req.Node.GetName(), err)), nil
		}
	}
	return g.eval.Evaluate(ctx, decision.Input{
		Review:     DeleteReview(g.inv.Model().StripNode(req.Node), g.user(req.UserInfo)),
		Inventory:  inventory.Layout(objs),
		Parameters: params,
	})
}

// Model returns the link model the guard follows (its inventory's).
func (g *Guard) Model() *linkmodel.Model { return g.inv.Model() }

// Deny is a denial that no Rego evaluation produced (not ready, no fresh read).
func Deny(reason, msg string) decision.Decision {
	return decision.Decision{Allowed: false, Reason: reason, Blockers: []decision.Blocker{}, Unverified: []decision.Unverified{},
		Messages: []string{msg}, Warnings: []string{}}
}

// parameters are the effective parameters for a cluster route, converted
// once per route and set of synced kinds.
func (g *Guard) parameters(cluster string) (decision.Parameters, error) {
	var ns, name string
	if cluster != "" {
		var ok bool
		ns, name, ok = strings.Cut(cluster, "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			return decision.Parameters{}, fmt.Errorf("cluster %q: want NAMESPACE/NAME", cluster)
		}
	}
	var machines, pools []schema.GroupVersionKind
	if g.opts.SyncedKinds != nil {
		machines, pools = g.opts.SyncedKinds()
	}
	kinds := fmt.Sprint(machines, pools)
	g.mu.Lock()
	r, ok := g.routes[cluster]
	g.mu.Unlock()
	if ok && r.kinds == kinds {
		return r.params, nil
	}
	params := g.scoped(ns, name, machines, pools)
	converted, err := decision.NewParameters(params)
	if err != nil {
		return decision.Parameters{}, err
	}
	g.mu.Lock()
	if _, known := g.routes[cluster]; known || len(g.routes) < maxRoutes {
		g.routes[cluster] = route{kinds: kinds, params: converted}
	}
	g.mu.Unlock()
	return converted, nil
}

// ScopedParameters are the effective parameters the rule reads for a cluster
// route ("namespace/name", or "" for all): defaults, the Constraint's, the
// synced kinds and the cluster scope. The orphan criteria take the same.
func (g *Guard) ScopedParameters(cluster string) (map[string]any, error) {
	var ns, name string
	if cluster != "" {
		var ok bool
		ns, name, ok = strings.Cut(cluster, "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			return nil, fmt.Errorf("cluster %q: want NAMESPACE/NAME", cluster)
		}
	}
	var machines, pools []schema.GroupVersionKind
	if g.opts.SyncedKinds != nil {
		machines, pools = g.opts.SyncedKinds()
	}
	return g.scoped(ns, name, machines, pools), nil
}

func (g *Guard) scoped(ns, name string, machines, pools []schema.GroupVersionKind) map[string]any {
	params := g.Parameters()
	if name != "" {
		params["clusterNamespace"], params["clusterName"] = ns, name
	}
	if g.opts.SyncedKinds != nil {
		params["infraMachineKinds"], params["infraMachinePoolKinds"] = kindList(machines), kindList(pools)
	}
	return params
}

// Objects returns what the rule would read for node: the candidates the
// indexes pick, re-read from the API server when fresh is set and the Guard
// has fresh reads (a periodic scan can do without; an action should not).
// It fails while the inventory is not synced: an empty cache proves nothing.
func (g *Guard) Objects(ctx context.Context, node *unstructured.Unstructured, fresh bool) ([]*unstructured.Unstructured, error) {
	if g.opts.Ready != nil {
		if err := g.opts.Ready(); err != nil {
			return nil, fmt.Errorf("inventory not ready: %w", err)
		}
	}
	objs, refs := g.inv.Candidates(node)
	if !fresh || g.opts.Fresh == nil {
		return objs, nil
	}
	read, err := g.refresh(ctx, objs, refs)
	if err != nil {
		return nil, fmt.Errorf("fresh reads for Node %q: %w", node.GetName(), err)
	}
	return read, nil
}

func kindList(gvks []schema.GroupVersionKind) []any {
	out := make([]any, 0, len(gvks))
	for _, g := range gvks {
		out = append(out, map[string]any{"group": g.Group, "kind": g.Kind})
	}
	return out
}

// refresh replaces each candidate with what the API server says now, drops
// the ones that are gone, and reads what the cache lacks: the objects the
// Machines reference, and the Machine the Node names (with what it
// references). Neither a stale "gone" nor a stale "present" decides.
func (g *Guard) refresh(ctx context.Context, objs []*unstructured.Unstructured, refs []inventory.Ref) ([]*unstructured.Unstructured, error) {
	ctx, cancel := context.WithTimeout(ctx, g.opts.FreshTimeout)
	defer cancel()
	// Kinds the inventory watches, with their roles, looked up once rather
	// than per ref.
	watched := map[schema.GroupKind]watchedKind{}
	for _, role := range linkmodel.Roles() {
		for _, gvk := range g.inv.Kinds(role) {
			if _, ok := watched[gvk.GroupKind()]; !ok {
				watched[gvk.GroupKind()] = watchedKind{gvk: gvk, role: role}
			}
		}
	}
	have := map[inventory.Ref]bool{}
	// The candidates at the version they were cached at, and the refs at the
	// version their kind is watched at (a kind not watched is not read: an
	// InfraMachine of it stays unverified, and the rule denies).
	var wave []inventory.Ref
	var roles []inventory.Role
	for _, o := range objs {
		ref := inventory.Ref{GVK: o.GroupVersionKind(), Namespace: o.GetNamespace(), Name: o.GetName()}
		w, ok := watched[ref.GVK.GroupKind()]
		if ok && !have[unversioned(ref)] {
			have[unversioned(ref)] = true
			wave, roles = append(wave, ref), append(roles, w.role)
		}
	}
	var out []*unstructured.Unstructured
	// Each wave is read concurrently, so a decision costs one API round trip
	// per hop (candidates, then the InfraMachines fresh Machines name), not
	// one per object.
	for len(wave) > 0 || len(refs) > 0 {
		for _, ref := range refs {
			if have[unversioned(ref)] {
				continue
			}
			have[unversioned(ref)] = true
			if w, ok := watched[ref.GVK.GroupKind()]; ok {
				ref.GVK = w.gvk
				wave, roles = append(wave, ref), append(roles, w.role)
			}
		}
		refs = nil
		fresh, err := g.readAll(ctx, wave)
		if err != nil {
			return nil, err
		}
		wave = nil
		for i, obj := range fresh {
			if obj == nil {
				continue
			}
			// Kept as the informers keep it: the rule sees one shape whichever
			// way an object came, and a full object (managed fields and all)
			// would only make the input larger to convert.
			rec := g.inv.Record(obj, roles[i])
			out = append(out, rec.Unstructured())
			if infra, ok := g.inv.ReferenceOf(rec); ok {
				refs = append(refs, infra)
			}
		}
		roles = nil
	}
	return out, nil
}

type watchedKind struct {
	gvk  schema.GroupVersionKind
	role inventory.Role
}

// maxParallelReads bounds the concurrent GETs of one decision: a Node has a
// few candidates, and one with many must not flood the API server.
const maxParallelReads = 8

// readAll reads refs concurrently; an object that does not exist is nil.
func (g *Guard) readAll(ctx context.Context, refs []inventory.Ref) ([]*unstructured.Unstructured, error) {
	out := make([]*unstructured.Unstructured, len(refs))
	eg, ctx := errgroup.WithContext(ctx)
	eg.SetLimit(maxParallelReads)
	for i, ref := range refs {
		eg.Go(func() error {
			fresh, err := g.opts.Fresh.Get(ctx, ref.GVK, ref.Namespace, ref.Name)
			if err != nil {
				return fmt.Errorf("get %s %s/%s: %w", ref.GVK.Kind, ref.Namespace, ref.Name, err)
			}
			out[i] = fresh
			return nil
		})
	}
	return out, eg.Wait()
}

func unversioned(r inventory.Ref) inventory.Ref {
	r.GVK.Version = ""
	return r
}

// DeleteReview is the AdmissionRequest-shaped review of a Node delete, as the
// rule reads it.
func DeleteReview(node *unstructured.Unstructured, user authenticationv1.UserInfo) map[string]any {
	groups := make([]any, 0, len(user.Groups))
	for _, g := range user.Groups {
		groups = append(groups, g)
	}
	return map[string]any{
		"operation": "DELETE",
		"kind":      map[string]any{"group": "", "version": "v1", "kind": "Node"},
		"name":      node.GetName(),
		"oldObject": node.Object,
		"userInfo":  map[string]any{"username": user.Username, "groups": groups},
	}
}
