// Package orphans finds orphan Nodes: Nodes Cluster API left behind once
// their InfraMachine was gone. The criteria are Rego (policies/nodeguard/
// orphans, entry point data.nodeguard.orphan); this package picks what the
// criteria read for each Node, through the same Guard (indexes, fresh reads,
// parameters) that judges Node deletes, and evaluates them.
package orphans

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/rego"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/inventory"
	"github.com/nodeguard/nodeguard/enforcer/linkmodel"
	"github.com/nodeguard/nodeguard/policies"
)

// Query is the orphan entry point the Evaluator prepares.
const Query = "data.nodeguard.orphan"

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

// Evaluator holds the prepared orphan query; safe for concurrent use.
type Evaluator struct {
	query rego.PreparedEvalQuery
}

// NewEvaluator compiles the embedded policies and prepares the query once.
func NewEvaluator(ctx context.Context) (*Evaluator, error) {
	compiled, err := policies.Compile()
	if err != nil {
		return nil, err
	}
	q, err := rego.New(rego.Query(Query), rego.Compiler(compiled)).PrepareForEval(ctx)
	if err != nil {
		return nil, fmt.Errorf("prepare %s: %w", Query, err)
	}
	return &Evaluator{query: q}, nil
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
	// null is not an object to the Rego: absent means empty.
	if in.Inventory == nil {
		in.Inventory = map[string]any{}
	}
	if in.Parameters == nil {
		in.Parameters = map[string]any{}
	}
	input := map[string]any{
		"node":            in.Node,
		"inventory":       in.Inventory,
		"parameters":      in.Parameters,
		"now":             in.Now.UTC().Format(time.RFC3339),
		"grace":           in.Grace.String(),
		"matchProviderID": in.MatchProviderID,
	}
	rs, err := e.query.Eval(ctx, rego.EvalInput(input))
	if err != nil {
		return Verdict{}, fmt.Errorf("evaluate %s: %w", Query, err)
	}
	if len(rs) != 1 || len(rs[0].Expressions) != 1 {
		return Verdict{}, fmt.Errorf("evaluate %s: want one result, got %d", Query, len(rs))
	}
	raw, err := json.Marshal(rs[0].Expressions[0].Value)
	if err != nil {
		return Verdict{}, fmt.Errorf("encode verdict: %w", err)
	}
	var v Verdict
	if err := json.Unmarshal(raw, &v); err != nil {
		return Verdict{}, fmt.Errorf("decode verdict: %w", err)
	}
	return v, nil
}

// Options configure a Finder.
type Options struct {
	// Guard supplies the objects the rule reads for a Node (indexes, fresh
	// reads) and the effective parameters; required.
	Guard *guard.Guard
	// Inventory is the Guard's inventory, scanned for evidence of which
	// providerID schemes the synced InfraMachines use; required.
	Inventory *inventory.Inventory
	// Grace: how long a Node must have been not Ready (default DefaultGrace).
	Grace time.Duration
	// MatchProviderID turns on the opt-in wider match (#7237, metal3 #890).
	MatchProviderID bool
	// Evaluator, when set, is shared instead of compiling the policies again.
	Evaluator *Evaluator
}

// Finder judges Nodes against the orphan criteria.
type Finder struct {
	eval *Evaluator
	opts Options
}

// NewFinder prepares the criteria once.
func NewFinder(ctx context.Context, opts Options) (*Finder, error) {
	if opts.Guard == nil {
		return nil, fmt.Errorf("orphans: a Guard is required")
	}
	if opts.Inventory == nil {
		return nil, fmt.Errorf("orphans: the inventory is required")
	}
	if opts.Grace == 0 {
		opts.Grace = DefaultGrace
	}
	eval := opts.Evaluator
	if eval == nil {
		var err error
		if eval, err = NewEvaluator(ctx); err != nil {
			return nil, err
		}
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

// Scan is Judge from the informer caches alone: for periodic scans of every
// Node, which would otherwise cost a few reads per Node per pass. Act only on
// what Judge confirms.
func (f *Finder) Scan(ctx context.Context, nodes []*unstructured.Unstructured, cluster string, now time.Time) ([]Verdict, error) {
	return f.judge(ctx, nodes, cluster, now, false)
}

func (f *Finder) judge(ctx context.Context, nodes []*unstructured.Unstructured, cluster string, now time.Time, fresh bool) ([]Verdict, error) {
	params, err := f.opts.Guard.ScopedParameters(cluster)
	if err != nil {
		return nil, err
	}
	evidence := schemeEvidence(f.opts.Inventory.List(inventory.InfraMachine), f.opts.Inventory.Model().ClusterLabel)
	out := make([]Verdict, 0, len(nodes))
	for _, node := range nodes {
		objs, err := f.opts.Guard.Objects(ctx, node, fresh)
		if err != nil {
			return nil, err
		}
		objs = append(objs, evidence...)
		v, err := f.eval.Evaluate(ctx, Input{
			Node:            node.Object,
			Inventory:       inventory.Layout(objs),
			Parameters:      params,
			Now:             now,
			Grace:           f.opts.Grace,
			MatchProviderID: f.opts.MatchProviderID,
		})
		if err != nil {
			return nil, fmt.Errorf("judge Node %q: %w", node.GetName(), err)
		}
		v.UID, v.ResourceVersion = node.GetUID(), node.GetResourceVersion()
		out = append(out, v)
	}
	return out, nil
}

// schemeEvidence keeps one InfraMachine per (namespace, cluster label,
// providerID scheme): enough for the criteria to see which schemes a
// cluster's synced InfraMachines use, without handing every InfraMachine to
// every evaluation. The Rego decides what counts as evidence; this only
// bounds the input.
func schemeEvidence(infra []*unstructured.Unstructured, clusterLabel linkmodel.Path) []*unstructured.Unstructured {
	seen := map[[3]string]bool{}
	var out []*unstructured.Unstructured
	for _, o := range infra {
		pid, _, _ := unstructured.NestedString(o.Object, "spec", "providerID")
		scheme, _, ok := strings.Cut(pid, "://")
		if !ok || scheme == "" {
			continue
		}
		cluster, _, _ := unstructured.NestedString(o.Object, clusterLabel...)
		key := [3]string{o.GetNamespace(), cluster, scheme}
		if !seen[key] {
			seen[key] = true
			out = append(out, o)
		}
	}
	return out
}
