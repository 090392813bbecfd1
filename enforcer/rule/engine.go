// This file runs the policy's entry points: the admission decision
// (data.nodeguard.decision), the orphan criteria (data.nodeguard.orphan,
// data.nodeguard.orphan_screen), releases and ghosts. It compiles a policy once, prepares one
// query per entry point on that compilation, takes input as an ast.Value and
// decodes the answer from the ast.Value OPA returns, so every entry point
// runs the same compiled policy (a bundle's reloads included) and no input
// or answer passes through JSON text.

package rule

import (
	"context"
	"fmt"
	"maps"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeguard/nodeguard/policies"
)

// Entry is an entry point of the policy: its Rego query.
type Entry string

// The entry points.
const (
	// DecisionEntry is a review's decision (policies/nodeguard/decision.rego).
	DecisionEntry Entry = policies.EnforcerQuery
	// OrphanEntry is a Node's orphan verdict (policies/nodeguard/verdicts.rego).
	OrphanEntry Entry = "data.nodeguard.orphan"
	// ScreenEntry is the orphan criteria that read only the Node.
	ScreenEntry Entry = "data.nodeguard.orphan_screen"
	// ReleaseEntry is a Node's release verdict (policies/nodeguard/released), for
	// mode admission-policy; optional: a bundle built before it has none.
	ReleaseEntry Entry = "data.nodeguard.release"
	// GhostEntry is a Node's ghost verdict (policies/nodeguard/ghosts), and
	// Registration a Node CREATE's or UPDATE's; optional, as Release.
	GhostEntry        Entry = "data.nodeguard.ghost"
	RegistrationEntry Entry = "data.nodeguard.registration"
)

// entries are all the entry points.
func entries() []Entry {
	return []Entry{DecisionEntry, OrphanEntry, ScreenEntry, ReleaseEntry, GhostEntry, RegistrationEntry}
}

// optional are the entry points a policy with orphan criteria may lack: a
// bundle built before them.
func (e Entry) optional() bool { return e == ReleaseEntry || e == GhostEntry || e == RegistrationEntry }

// Query is the entry point's Rego query.
func (e Entry) Query() string { return string(e) }

// defaultParameters is the rule's defaults, which a policy must declare.
const defaultParameters = "data.lib.nodeguard.default_parameters"

// Policy says which policy an Engine runs.
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

// Engine runs one compiled policy; it is safe for concurrent use. Replace
// swaps in another policy atomically: an evaluation runs wholly on the
// policy it started with.
type Engine struct {
	current atomic.Pointer[compiled]
}

// compiled is one policy's prepared entry points and declarations, never
// changed once built.
type compiled struct {
	// queries by Entry; the orphan entries are nil when the policy has no
	// orphan criteria (see NodeFields).
	queries    map[Entry]*rego.PreparedEvalQuery
	defaults   map[string]any
	grace      time.Duration // the orphan criteria's default grace; 0 without them
	model      *Model
	nodeFields *NodeFields
	policy     Policy
}

// NewEngine compiles the embedded policies.
func NewEngine(ctx context.Context) (*Engine, error) {
	c, err := policies.Compile()
	if err != nil {
		return nil, err
	}
	version, err := policies.TemplateVersion()
	if err != nil {
		return nil, err
	}
	return CompileEngine(ctx, c, nil, Policy{Source: SourceEmbedded, Version: version})
}

// CompileEngine prepares the entry points over an already compiled policy (e.g. from
// a bundle) and data (nil: none). The decision and the default parameters
// are required; the orphan criteria come all together or not at all.
func CompileEngine(ctx context.Context, c *ast.Compiler, data map[string]any, policy Policy) (*Engine, error) {
	has := func(ref string) bool { return len(c.GetRulesForVirtualDocument(ast.MustParseRef(ref))) > 0 }
	for _, ref := range []string{DecisionEntry.Query(), defaultParameters} {
		if !has(ref) {
			return nil, fmt.Errorf("the policy has no rule %s", ref)
		}
	}
	var missing []string
	for _, ref := range []string{OrphanEntry.Query(), ScreenEntry.Query(), NodeFieldsQuery} {
		if !has(ref) {
			missing = append(missing, ref)
		}
	}
	orphans := len(missing) == 0
	if !orphans && len(missing) < 3 {
		return nil, fmt.Errorf("the policy has orphan criteria but no %v", missing)
	}
	var store storage.Store
	if data != nil {
		store = inmem.NewFromObject(data)
	}
	p := &compiled{policy: policy, queries: map[Entry]*rego.PreparedEvalQuery{}}
	for _, entry := range entries() {
		if entry != DecisionEntry && !orphans || entry.optional() && !has(entry.Query()) {
			continue
		}
		q, err := prepare(ctx, c, store, entry.Query())
		if err != nil {
			return nil, err
		}
		p.queries[entry] = q
	}
	var err error
	if p.defaults, err = policies.DefaultParameters(ctx, c); err != nil {
		return nil, err
	}
	if p.model, err = LoadModel(ctx, c, store); err != nil {
		return nil, err
	}
	if orphans {
		if p.nodeFields, err = LoadNodeFields(ctx, c, store); err != nil {
			return nil, err
		}
		if p.grace, err = policies.DefaultGrace(ctx, c); err != nil {
			return nil, err
		}
	}
	e := &Engine{}
	e.current.Store(p)
	return e, nil
}

// prepare prepares one query whose results stay ast.Values: OPA's default
// converts each into Go maps and slices, which the callers would only walk
// again.
func prepare(ctx context.Context, c *ast.Compiler, store storage.Store, query string) (*rego.PreparedEvalQuery, error) {
	// A nil store is rego's own, empty one.
	q, err := rego.New(rego.Query(query), rego.Compiler(c), rego.Store(store),
		rego.GenerateJSON(func(t *ast.Term, _ *rego.EvalContext) (any, error) { return t.Value, nil })).PrepareForEval(ctx)
	if err != nil {
		return nil, fmt.Errorf("prepare %s: %w", query, err)
	}
	return &q, nil
}

// Replace makes e run other's policy from the next evaluation on; those
// already running finish on the old one. The inventory and the Node caches
// were built for e's link model and Node fields, so a policy declaring
// others is refused: it takes a restart.
func (e *Engine) Replace(other *Engine) error {
	next, cur := other.current.Load(), e.current.Load()
	if !next.model.Equal(cur.model) {
		return fmt.Errorf("the new policy declares another link model (%s): restart nodeguard to cache and index what it reads", ModelQuery)
	}
	if (cur.queries[OrphanEntry] != nil) != (next.queries[OrphanEntry] != nil) || !next.nodeFields.Equal(cur.nodeFields) {
		return fmt.Errorf("the new policy declares other orphan criteria entry points or Node fields (%s): restart nodeguard to use it", NodeFieldsQuery)
	}
	e.current.Store(next)
	return nil
}

// Run is how every caller evaluates an entry point, with the policy e runs
// now: fields become its input (InputValue) and its one result is decoded
// into a T (see decode).
func Run[T any](ctx context.Context, e *Engine, entry Entry, fields map[string]any) (T, error) {
	var out, zero T
	input, err := InputValue(fields)
	if err != nil {
		return zero, fmt.Errorf("evaluate %s: %w", entry.Query(), err)
	}
	q := e.current.Load().queries[entry]
	if q == nil {
		return zero, fmt.Errorf("evaluate %s: the policy has no such entry point", entry.Query())
	}
	rs, err := q.Eval(ctx, rego.EvalParsedInput(input))
	if err != nil {
		return zero, fmt.Errorf("evaluate %s: %w", entry.Query(), err)
	}
	v, ok := rego.ResultValue[ast.Value](rs)
	if !ok {
		return zero, fmt.Errorf("evaluate %s: want one value, got %d results", entry.Query(), len(rs))
	}
	if err := decode(v, &out); err != nil {
		return zero, fmt.Errorf("evaluate %s: %w", entry.Query(), err)
	}
	return out, nil
}

// NodeFields returns the Node fields the orphan criteria of the policy e
// runs read, or an error when that policy has no orphan criteria.
func (e *Engine) NodeFields() (*NodeFields, error) {
	p := e.current.Load()
	if p.queries[OrphanEntry] == nil {
		return nil, fmt.Errorf("the policy (%s) has no orphan criteria (%s, %s): use a bundle built from this release's policies/",
			p.policy.Source, OrphanEntry.Query(), ScreenEntry.Query())
	}
	return p.nodeFields, nil
}

// Model returns the link model of the policy e runs.
func (e *Engine) Model() *Model { return e.current.Load().model }

// Policy says which policy e runs now.
func (e *Engine) Policy() Policy { return e.current.Load().policy }

// DefaultParameters returns a copy of the rule's default parameters.
func (e *Engine) DefaultParameters() map[string]any { return maps.Clone(e.current.Load().defaults) }

// DefaultGrace is the orphan criteria's default grace
// (data.nodeguard.orphans.default_grace); 0 for a policy without them.
func (e *Engine) DefaultGrace() time.Duration { return e.current.Load().grace }

// Kinds returns the InfraMachine and pool kinds of a Constraint's
// parameters, with the rule's defaults for those not given: the kinds to
// sync or load, for the live enforcer and the offline check alike.
func (e *Engine) Kinds(params map[string]any) (infra, pools []schema.GroupKind, err error) {
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
