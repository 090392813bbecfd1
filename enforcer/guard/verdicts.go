// This file finds orphan Nodes: Nodes Cluster API left behind once
// their InfraMachine was gone. The criteria are Rego (policies/nodeguard/
// orphans, entry points data.nodeguard.orphan and data.nodeguard.
// orphan_screen), run by the engine the Guard decides with; this file
// picks what the criteria read for each Node, through that Guard (indexes,
// fresh reads, parameters), and evaluates them.

package guard

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// NodeGVR is the resource of core Nodes.
var NodeGVR = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}

// OrphanVerdict is the criteria's answer for one Node.
type OrphanVerdict struct {
	Node          string   `json:"node"`
	Orphan        bool     `json:"orphan"`
	Managed       bool     `json:"managed"`
	Cluster       string   `json:"cluster"`
	Machine       string   `json:"machine"`
	NotReadySince string   `json:"notReadySince"`
	Reason        string   `json:"reason"`
	Kept          []string `json:"kept"`

	// The Node judged, for delete preconditions.
	UID             types.UID `json:"-"`
	ResourceVersion string    `json:"-"`
}

// Screen is the answer of the criteria that read only the Node: whether it
// passes them (else it is no orphan, whatever the inventory holds), and when
// that may change with the clock alone (zero: not until the Node changes).
type Screen struct {
	Passes    bool
	RecheckAt time.Time
}

// CriteriaInput is what the orphan criteria read for one Node.
type CriteriaInput struct {
	Node            map[string]any
	Inventory       map[string]any
	Parameters      rule.Parameters
	Now             time.Time
	Grace           time.Duration
	MatchProviderID bool
	// Tombstone is the one of the Node's providerID, if any: a ghost is
	// never an orphan.
	Tombstone *facts.Tombstone
}

// Fields are the entry points' input; a nil inventory, parameters or
// tombstone is left out, which the Rego reads as empty.
func (in CriteriaInput) Fields() map[string]any {
	var tombstone map[string]any
	if in.Tombstone != nil {
		tombstone = in.Tombstone.Value()
	}
	return map[string]any{
		"node": in.Node, "inventory": in.Inventory, "parameters": in.Parameters, "tombstone": tombstone,
		// Nanoseconds, so a grace that ends within a second is judged then.
		"now": in.Now.UTC().Format(time.RFC3339Nano), "grace": in.Grace.String(), "matchProviderID": in.MatchProviderID,
	}
}

// FinderOptions configure a Finder.
type FinderOptions struct {
	// Guard supplies the objects the rule reads for a Node (indexes, fresh
	// reads), the effective parameters, and the policy; required.
	Guard *Guard
	// Inventory is the Guard's inventory, scanned for evidence of which
	// providerID schemes the synced InfraMachines use; required.
	Inventory *facts.Inventory
	// Evidence, when set, is that evidence kept up to date by the caller
	// (Evidence.Update on every InfraMachine change) instead of a walk of
	// the inventory per call.
	Evidence *Evidence
	// Grace: how long a Node must have been not Ready (0: the policy's
	// default_grace, which a policy with orphan criteria must declare).
	Grace time.Duration
	// MatchProviderID turns on the opt-in wider match (#7237, metal3 #890).
	MatchProviderID bool
	// Tombstones, when set, are the providerIDs whose Machine, InfraMachine
	// or pool membership went away: the ghost criteria read them, and the
	// orphan criteria keep a ghost.
	Tombstones *facts.Tombstones
}

// Finder judges Nodes against the orphan, release and ghost criteria.
type Finder struct {
	engine *rule.Engine
	opts   FinderOptions
}

// NewFinder judges with the Guard's policy.
func NewFinder(opts FinderOptions) (*Finder, error) {
	if opts.Guard == nil {
		return nil, fmt.Errorf("orphans: a Guard is required")
	}
	if opts.Inventory == nil {
		return nil, fmt.Errorf("orphans: the inventory is required")
	}
	if opts.Grace < 0 {
		return nil, fmt.Errorf("orphans: grace %s: want a positive duration, or 0 for the policy's", opts.Grace)
	}
	// A policy without the orphan criteria (a bundle of an older release)
	// is refused here, not per Node.
	if _, err := opts.Guard.Engine().NodeFields(); err != nil {
		return nil, err
	}
	return &Finder{engine: opts.Guard.Engine(), opts: opts}, nil
}

// Inventory is the inventory the Finder judges from.
func (f *Finder) Inventory() *facts.Inventory { return f.opts.Inventory }

// Grace is the grace period the Finder judges with.
// With none given it is the policy's default_grace, read at each call so a
// reloaded bundle that changes it is followed.
func (f *Finder) Grace() time.Duration {
	return cmp.Or(f.opts.Grace, f.opts.Guard.Engine().DefaultGrace())
}

// Judge evaluates the criteria for each Node at time now, re-reading what
// they read from the API server when the Guard has fresh reads; cluster
// ("namespace/name", or "" for all) scopes the Machines and InfraMachines
// that count, as the webhook's /validate/clusters route does. An error means
// no verdict at all: callers must then act on none.
func (f *Finder) Judge(ctx context.Context, nodes []*unstructured.Unstructured, cluster string, now time.Time) ([]OrphanVerdict, error) {
	return f.judge(ctx, nodes, cluster, now, true)
}

// Scan is Judge from the informer caches alone: for Nodes judged without
// acting on them. Act only on what Judge confirms.
func (f *Finder) Scan(ctx context.Context, nodes []*unstructured.Unstructured, cluster string, now time.Time) ([]OrphanVerdict, error) {
	return f.judge(ctx, nodes, cluster, now, false)
}

// Route is one cluster route's parameters, converted: for judging many
// Nodes of one route without converting them per Node.
type Route struct {
	cluster string
	params  rule.Parameters
}

// Route returns the parameters of a cluster route ("namespace/name", or ""
// for all), as they are now (they change with the synced kinds).
func (f *Finder) Route(cluster string) (Route, error) {
	// What caches hold only in part proves no absence: no orphan, no
	// release, no ghost there.
	if err := f.opts.Guard.Holds(cluster); err != nil {
		return Route{}, err
	}
	params, err := f.opts.Guard.RouteParameters(cluster)
	if err != nil {
		return Route{}, err
	}
	return Route{cluster: cluster, params: params}, nil
}

// input is what the criteria read of node with inv, on the route's
// parameters at time now.
func (f *Finder) input(r Route, node *unstructured.Unstructured, inv map[string]any, now time.Time) map[string]any {
	return CriteriaInput{Node: node.Object, Inventory: inv, Parameters: r.params, Now: now, Grace: f.Grace(), MatchProviderID: f.opts.MatchProviderID,
		Tombstone: f.Tombstone(node)}.Fields()
}

// Tombstone returns the tombstone of node's providerID, or nil: the Rego
// reads a Node without one as no ghost, so nothing else is looked up.
func (f *Finder) Tombstone(node *unstructured.Unstructured) *facts.Tombstone {
	if f.opts.Tombstones == nil {
		return nil
	}
	pid, _, _ := unstructured.NestedString(node.Object, f.opts.Guard.Engine().Model().NodeProviderID...)
	t, ok := f.opts.Tombstones.Get(pid)
	if !ok {
		return nil
	}
	return &t
}

// Screen evaluates the criteria that read only the Node: a Node that does
// not pass them is no orphan, whatever Scan would find.
func (f *Finder) Screen(ctx context.Context, r Route, node *unstructured.Unstructured, now time.Time) (Screen, error) {
	answer, err := rule.Run[struct {
		Passes    bool   `json:"passes"`
		RecheckAt string `json:"recheckAt"`
	}](ctx, f.engine, rule.ScreenEntry, f.input(r, node, nil, now))
	if err != nil {
		return Screen{}, fmt.Errorf("screen Node %q: %w", node.GetName(), err)
	}
	s := Screen{Passes: answer.Passes}
	if answer.RecheckAt != "" {
		if s.RecheckAt, err = time.Parse(time.RFC3339Nano, answer.RecheckAt); err != nil {
			return Screen{}, fmt.Errorf("screen Node %q: recheckAt %q: %w", node.GetName(), answer.RecheckAt, err)
		}
	}
	return s, nil
}

func (f *Finder) judge(ctx context.Context, nodes []*unstructured.Unstructured, cluster string, now time.Time, fresh bool) ([]OrphanVerdict, error) {
	r, err := f.Route(cluster)
	if err != nil {
		return nil, err
	}
	e := f.opts.Evidence
	if e == nil {
		e = EvidenceOf(f.opts.Inventory)
	}
	evidence := e.ObjectsFor(cluster)
	out := make([]OrphanVerdict, 0, len(nodes))
	for _, node := range nodes {
		objs, err := f.opts.Guard.Objects(ctx, node, fresh)
		if err != nil {
			return nil, err
		}
		objs = append(objs, evidence...)
		v, err := rule.Run[OrphanVerdict](ctx, f.engine, rule.OrphanEntry, f.input(r, node, facts.Layout(objs), now))
		if err != nil {
			return nil, fmt.Errorf("judge Node %q: %w", node.GetName(), err)
		}
		v.UID, v.ResourceVersion = node.GetUID(), node.GetResourceVersion()
		out = append(out, v)
	}
	return out, nil
}

// Release says whether the rule lets anyone delete a Node (policies/nodeguard/
// released), for a workload cluster in mode admission-policy.
type Release struct {
	Released bool   `json:"released"`
	Blocker  string `json:"blocker"`
	// The Node judged: a release holds for this UID only.
	UID types.UID `json:"-"`
}

// Releases judges each Node's release on cluster's route, from the caches,
// or with fresh from fresh reads of everything the rule reads for it (when
// the Guard has fresh reads): release only what fresh reads confirm. An
// error means no verdict at all.
func (f *Finder) Releases(ctx context.Context, nodes []*unstructured.Unstructured, cluster string, fresh bool) ([]Release, error) {
	r, err := f.Route(cluster)
	if err != nil {
		return nil, err
	}
	out := make([]Release, 0, len(nodes))
	for _, node := range nodes {
		objs, err := f.opts.Guard.Objects(ctx, node, fresh)
		if err != nil {
			return nil, err
		}
		v, err := rule.Run[Release](ctx, f.engine, rule.ReleaseEntry, map[string]any{"node": node.Object, "inventory": facts.Layout(objs), "parameters": r.params})
		if err != nil {
			return nil, fmt.Errorf("judge the release of Node %q: %w", node.GetName(), err)
		}
		v.UID = node.GetUID()
		out = append(out, v)
	}
	return out, nil
}

// Ghost is the ghost criteria's answer for one Node (policies/nodeguard/
// ghosts, data.nodeguard.ghost).
type Ghost struct {
	Node       string   `json:"node"`
	ProviderID string   `json:"providerID"`
	Ghost      bool     `json:"ghost"`
	Kept       []string `json:"kept"`
	Reason     string   `json:"reason"`

	// The Node judged, and the tombstone it was judged with.
	UID       types.UID        `json:"-"`
	Tombstone *facts.Tombstone `json:"-"`
}

// Ghost judges whether node is a ghost on route r at time now, from the
// caches or, with fresh, from fresh reads. A Node whose providerID has no
// tombstone is no ghost (the criteria's first), and costs no evaluation.
func (f *Finder) Ghost(ctx context.Context, r Route, node *unstructured.Unstructured, now time.Time, fresh bool) (Ghost, error) {
	t := f.Tombstone(node)
	if t == nil {
		return Ghost{Node: node.GetName(), UID: node.GetUID()}, nil
	}
	objs, err := f.opts.Guard.Objects(ctx, node, fresh)
	if err != nil {
		return Ghost{}, err
	}
	g, err := rule.Run[Ghost](ctx, f.engine, rule.GhostEntry, map[string]any{"node": node.Object, "inventory": facts.Layout(objs), "parameters": r.params,
		"tombstone": t.Value(), "now": now.UTC().Format(time.RFC3339Nano)})
	if err != nil {
		return Ghost{}, fmt.Errorf("judge whether Node %q is a ghost: %w", node.GetName(), err)
	}
	g.UID, g.Tombstone = node.GetUID(), t
	return g, nil
}

// Registration is the ghost criteria's answer for a Node CREATE or UPDATE
// (data.nodeguard.registration): whether it may register, and the message
// when not.
type Registration struct {
	Allowed   bool   `json:"allowed"`
	Registers bool   `json:"registers"`
	Message   string `json:"message"`
}

// Registration judges a Node CREATE or UPDATE (old: the Node before an
// UPDATE, else nil) on cluster's route ("namespace/name", or "" for all) at
// time now, on fresh reads: a registration is denied only when nothing
// links the Node now. Without a tombstone for its providerID it is allowed
// without an evaluation.
func (f *Finder) Registration(ctx context.Context, cluster, operation string, node, old *unstructured.Unstructured, now time.Time) (Registration, error) {
	t := f.Tombstone(node)
	if t == nil {
		return Registration{Allowed: true}, nil
	}
	r, err := f.Route(cluster)
	if err != nil {
		return Registration{}, err
	}
	objs, err := f.opts.Guard.Objects(ctx, node, true)
	if err != nil {
		return Registration{}, err
	}
	var oldNode map[string]any
	if old != nil {
		oldNode = old.Object
	}
	out, err := rule.Run[Registration](ctx, f.engine, rule.RegistrationEntry, map[string]any{"operation": operation, "node": node.Object, "oldNode": oldNode,
		"inventory": facts.Layout(objs), "parameters": r.params, "tombstone": t.Value(), "now": now.UTC().Format(time.RFC3339Nano)})
	if err != nil {
		return Registration{}, fmt.Errorf("judge the registration of Node %q: %w", node.GetName(), err)
	}
	return out, nil
}
