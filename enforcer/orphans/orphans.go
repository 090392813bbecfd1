// Package orphans finds orphan Nodes: Nodes Cluster API left behind once
// their InfraMachine was gone. The criteria are Rego (policies/nodeguard/
// orphans, entry points data.nodeguard.orphan and data.nodeguard.
// orphan_screen), prepared on the very policy the Guard decides with; this
// package picks what the criteria read for each Node, through that Guard
// (indexes, fresh reads, parameters), and evaluates them.
package orphans

import (
	"context"
	"fmt"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodeguard/nodeguard/enforcer/decision"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/inventory"
)

// DefaultGrace is how long a Node must have been not Ready (the Rego's
// default_grace; a test keeps them equal).
const DefaultGrace = 5 * time.Minute

// Verdict is the criteria's answer for one Node.
type Verdict struct {
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

// Evaluator evaluates the orphan criteria of a decision.Evaluator's policy;
// safe for concurrent use, and it follows the policy's Replace.
type Evaluator struct {
	policy *decision.Evaluator
}

// NewEvaluator compiles the embedded policies.
func NewEvaluator(ctx context.Context) (*Evaluator, error) {
	d, err := decision.NewEvaluator(ctx)
	if err != nil {
		return nil, err
	}
	return EvaluatorFor(d)
}

// EvaluatorFor evaluates the orphan criteria of policy, which must have them.
func EvaluatorFor(policy *decision.Evaluator) (*Evaluator, error) {
	if _, err := policy.Orphans(); err != nil {
		return nil, err
	}
	return &Evaluator{policy: policy}, nil
}

// Input is what the criteria read for one Node.
type Input struct {
	Node            map[string]any
	Inventory       map[string]any
	Parameters      map[string]any
	Now             time.Time
	Grace           time.Duration
	MatchProviderID bool
}

// Evaluate runs the criteria on one input.
func (e *Evaluator) Evaluate(ctx context.Context, in Input) (Verdict, error) {
	v, err := in.value()
	if err != nil {
		return Verdict{}, err
	}
	return e.verdict(ctx, v)
}

// Screen runs the criteria that read only the Node (in.Inventory unused).
func (e *Evaluator) Screen(ctx context.Context, in Input) (Screen, error) {
	in.Inventory = nil
	v, err := in.value()
	if err != nil {
		return Screen{}, err
	}
	return e.screen(ctx, v)
}

func (in Input) value() (ast.Value, error) {
	var values [3]ast.Value
	for i, x := range []map[string]any{in.Node, in.Inventory, in.Parameters} {
		if x == nil {
			continue
		}
		v, err := ast.InterfaceToValue(x)
		if err != nil {
			return nil, fmt.Errorf("convert orphan input: %w", err)
		}
		values[i] = v
	}
	return input(values[0], values[1], values[2], in.Now, in.Grace, in.MatchProviderID), nil
}

// input assembles the entry points' input; a nil inventory or parameters is
// left out, which the Rego reads as empty.
func input(node, inv, params ast.Value, now time.Time, grace time.Duration, matchProviderID bool) ast.Value {
	obj := ast.NewObject(
		ast.Item(ast.StringTerm("node"), ast.NewTerm(node)),
		// Nanoseconds, so a grace that ends within a second is judged then.
		ast.Item(ast.StringTerm("now"), ast.StringTerm(now.UTC().Format(time.RFC3339Nano))),
		ast.Item(ast.StringTerm("grace"), ast.StringTerm(grace.String())),
		ast.Item(ast.StringTerm("matchProviderID"), ast.BooleanTerm(matchProviderID)),
	)
	if inv != nil {
		obj.Insert(ast.StringTerm("inventory"), ast.NewTerm(inv))
	}
	if params != nil {
		obj.Insert(ast.StringTerm("parameters"), ast.NewTerm(params))
	}
	return obj
}

func (e *Evaluator) verdict(ctx context.Context, in ast.Value) (Verdict, error) {
	m, err := e.policy.EvalOrphan(ctx, false, in)
	if err != nil {
		return Verdict{}, err
	}
	var v Verdict
	var ok [8]bool
	v.Node, ok[0] = m["node"].(string)
	v.Orphan, ok[1] = m["orphan"].(bool)
	v.Managed, ok[2] = m["managed"].(bool)
	v.Cluster, ok[3] = m["cluster"].(string)
	v.Machine, ok[4] = m["machine"].(string)
	v.NotReadySince, ok[5] = m["notReadySince"].(string)
	v.Reason, ok[6] = m["reason"].(string)
	v.Kept, ok[7] = stringList(m["kept"])
	for i, good := range ok {
		if !good {
			return Verdict{}, fmt.Errorf("evaluate %s: field %d of the verdict %v is missing or mistyped", decision.OrphanQuery, i, m)
		}
	}
	return v, nil
}

func (e *Evaluator) screen(ctx context.Context, in ast.Value) (Screen, error) {
	m, err := e.policy.EvalOrphan(ctx, true, in)
	if err != nil {
		return Screen{}, err
	}
	passes, ok := m["passes"].(bool)
	at, ok2 := m["recheckAt"].(string)
	if !ok || !ok2 {
		return Screen{}, fmt.Errorf("evaluate %s: want {passes, recheckAt}, got %v", decision.ScreenQuery, m)
	}
	s := Screen{Passes: passes}
	if at != "" {
		t, err := time.Parse(time.RFC3339Nano, at)
		if err != nil {
			return Screen{}, fmt.Errorf("evaluate %s: recheckAt %q: %w", decision.ScreenQuery, at, err)
		}
		s.RecheckAt = t
	}
	return s, nil
}

func stringList(x any) ([]string, bool) {
	list, ok := x.([]any)
	if !ok {
		return nil, false
	}
	out := make([]string, len(list))
	for i, item := range list {
		if out[i], ok = item.(string); !ok {
			return nil, false
		}
	}
	return out, true
}

// Options configure a Finder.
type Options struct {
	// Guard supplies the objects the rule reads for a Node (indexes, fresh
	// reads), the effective parameters, and the policy; required.
	Guard *guard.Guard
	// Inventory is the Guard's inventory, scanned for evidence of which
	// providerID schemes the synced InfraMachines use; required.
	Inventory *inventory.Inventory
	// Evidence, when set, is that evidence kept up to date by the caller
	// (Evidence.Update on every InfraMachine change) instead of a walk of
	// the inventory per call.
	Evidence *Evidence
	// Grace: how long a Node must have been not Ready (default DefaultGrace).
	Grace time.Duration
	// MatchProviderID turns on the opt-in wider match (#7237, metal3 #890).
	MatchProviderID bool
}

// Finder judges Nodes against the orphan criteria.
type Finder struct {
	eval *Evaluator
	opts Options
}

// NewFinder judges with the Guard's policy.
func NewFinder(opts Options) (*Finder, error) {
	if opts.Guard == nil {
		return nil, fmt.Errorf("orphans: a Guard is required")
	}
	if opts.Inventory == nil {
		return nil, fmt.Errorf("orphans: the inventory is required")
	}
	if opts.Grace == 0 {
		opts.Grace = DefaultGrace
	}
	eval, err := EvaluatorFor(opts.Guard.Evaluator())
	if err != nil {
		return nil, err
	}
	return &Finder{eval: eval, opts: opts}, nil
}

// Grace is the grace period the Finder judges with.
func (f *Finder) Grace() time.Duration { return f.opts.Grace }

// Judge evaluates the criteria for each Node at time now, re-reading what
// they read from the API server when the Guard has fresh reads; cluster
// ("namespace/name", or "" for all) scopes the Machines and InfraMachines
// that count, as the webhook's /validate/clusters route does. An error means
// no verdict at all: callers must then act on none.
func (f *Finder) Judge(ctx context.Context, nodes []*unstructured.Unstructured, cluster string, now time.Time) ([]Verdict, error) {
	return f.judge(ctx, nodes, cluster, now, true)
}

// Scan is Judge from the informer caches alone: for Nodes judged without
// acting on them. Act only on what Judge confirms.
func (f *Finder) Scan(ctx context.Context, nodes []*unstructured.Unstructured, cluster string, now time.Time) ([]Verdict, error) {
	return f.judge(ctx, nodes, cluster, now, false)
}

// Route is one cluster route's parameters, converted: for judging many
// Nodes of one route without converting them per Node.
type Route struct {
	cluster string
	params  decision.Parameters
}

// Route returns the parameters of a cluster route ("namespace/name", or ""
// for all), as they are now (they change with the synced kinds).
func (f *Finder) Route(cluster string) (Route, error) {
	params, err := f.opts.Guard.RouteParameters(cluster)
	if err != nil {
		return Route{}, err
	}
	return Route{cluster: cluster, params: params}, nil
}

// Screen evaluates the criteria that read only the Node: a Node that does
// not pass them is no orphan, whatever Scan would find.
func (f *Finder) Screen(ctx context.Context, r Route, node *unstructured.Unstructured, now time.Time) (Screen, error) {
	nv, err := ast.InterfaceToValue(node.Object)
	if err != nil {
		return Screen{}, fmt.Errorf("convert Node %q: %w", node.GetName(), err)
	}
	return f.eval.screen(ctx, input(nv, nil, r.params.Value(), now, f.opts.Grace, f.opts.MatchProviderID))
}

func (f *Finder) judge(ctx context.Context, nodes []*unstructured.Unstructured, cluster string, now time.Time, fresh bool) ([]Verdict, error) {
	params, err := f.opts.Guard.RouteParameters(cluster)
	if err != nil {
		return nil, err
	}
	var evidence []*unstructured.Unstructured
	if f.opts.Evidence != nil {
		evidence = f.opts.Evidence.Objects()
	} else {
		evidence = EvidenceOf(f.opts.Inventory).Objects()
	}
	out := make([]Verdict, 0, len(nodes))
	for _, node := range nodes {
		objs, err := f.opts.Guard.Objects(ctx, node, fresh)
		if err != nil {
			return nil, err
		}
		objs = append(objs, evidence...)
		nv, err := ast.InterfaceToValue(node.Object)
		if err != nil {
			return nil, fmt.Errorf("convert Node %q: %w", node.GetName(), err)
		}
		iv, err := ast.InterfaceToValue(inventory.Layout(objs))
		if err != nil {
			return nil, fmt.Errorf("convert the inventory of Node %q: %w", node.GetName(), err)
		}
		v, err := f.eval.verdict(ctx, input(nv, iv, params.Value(), now, f.opts.Grace, f.opts.MatchProviderID))
		if err != nil {
			return nil, fmt.Errorf("judge Node %q: %w", node.GetName(), err)
		}
		v.UID, v.ResourceVersion = node.GetUID(), node.GetResourceVersion()
		out = append(out, v)
	}
	return out, nil
}
