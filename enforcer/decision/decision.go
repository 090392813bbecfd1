// Package decision evaluates nodeguard's Rego rule (the embedded policies/,
// entry point data.nodeguard.decision) with one query prepared at start-up and
// reused for every request.
package decision

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"sync/atomic"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeguard/nodeguard/enforcer/linkmodel"
	"github.com/nodeguard/nodeguard/policies"
)

// Input is what the rule reads: an AdmissionRequest-shaped review, an
// inventory in Gatekeeper's layout, and a Constraint's parameters.
type Input struct {
	Review     map[string]any
	Inventory  map[string]any
	Parameters Parameters
}

// Parameters are a Constraint's spec.parameters in the evaluator's own form.
// Converting them once and reusing the value spares every decision that work;
// the zero value means none (the rule's defaults).
type Parameters struct {
	value ast.Value
}

// Value is the converted parameters, nil for none.
func (p Parameters) Value() ast.Value { return p.value }

// NewParameters converts a Constraint's spec.parameters; nil means none.
func NewParameters(params map[string]any) (Parameters, error) {
	if params == nil {
		return Parameters{}, nil
	}
	v, err := ast.InterfaceToValue(params)
	if err != nil {
		return Parameters{}, fmt.Errorf("convert parameters: %w", err)
	}
	return Parameters{value: v}, nil
}

// Link says how a blocker is linked to the Node.
type Link struct {
	Type    string `json:"type"`
	Machine string `json:"machine,omitempty"`
}

// Blocker is a linked InfraMachine (or pool) that still exists.
type Blocker struct {
	Group     string `json:"group"`
	Version   string `json:"version"`
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Deleting  bool   `json:"deleting"`
	Links     []Link `json:"links"`
}

// Unverified is a linked Machine's InfraMachine whose kind is not synced, so
// its absence proves nothing.
type Unverified struct {
	Group     string `json:"group"`
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Links     []Link `json:"links"`
}

// Reasons say in one word why a request was answered as it was: the
// reason label of nodeguard_decisions_total and of the decision log line.
// The first six are the rule's own (its decision's reason); the others name
// denials made outside Rego (Deny) and requests answered with an HTTP error.
const (
	ReasonNoLink      = "no-link"     // allowed: nothing linked still exists
	ReasonExempt      = "exempt"      // allowed for an exempt user or group; see Warnings
	ReasonNotJudged   = "not-judged"  // allowed: the rule judges only DELETE of a core Node
	ReasonBlocked     = "blocked"     // denied: a linked InfraMachine or pool still exists
	ReasonUnverified  = "unverified"  // denied: a linked kind is not synced
	ReasonUnjudgeable = "unjudgeable" // denied: the review carries no Node (or, in Gatekeeper, the provider gave no facts)

	ReasonNotReady        = "not-ready"         // denied: caches not synced yet
	ReasonCacheRecovering = "cache-recovering"  // denied: nothing linked found, but a cache is catching up after a broken watch
	ReasonFreshReadFailed = "fresh-read-failed" // denied: the API server did not answer in time
	ReasonError           = "error"             // denied: no decision could be made
	ReasonBusy            = "busy"              // denied: no decision slot within the deadline
	ReasonBadRequest      = "bad-request"       // no decision: answered with an HTTP error
)

// Deny is a denial that no Rego evaluation produced (not ready, no fresh
// read, no decision in time), shaped like the rule's so every caller prints
// and counts it the same way.
func Deny(reason, msg string) Decision {
	return Decision{Allowed: false, Reason: reason, Blockers: []Blocker{}, Unverified: []Unverified{},
		Messages: []string{msg}, Warnings: []string{}}
}

// Decision is the rule's answer.
type Decision struct {
	Allowed    bool         `json:"allowed"`
	Reason     string       `json:"reason"`
	Blockers   []Blocker    `json:"blockers"`
	Unverified []Unverified `json:"unverified"`
	Messages   []string     `json:"messages"`
	Warnings   []string     `json:"warnings"`
}

// Evaluator holds the prepared query and the rule's default parameters; it
// is safe for concurrent use. Replace swaps in another policy atomically: a
// decision runs wholly on the policy it started with.
type Evaluator struct {
	current atomic.Pointer[prepared]
}

// prepared is one compiled policy, never changed once built.
type prepared struct {
	query    rego.PreparedEvalQuery
	defaults map[string]any
	model    *linkmodel.Model
	policy   Policy
	// The orphan entry points, prepared on the same compiled policy so the
	// reaper always runs the policy the webhook runs; nil when the policy
	// has none (see Orphans).
	orphan, screen *rego.PreparedEvalQuery
	nodeFields     *linkmodel.NodeFields
}

// The orphan entry points (policies/nodeguard/orphans.rego).
const (
	// OrphanQuery is a Node's verdict.
	OrphanQuery = "data.nodeguard.orphan"
	// ScreenQuery is the criteria that read only the Node.
	ScreenQuery = "data.nodeguard.orphan_screen"
)

// Policy says which policy an Evaluator runs.
type Policy struct {
	// Source is SourceEmbedded or SourceBundle.
	Source string `json:"source"`
	// Version is the embedded template version (empty for a bundle, which
	// carries no Gatekeeper entry point).
	Version string `json:"version,omitempty"`
	// Revision is the bundle manifest's revision (empty when embedded).
	Revision string `json:"revision,omitempty"`
}

// Where a policy comes from.
const (
	SourceEmbedded = "embedded"
	SourceBundle   = "bundle"
)

// NewEvaluator compiles the embedded policies once, for both the prepared
// query and the defaults.
func NewEvaluator(ctx context.Context) (*Evaluator, error) {
	compiled, err := policies.Compile()
	if err != nil {
		return nil, err
	}
	version, err := policies.TemplateVersion()
	if err != nil {
		return nil, err
	}
	return NewEvaluatorFor(ctx, compiled, nil, Policy{Source: SourceEmbedded, Version: version})
}

// NewEvaluatorFor prepares the entry point over an already compiled policy
// (e.g. from a bundle) and data (nil: none). It fails when the policy lacks
// the entry point or the default parameters.
func NewEvaluatorFor(ctx context.Context, compiled *ast.Compiler, data map[string]any, policy Policy) (*Evaluator, error) {
	for _, ref := range []string{policies.EnforcerQuery, "data.lib.nodeguard.default_parameters"} {
		if len(compiled.GetRulesForVirtualDocument(ast.MustParseRef(ref))) == 0 {
			return nil, fmt.Errorf("the policy has no rule %s", ref)
		}
	}
	opts := []func(*rego.Rego){rego.Query(policies.EnforcerQuery), rego.Compiler(compiled)}
	var store storage.Store
	if data != nil {
		store = inmem.NewFromObject(data)
		opts = append(opts, rego.Store(store))
	}
	q, err := rego.New(opts...).PrepareForEval(ctx)
	if err != nil {
		return nil, fmt.Errorf("prepare %s: %w", policies.EnforcerQuery, err)
	}
	defaults, err := policies.DefaultParameters(ctx, compiled)
	if err != nil {
		return nil, err
	}
	model, err := linkmodel.Load(ctx, compiled, store)
	if err != nil {
		return nil, err
	}
	p := &prepared{query: q, defaults: defaults, model: model, policy: policy}
	if err := p.prepareOrphans(ctx, compiled, store); err != nil {
		return nil, err
	}
	e := &Evaluator{}
	e.current.Store(p)
	return e, nil
}

// prepareOrphans prepares the orphan entry points when the policy has all
// of them (and their Node fields); a policy with none judges no orphans.
func (p *prepared) prepareOrphans(ctx context.Context, compiled *ast.Compiler, store storage.Store) error {
	var missing []string
	for _, ref := range []string{OrphanQuery, ScreenQuery, linkmodel.NodeFieldsQuery} {
		if len(compiled.GetRulesForVirtualDocument(ast.MustParseRef(ref))) == 0 {
			missing = append(missing, ref)
		}
	}
	if len(missing) == 3 {
		return nil
	}
	if len(missing) > 0 {
		return fmt.Errorf("the policy has orphan criteria but no %v", missing)
	}
	fields, err := linkmodel.LoadNodeFields(ctx, compiled, store)
	if err != nil {
		return err
	}
	p.nodeFields = fields
	for _, q := range []struct {
		ref string
		out **rego.PreparedEvalQuery
	}{{OrphanQuery, &p.orphan}, {ScreenQuery, &p.screen}} {
		opts := []func(*rego.Rego){rego.Query(q.ref), rego.Compiler(compiled)}
		if store != nil {
			opts = append(opts, rego.Store(store))
		}
		prepared, err := rego.New(opts...).PrepareForEval(ctx)
		if err != nil {
			return fmt.Errorf("prepare %s: %w", q.ref, err)
		}
		*q.out = &prepared
	}
	return nil
}

// Replace makes e run other's policy from the next decision on; decisions
// already running finish on the old one. The inventory was built for e's link
// model, so a policy declaring another one is refused: it takes a restart.
func (e *Evaluator) Replace(other *Evaluator) error {
	next, cur := other.current.Load(), e.current.Load()
	if !next.model.Equal(cur.model) {
		return fmt.Errorf("the new policy declares another link model (%s): restart nodeguard to cache and index what it reads", linkmodel.Query)
	}
	// The Node caches of the orphan scan were built for these fields, and the
	// scan runs on these entry points.
	if (cur.orphan != nil) != (next.orphan != nil) || !next.nodeFields.Equal(cur.nodeFields) {
		return fmt.Errorf("the new policy declares other orphan criteria entry points or Node fields (%s): restart nodeguard to use it", linkmodel.NodeFieldsQuery)
	}
	e.current.Store(next)
	return nil
}

// Orphans returns the Node fields the orphan criteria of the policy e runs
// read, or an error when that policy has no orphan criteria.
func (e *Evaluator) Orphans() (*linkmodel.NodeFields, error) {
	p := e.current.Load()
	if p.orphan == nil {
		return nil, fmt.Errorf("the policy (%s) has no orphan criteria (%s, %s): use a bundle built from this release's policies/", p.policy.Source, OrphanQuery, ScreenQuery)
	}
	return p.nodeFields, nil
}

// EvalOrphan evaluates the orphan verdict (screen false) or the Node-only
// screen (screen true) on input and returns the result's value (JSON-shaped
// Go data), on the policy e runs now.
func (e *Evaluator) EvalOrphan(ctx context.Context, screen bool, input ast.Value) (map[string]any, error) {
	p := e.current.Load()
	q, ref := p.orphan, OrphanQuery
	if screen {
		q, ref = p.screen, ScreenQuery
	}
	if q == nil {
		return nil, fmt.Errorf("evaluate %s: the policy has no orphan criteria", ref)
	}
	rs, err := q.Eval(ctx, rego.EvalParsedInput(input))
	if err != nil {
		return nil, fmt.Errorf("evaluate %s: %w", ref, err)
	}
	value, ok := rego.ResultValue[map[string]any](rs)
	if !ok {
		return nil, fmt.Errorf("evaluate %s: want one object, got %d results", ref, len(rs))
	}
	return value, nil
}

// Model returns the link model of the policy e runs.
func (e *Evaluator) Model() *linkmodel.Model {
	return e.current.Load().model
}

// Policy says which policy e runs now.
func (e *Evaluator) Policy() Policy {
	return e.current.Load().policy
}

// DefaultParameters returns a copy of the rule's default parameters.
func (e *Evaluator) DefaultParameters() map[string]any {
	return maps.Clone(e.current.Load().defaults)
}

// Evaluate runs the rule on one input.
func (e *Evaluator) Evaluate(ctx context.Context, in Input) (Decision, error) {
	input, err := in.value()
	if err != nil {
		return Decision{}, err
	}
	rs, err := e.current.Load().query.Eval(ctx, rego.EvalParsedInput(input))
	if err != nil {
		return Decision{}, fmt.Errorf("evaluate %s: %w", policies.EnforcerQuery, err)
	}
	value, ok := rego.ResultValue[map[string]any](rs)
	if !ok {
		return Decision{}, fmt.Errorf("evaluate %s: want one object, got %d results", policies.EnforcerQuery, len(rs))
	}
	// The result is plain JSON-shaped data; a round trip maps it onto the types.
	raw, err := json.Marshal(value)
	if err != nil {
		return Decision{}, fmt.Errorf("encode decision: %w", err)
	}
	var d Decision
	if err := json.Unmarshal(raw, &d); err != nil {
		return Decision{}, fmt.Errorf("decode decision: %w", err)
	}
	// The rule says why; a policy that does not (or contradicts itself) gets
	// no decision, which every caller turns into a denial.
	if allowed, known := ruleVerdict(d.Reason); !known || allowed != d.Allowed {
		return Decision{}, fmt.Errorf("evaluate %s: the decision (allowed %t) gives reason %q; the rule's reasons are %s, %s, %s (allowed) and %s, %s, %s (denied)",
			policies.EnforcerQuery, d.Allowed, d.Reason, ReasonNoLink, ReasonExempt, ReasonNotJudged, ReasonBlocked, ReasonUnverified, ReasonUnjudgeable)
	}
	return d, nil
}

// ruleVerdict says whether reason, one the rule gives, allows the delete;
// known is false for a reason that is not the rule's.
func ruleVerdict(reason string) (allowed, known bool) {
	switch reason {
	case ReasonNoLink, ReasonExempt, ReasonNotJudged:
		return true, true
	case ReasonBlocked, ReasonUnverified, ReasonUnjudgeable:
		return false, true
	}
	return false, false
}

// value converts the input for OPA. OPA's own conversion of a Go value
// (rego.EvalInput) first round-trips it through JSON, about a third of the
// bytes a decision allocates.
func (in Input) value() (ast.Value, error) {
	review, err := ast.InterfaceToValue(in.Review)
	if err != nil {
		return nil, fmt.Errorf("convert review: %w", err)
	}
	input := ast.NewObject(ast.Item(ast.StringTerm("review"), ast.NewTerm(review)))
	if in.Inventory != nil {
		inv, err := ast.InterfaceToValue(in.Inventory)
		if err != nil {
			return nil, fmt.Errorf("convert inventory: %w", err)
		}
		input.Insert(ast.StringTerm("inventory"), ast.NewTerm(inv))
	}
	if in.Parameters.value != nil {
		input.Insert(ast.StringTerm("parameters"), ast.NewTerm(in.Parameters.value))
	}
	return input, nil
}

// Kinds returns the InfraMachine and pool kinds of a Constraint's
// parameters, with the rule's defaults for those not given: the kinds to
// sync or load, for the live enforcer and the offline check alike.
func (e *Evaluator) Kinds(params map[string]any) (infra, pools []schema.GroupKind, err error) {
	effective := e.DefaultParameters()
	maps.Copy(effective, params)
	if infra, err = groupKinds(effective, "infraMachineKinds"); err != nil {
		return nil, nil, err
	}
	if pools, err = groupKinds(effective, "infraMachinePoolKinds"); err != nil {
		return nil, nil, err
	}
	return infra, pools, nil
}

// groupKinds reads a list of {group, kind} parameters.
func groupKinds(params map[string]any, key string) ([]schema.GroupKind, error) {
	list, ok := params[key].([]any)
	if !ok {
		return nil, fmt.Errorf("parameter %s: want a list of {group, kind}, got %T", key, params[key])
	}
	out := make([]schema.GroupKind, 0, len(list))
	for i, item := range list {
		m, _ := item.(map[string]any)
		group, _ := m["group"].(string)
		kind, _ := m["kind"].(string)
		if kind == "" {
			return nil, fmt.Errorf("parameter %s[%d]: want {group, kind}, got %v", key, i, item)
		}
		out = append(out, schema.GroupKind{Group: group, Kind: kind})
	}
	return out, nil
}
