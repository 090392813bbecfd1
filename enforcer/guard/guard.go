// This file is nodeguard's library API: Decide says whether a Node may be
// deleted, from an inventory of Machines and InfraMachines, optionally
// re-reading the few candidate objects from the API server first.

package guard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/record"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// Request is one admission request to judge, as the rule reads it. Its zero
// Operation and Kind stand for a DELETE of a core v1 Node, what the library's
// and `nodeguard check`'s callers ask; the webhook passes the
// AdmissionRequest's own, and the rule decides what it judges.
type Request struct {
	Operation string
	Kind      metav1.GroupVersionKind
	// Name is the request's object name; empty means Node's.
	Name string
	// Node is the object being deleted (an AdmissionRequest's oldObject);
	// nil when the request carries none, which the rule denies for a Node
	// delete: it cannot tell what is linked to a Node it does not see.
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
	// Recovering, when set, returns an error while a cache of the inventory
	// may miss objects (its watch broke and it has not caught up): it cannot
	// prove an absence then, so a decision that found nothing linked is a
	// denial, and Objects fails.
	Recovering func() error
	// Holds, when set, returns an error for a cluster route ("" for none)
	// whose objects the inventory cannot prove it holds whole (a
	// watch-filter install: facts.Shard): a decision that found nothing
	// linked is then a denial, and the orphan criteria judge nothing there.
	Holds func(cluster string) error
	// Fresh, when set, re-reads every candidate before deciding.
	Fresh FreshReader
	// FreshTimeout bounds all fresh reads of one decision (default 2s).
	FreshTimeout time.Duration
	// Engine runs the policy (required): the embedded rule or a bundle's,
	// chosen once by the caller (rule.LoadEngine).
	Engine *rule.Engine
}

// Guard decides Node deletes; it is safe for concurrent use.
type Guard struct {
	engine *rule.Engine
	inv    *facts.Inventory
	opts   Options
	// set is the parameters in force; SetParameters swaps it whole, so a
	// decision reads one set from start to end.
	set atomic.Pointer[paramSet]

	// Converted parameters per cluster route, with the synced kinds and the
	// set they were built from: converting them is a fair share of a
	// decision's cost.
	mu     sync.Mutex
	routes map[string]route
}

// paramSet is one version of the effective parameters.
type paramSet struct {
	params map[string]any
	// groups are the groups of a user the rule can read: those the group
	// parameters list (rule.Model.Groups); nil for all.
	groups map[string]bool
}

type route struct {
	kinds  string
	set    *paramSet
	params rule.Parameters
}

// maxRoutes bounds the converted parameters kept; a caller naming ever new
// clusters then pays the conversion each time instead of growing memory.
const maxRoutes = 1024

// New prepares the rule once.
func New(ctx context.Context, inv *facts.Inventory, opts Options) (*Guard, error) {
	if opts.Engine == nil {
		return nil, errors.New("guard: no policy engine: the caller chooses the policy (rule.LoadEngine)")
	}
	opts.FreshTimeout = cmp.Or(opts.FreshTimeout, 2*time.Second)
	g := &Guard{engine: opts.Engine, inv: inv, opts: opts, routes: map[string]route{}}
	if err := g.SetParameters(opts.Parameters); err != nil {
		return nil, err
	}
	return g, nil
}

// SetParameters replaces the Constraint's parameters (nil: the rule's
// defaults) for every decision from now on: a live Constraint edit. They are
// converted first, so parameters the rule cannot take change nothing.
func (g *Guard) SetParameters(constraint map[string]any) error {
	params := g.engine.DefaultParameters()
	maps.Copy(params, constraint)
	if _, err := rule.NewParameters(params); err != nil {
		return err
	}
	g.set.Store(&paramSet{params: params, groups: g.inv.Model().Groups(params)})
	g.mu.Lock()
	clear(g.routes)
	g.mu.Unlock()
	return nil
}

// KeepGroup says whether the rule reads group of a requesting user: only
// groups some group parameter lists matter to it (the policy declares which
// parameters those are; all groups when one is not a list). The webhook keeps
// no other group of a review.
func (g *Guard) KeepGroup(group string) bool {
	groups := g.set.Load().groups
	return groups == nil || groups[group]
}

// user keeps what the rule reads of the requesting user: the username, and
// of the groups only those KeepGroup keeps, the one thing the rule asks of
// them. A forged review with ~100,000 groups would otherwise cost ~17 MB of
// rule input; the decision is the same either way.
func (g *Guard) user(u authenticationv1.UserInfo) authenticationv1.UserInfo {
	groups := g.set.Load().groups
	if groups == nil {
		return u
	}
	kept := slices.DeleteFunc(slices.Clone(u.Groups), func(group string) bool { return !groups[group] })
	return authenticationv1.UserInfo{Username: u.Username, Groups: kept}
}

// Parameters returns the effective parameters (defaults merged with the
// Constraint's), before synced kinds and cluster scope are applied.
func (g *Guard) Parameters() map[string]any {
	return maps.Clone(g.set.Load().params)
}

// Decide judges req with the rule: the candidates linked to req.Node (none
// without a Node), re-read when the Guard has fresh reads. An error means no
// decision could be made (bad cluster, rule failure); callers must then deny.
// The decision carries the input it was made on (Decision.Input), for a
// decision log.
func (g *Guard) Decide(ctx context.Context, req Request) (rule.Decision, error) {
	d, input, err := g.decide(ctx, req)
	d.Input = input
	return d, err
}

// Policy is the policy the guard's decisions are made with.
func (g *Guard) Policy() rule.Policy { return g.engine.Policy() }

// decide is Decide, with the input the decision was made on (the review
// alone when nodeguard could not ask the rule).
func (g *Guard) decide(ctx context.Context, req Request) (rule.Decision, any, error) {
	if err := g.Ready(); err != nil {
		return rule.Denial(rule.ReasonNotReady, fmt.Sprintf("Node %q cannot be deleted yet: nodeguard is not ready (%v), "+
			"so it cannot tell whether an InfraMachine is linked to it; retry once nodeguard reports ready.",
			req.name(), err)), reviewOnly(req), nil
	}
	params, err := g.RouteParameters(req.Cluster)
	if err != nil {
		return rule.Decision{}, nil, err
	}
	var objs []*unstructured.Unstructured
	seen := req
	seen.UserInfo = g.user(req.UserInfo)
	if req.Node != nil {
		seen.Node = g.inv.Model().NodeShape().FromUnstructured(req.Node).Unstructured()
		if objs, err = g.read(ctx, req.Node, true); err != nil {
			return rule.Denial(rule.ReasonFreshReadFailed, fmt.Sprintf("Node %q cannot be deleted right now: nodeguard could not re-read the "+
				"objects linked to it from the API server (%v), so it cannot prove their hosts are gone; retry shortly.",
				req.name(), err)), reviewOnly(seen), nil
		}
	}
	in := rule.Input{Review: seen.Review(), Inventory: facts.Layout(objs), Parameters: params}
	d, err := rule.Evaluate(ctx, g.engine, in)
	if err != nil || d.Reason != rule.ReasonNoLink {
		return d, in, err
	}
	// Nothing linked was found, which a cache catching up cannot prove.
	if rerr := g.Recovering(); rerr != nil {
		return rule.Denial(rule.ReasonCacheRecovering, fmt.Sprintf("Node %q cannot be deleted right now: %v, so nodeguard cannot "+
			"prove nothing links to the Node; this passes within seconds of the API server answering again, retry.", req.name(), rerr)), in, nil
	}
	// Nor can caches that hold only part of the Cluster.
	if herr := g.Holds(req.Cluster); herr != nil {
		return rule.Denial(rule.ReasonNotHeld, fmt.Sprintf("Node %q cannot be deleted right now: %v. Nothing linked was found, "+
			"which proves nothing while the Cluster's objects are not all here; retry once the Cluster's objects all carry one "+
			"watch-filter value.", req.name(), herr)), in, nil
	}
	return d, in, nil
}

// Holds returns nil when the inventory holds every object of cluster
// ("namespace/name", "" for none) that could link to its Nodes.
func (g *Guard) Holds(cluster string) error {
	if g.opts.Holds == nil {
		return nil
	}
	return g.opts.Holds(cluster)
}

func reviewOnly(req Request) map[string]any { return map[string]any{"review": req.Review()} }

// Ready returns an error while the inventory is not synced (nil when the
// Guard has no readiness to wait for).
func (g *Guard) Ready() error {
	if g.opts.Ready == nil {
		return nil
	}
	return g.opts.Ready()
}

// Recovering returns an error while a cache of the inventory may miss
// objects after its watch broke (nil when none is, or the Guard has no such
// caches).
func (g *Guard) Recovering() error {
	if g.opts.Recovering == nil {
		return nil
	}
	return g.opts.Recovering()
}

// Model returns the link model the guard follows (its inventory's).
func (g *Guard) Model() *rule.Model { return g.inv.Model() }

// RouteParameters are the parameters the rule reads for a cluster route
// ("namespace/name", or "" for all): defaults, the Constraint's, the synced
// kinds and the cluster scope; converted once per route and set of synced
// kinds. Decisions, the orphan criteria and Gatekeeper (through the
// provider, Parameters.Map) all take these.
func (g *Guard) RouteParameters(cluster string) (rule.Parameters, error) {
	var ns, name string
	if cluster != "" {
		var err error
		if ns, name, err = record.SplitKey("cluster", cluster); err != nil {
			return rule.Parameters{}, err
		}
	}
	var machines, pools []schema.GroupVersionKind
	if g.opts.SyncedKinds != nil {
		machines, pools = g.opts.SyncedKinds()
	}
	kinds := fmt.Sprint(machines, pools)
	set := g.set.Load()
	g.mu.Lock()
	r, ok := g.routes[cluster]
	g.mu.Unlock()
	if ok && r.kinds == kinds && r.set == set {
		return r.params, nil
	}
	params := maps.Clone(set.params)
	if name != "" {
		params["clusterNamespace"], params["clusterName"] = ns, name
	}
	if g.opts.SyncedKinds != nil {
		params["infraMachineKinds"], params["infraMachinePoolKinds"] = kindList(machines), kindList(pools)
	}
	converted, err := rule.NewParameters(params)
	if err != nil {
		return rule.Parameters{}, err
	}
	g.mu.Lock()
	if _, known := g.routes[cluster]; known || len(g.routes) < maxRoutes {
		g.routes[cluster] = route{kinds: kinds, set: set, params: converted}
	}
	g.mu.Unlock()
	return converted, nil
}

// Engine runs the policy the guard decides with; the orphan criteria run on
// it too, so both always follow one policy (a bundle and its reloads included).
func (g *Guard) Engine() *rule.Engine { return g.engine }

// Objects returns what the rule would read for node: the candidates the
// indexes pick, re-read from the API server when fresh is set and the Guard
// has fresh reads (a periodic scan can do without; an action should not).
// It fails while the inventory is not synced or a cache is recovering: a
// cache that may miss objects proves nothing by what it lacks.
func (g *Guard) Objects(ctx context.Context, node *unstructured.Unstructured, fresh bool) ([]*unstructured.Unstructured, error) {
	if err := g.Ready(); err != nil {
		return nil, fmt.Errorf("inventory not ready: %w", err)
	}
	if err := g.Recovering(); err != nil {
		return nil, err
	}
	objs, err := g.read(ctx, node, fresh)
	if err != nil {
		return nil, fmt.Errorf("fresh reads for Node %q: %w", node.GetName(), err)
	}
	return objs, nil
}

// read returns the candidates the indexes pick for node, re-read from the
// API server when fresh is set and the Guard has fresh reads: what the rule
// reads of the inventory, for Decide and Objects alike.
func (g *Guard) read(ctx context.Context, node *unstructured.Unstructured, fresh bool) ([]*unstructured.Unstructured, error) {
	objs, refs := g.inv.Candidates(node)
	if !fresh || g.opts.Fresh == nil {
		return objs, nil
	}
	return g.refresh(ctx, objs, refs)
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
func (g *Guard) refresh(ctx context.Context, objs []*unstructured.Unstructured, refs []facts.Ref) ([]*unstructured.Unstructured, error) {
	ctx, cancel := context.WithTimeout(ctx, g.opts.FreshTimeout)
	defer cancel()
	// Kinds the inventory watches, with their roles, looked up once rather
	// than per ref.
	watched := map[schema.GroupKind]watchedKind{}
	for _, role := range rule.Roles() {
		for _, gvk := range g.inv.Kinds(role) {
			if _, ok := watched[gvk.GroupKind()]; !ok {
				watched[gvk.GroupKind()] = watchedKind{gvk: gvk, role: role}
			}
		}
	}
	have := map[facts.Ref]bool{}
	// The candidates at the version they were cached at, and the refs at the
	// version their kind is watched at (a kind not watched is not read: an
	// InfraMachine of it stays unverified, and the rule denies).
	var wave []facts.Ref
	var roles []facts.Role
	for _, o := range objs {
		ref := facts.Ref{GVK: o.GroupVersionKind(), Namespace: o.GetNamespace(), Name: o.GetName()}
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
	role facts.Role
}

// maxParallelReads bounds the concurrent GETs of one decision: a Node has a
// few candidates, and one with many must not flood the API server.
const maxParallelReads = 8

// readAll reads refs concurrently; an object that does not exist is nil.
func (g *Guard) readAll(ctx context.Context, refs []facts.Ref) ([]*unstructured.Unstructured, error) {
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

func unversioned(r facts.Ref) facts.Ref {
	r.GVK.Version = ""
	return r
}

// Review is the AdmissionRequest-shaped review the rule reads of r: its
// operation, kind and name, the Node as oldObject (none when Node is nil),
// and the user.
func (r Request) Review() map[string]any {
	groups := make([]any, 0, len(r.UserInfo.Groups))
	for _, g := range r.UserInfo.Groups {
		groups = append(groups, g)
	}
	op, kind := r.Operation, r.Kind
	if op == "" && kind == (metav1.GroupVersionKind{}) {
		op, kind = "DELETE", metav1.GroupVersionKind{Version: "v1", Kind: "Node"}
	}
	review := map[string]any{
		"operation": op,
		"kind":      map[string]any{"group": kind.Group, "version": kind.Version, "kind": kind.Kind},
		"name":      r.name(),
		"userInfo":  map[string]any{"username": r.UserInfo.Username, "groups": groups},
	}
	if r.Node != nil {
		review["oldObject"] = r.Node.Object
	}
	return review
}

// name is the name of the object the request is about.
func (r Request) name() string {
	if r.Name == "" && r.Node != nil {
		return r.Node.GetName()
	}
	return r.Name
}
