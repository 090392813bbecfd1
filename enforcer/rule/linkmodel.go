// This file reads the link model the rule declares
// (data.lib.nodeguard.link_model, in policies/lib/nodeguard/links.rego) from
// the policy the enforcer runs, and derives what the enforcer needs from it:
// which fields to keep of each object and of a Node, which objects could be
// linked to a Node, and what a Machine references. The enforcer holds no link
// of its own: a link added to the declaration is followed with no Go change.

package rule

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeguard/nodeguard/enforcer/record"
	"github.com/nodeguard/nodeguard/policies"
)

// ModelQuery is the declaration's document.
const ModelQuery = "data.lib.nodeguard.link_model"

// Role is what an object is to the rule.
type Role string

// The roles the rule knows. A Machine or MachinePool (a referrer) blocks
// what its reference names; an InfraMachine or InfraMachinePool blocks
// itself.
const (
	Machine          Role = "Machine"
	MachinePool      Role = "MachinePool"
	InfraMachine     Role = "InfraMachine"
	InfraMachinePool Role = "InfraMachinePool"
)

// Roles returns every role the rule knows, in a fixed order.
func Roles() []Role { return []Role{Machine, MachinePool, InfraMachine, InfraMachinePool} }

// Referrer is a role whose objects block what their reference names, as the
// policy declares it (referrers in links.rego).
type Referrer struct {
	Group string `json:"group"`
	Kind  string `json:"kind"`
	// Reference is the field naming the referenced object.
	Reference Path `json:"reference"`
	// Names is the role of the objects the reference names: a referenced
	// kind is watched as that role.
	Names Role `json:"names"`
	// Kinds is the parameter listing the synced kinds a reference names.
	Kinds string `json:"kinds"`
}

// GroupKind is the referrer's kind.
func (r Referrer) GroupKind() schema.GroupKind { return schema.GroupKind{Group: r.Group, Kind: r.Kind} }

// Match says how an object's fields are compared with the Node's.
type Match string

// The matches the rule knows.
const (
	// Equal: each object field equals the Node field in the same position.
	Equal Match = "equal"
	// Contains: the one object field is a list holding the Node field.
	Contains Match = "contains"
)

// Path is a field path, e.g. [spec providerID].
type Path = record.Path

// Link is one declared link.
type Link struct {
	Type   string `json:"type"`
	Role   Role   `json:"role"`
	Node   []Path `json:"node"`
	Fields []Path `json:"fields"`
	Match  Match  `json:"match"`
	When   string `json:"when"`
	Blocks string `json:"blocks"`
	Phrase string `json:"phrase"`
}

// Keyed reports whether the link names an object by namespace and name, and
// where each sits among the Node's values: then a lookup by key finds it.
func (l Link) Keyed() (namespace, name int, ok bool) {
	if l.Match != Equal || len(l.Fields) != 2 {
		return 0, 0, false
	}
	namespace, name = -1, -1
	for i, f := range l.Fields {
		switch {
		case isNamespace(f):
			namespace = i
		case isName(f):
			name = i
		}
	}
	return namespace, name, namespace >= 0 && name >= 0
}

// Model is the declared link model and what is derived from it. It is
// immutable once loaded.
type Model struct {
	Links []Link `json:"links"`
	// NodeFields are the fields the rule reads of a Node: its name and
	// every link's Node fields.
	NodeFields []Path `json:"node_fields"`
	// Referrers are the roles that block what they reference, by role.
	Referrers map[Role]Referrer `json:"referrers"`
	// MachineKind and Reference are the Machine referrer's kind and
	// reference.
	MachineKind       schema.GroupKind `json:"-"`
	Reference         Path             `json:"-"`
	DeletionTimestamp Path             `json:"deletion_timestamp"`
	ClusterLabel      Path             `json:"cluster_label"`
	ClusterName       Path             `json:"cluster_name"`
	// ProviderID is kept of every InfraMachine and referrer: the orphan
	// criteria read an InfraMachine's scheme, and a Machine of a pool speaks
	// for its instance, whether or not a link compares them.
	ProviderID Path `json:"provider_id"`
	// PoolName is kept of every referrer: the MachinePool a Machine belongs
	// to (Cluster API's MachinePool Machines).
	PoolName Path `json:"pool_name"`
	// NodeProviderID is the Node field naming its host: a link on it alone
	// names the host too (ProviderIDLinks), which is what a tombstone
	// remembers when the linked object goes.
	NodeProviderID Path `json:"node_provider_id"`
	// GroupParameters name the parameters whose values are the group names
	// the rule compares a requesting user's groups with (see Groups).
	GroupParameters []string `json:"group_parameters"`

	shapes  map[Role]*record.Shape
	refSlot map[Role][5]int // each referrer's reference keys in its shape
	// referrer is the role of each referrer's shape: a record's role is
	// looked up on every candidate a decision follows.
	referrer map[*record.Shape]Role
	// node is what the rule reads of a Node (NodePaths).
	node *record.Shape
}

func isName(p Path) bool      { return slices.Equal(p, Path{"metadata", "name"}) }
func isNamespace(p Path) bool { return slices.Equal(p, Path{"metadata", "namespace"}) }

// referenceKeys are the keys of an object reference the rule reads (Cluster
// API's refs: v1beta2 apiGroup, v1beta1 apiVersion and namespace).
func referenceKeys() []string { return []string{"apiGroup", "apiVersion", "kind", "name", "namespace"} }

// LoadModel evaluates the declaration in a compiled policy (the embedded one, or a
// bundle's) with its data (nil: none) and checks it.
func LoadModel(ctx context.Context, compiled *ast.Compiler, store storage.Store) (*Model, error) {
	raw, err := declared(ctx, compiled, store, ModelQuery)
	if err != nil {
		return nil, err
	}
	return ParseModel(raw)
}

// declared evaluates a declaration of the policy, query, as the JSON Parse
// and ParseNodeFields read; it runs once at start, not per decision.
func declared(ctx context.Context, compiled *ast.Compiler, store storage.Store, query string) ([]byte, error) {
	rs, err := rego.New(rego.Query(query), rego.Compiler(compiled), rego.Store(store)).Eval(ctx)
	if err != nil {
		return nil, fmt.Errorf("evaluate %s: %w", query, err)
	}
	if len(rs) != 1 || len(rs[0].Expressions) != 1 {
		return nil, fmt.Errorf("evaluate %s: the policy does not declare it", query)
	}
	raw, err := json.Marshal(rs[0].Expressions[0].Value)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", query, err)
	}
	return raw, nil
}

// EmbeddedModel loads the model of the policy compiled into the binary.
func EmbeddedModel(ctx context.Context) (*Model, error) {
	compiled, err := policies.Compile()
	if err != nil {
		return nil, err
	}
	return LoadModel(ctx, compiled, nil)
}

// ParseModel reads the declaration's JSON and derives the model from it.
func ParseModel(raw []byte) (*Model, error) {
	var m Model
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("decode %s: %w", ModelQuery, err)
	}
	machine := m.Referrers[Machine]
	m.MachineKind, m.Reference = machine.GroupKind(), machine.Reference
	if err := m.check(); err != nil {
		return nil, fmt.Errorf("%s: %w", ModelQuery, err)
	}
	m.shapes, m.refSlot, m.referrer = map[Role]*record.Shape{}, map[Role][5]int{}, map[*record.Shape]Role{}
	for _, role := range Roles() {
		s, err := record.NewShape(m.spec(role))
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", ModelQuery, role, err)
		}
		m.shapes[role] = s
	}
	for role, r := range m.Referrers {
		var slots [5]int
		for i, k := range referenceKeys() {
			slots[i] = m.shapes[role].Slot(append(slices.Clone(r.Reference), k))
		}
		m.refSlot[role] = slots
		m.referrer[m.shapes[role]] = role
	}
	node, err := record.NewShape(record.Spec{Scalars: m.NodePaths()})
	if err != nil {
		return nil, fmt.Errorf("%s: Node: %w", ModelQuery, err)
	}
	m.node = node
	return &m, nil
}

// check refuses a declaration the enforcer cannot follow exactly: it must
// fail loudly at start-up, never judge with half a model.
func (m *Model) check() error {
	if m.MachineKind.Kind == "" {
		return fmt.Errorf("referrers: no Machine with a kind")
	}
	for role, r := range m.Referrers {
		if !slices.Contains(Roles(), role) || role == r.Names || r.Kind == "" {
			return fmt.Errorf("referrer %s: not a known role, or without a kind", role)
		}
		if r.Names != InfraMachine && r.Names != InfraMachinePool {
			return fmt.Errorf("referrer %s: names %q, want %q or %q", role, r.Names, InfraMachine, InfraMachinePool)
		}
		if err := checkPath(r.Reference); err != nil {
			return fmt.Errorf("referrer %s reference: %w", role, err)
		}
	}
	for name, p := range map[string]Path{"deletion_timestamp": m.DeletionTimestamp, "cluster_label": m.ClusterLabel,
		"cluster_name": m.ClusterName, "provider_id": m.ProviderID, "pool_name": m.PoolName, "node_provider_id": m.NodeProviderID} {
		if err := checkPath(p); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	seen := map[string]bool{}
	for i, l := range m.Links {
		if l.Type == "" || seen[l.Type] {
			return fmt.Errorf("links[%d]: type %q is empty or repeated", i, l.Type)
		}
		seen[l.Type] = true
		if !slices.Contains(Roles(), l.Role) {
			return fmt.Errorf("link %s: role %q is not one of %v", l.Type, l.Role, Roles())
		}
		if len(l.Node) == 0 || len(l.Node) != len(l.Fields) {
			return fmt.Errorf("link %s: %d node fields for %d object fields, want the same number, at least one", l.Type, len(l.Node), len(l.Fields))
		}
		switch l.Match {
		case Equal:
		case Contains:
			if len(l.Fields) != 1 {
				return fmt.Errorf("link %s: match contains takes one field, got %d", l.Type, len(l.Fields))
			}
		default:
			return fmt.Errorf("link %s: match %q is not %q or %q", l.Type, l.Match, Equal, Contains)
		}
		for _, p := range append(slices.Clone(l.Node), l.Fields...) {
			if err := checkPath(p); err != nil {
				return fmt.Errorf("link %s: %w", l.Type, err)
			}
		}
		for _, p := range l.Node {
			if !m.readsNode(p) {
				return fmt.Errorf("link %s: node field %s is not in node_fields", l.Type, p)
			}
		}
	}
	if !m.readsNode(Path{"metadata", "name"}) {
		return fmt.Errorf("node_fields lacks metadata.name")
	}
	if !m.readsNode(m.NodeProviderID) {
		return fmt.Errorf("node_provider_id %s is not in node_fields", m.NodeProviderID)
	}
	for _, p := range m.NodeFields {
		if err := checkPath(p); err != nil {
			return fmt.Errorf("node_fields: %w", err)
		}
	}
	return nil
}

func (m *Model) readsNode(p Path) bool {
	return slices.ContainsFunc(m.NodeFields, func(have Path) bool { return slices.Equal(have, p) })
}

func checkPath(p Path) error {
	if len(p) == 0 || slices.Contains(p, "") {
		return fmt.Errorf("field path %q is empty or has an empty segment", p)
	}
	return nil
}

// Field is one field the enforcer keeps of an object.
type Field struct {
	Path Path
	// List: a list of strings (a Contains link's field); otherwise a string.
	List bool
}

// ReferenceSlots returns the scalar positions of a referrer's reference keys
// (apiGroup, apiVersion, kind, name, namespace) in its shape; false for a
// role that references nothing.
func (m *Model) ReferenceSlots(role Role) ([5]int, bool) {
	slots, ok := m.refSlot[role]
	return slots, ok
}

// ReferrerOf returns the role of the referrer whose objects have shape s.
func (m *Model) ReferrerOf(s *record.Shape) (Role, bool) {
	role, ok := m.referrer[s]
	return role, ok
}

// Shape returns what is kept of objects of role.
func (m *Model) Shape(role Role) *record.Shape { return m.shapes[role] }

// NodeShape returns what the rule reads of a Node: NodePaths, besides its
// apiVersion and kind. A Node is judged as this shape rebuilds it, so the
// rule's input costs the same for every Node, whatever its status, labels
// or managed fields hold.
func (m *Model) NodeShape() *record.Shape { return m.node }

// spec declares what is kept of role's objects besides their key.
func (m *Model) spec(role Role) record.Spec {
	s := record.Spec{}
	add := func(list *[]Path, p Path) {
		// every record keeps its key
		if !isName(p) && !isNamespace(p) && !slices.ContainsFunc(*list, func(have Path) bool { return slices.Equal(have, p) }) {
			*list = append(*list, p)
		}
	}
	add(&s.Scalars, m.DeletionTimestamp)
	add(&s.Scalars, m.ClusterLabel)
	if role == InfraMachine {
		add(&s.Scalars, m.ProviderID)
	}
	if r, ok := m.Referrers[role]; ok {
		add(&s.Scalars, m.ClusterName)
		add(&s.Scalars, m.ProviderID)
		add(&s.Scalars, m.PoolName)
		for _, k := range referenceKeys() {
			add(&s.Scalars, append(slices.Clone(r.Reference), k))
		}
	}
	for _, l := range m.Links {
		if l.Role != role {
			continue
		}
		for _, f := range l.Fields {
			if l.Match == Contains {
				add(&s.Lists, f)
			} else {
				add(&s.Scalars, f)
			}
		}
		// A link by namespace and name finds its object by the store's key.
		if _, _, keyed := l.Keyed(); !keyed {
			addIndex(&s.Indexes, l.Fields)
		}
	}
	return s
}

// Fields lists every field kept of role's objects, for people and tests
// reading what the enforcer caches.
func (m *Model) Fields(role Role) []Field {
	s := m.shapes[role]
	out := []Field{{Path: Path{"metadata", "namespace"}}, {Path: Path{"metadata", "name"}}}
	for _, p := range s.Scalars() {
		out = append(out, Field{Path: p})
	}
	for _, p := range s.Lists() {
		out = append(out, Field{Path: p, List: true})
	}
	return out
}

// NodePaths are the fields the rule reads of a Node, as it declares them
// (node_fields: its name and every link's Node fields, sorted).
func (m *Model) NodePaths() []Path {
	return slices.Clone(m.NodeFields)
}

// LinksOf returns the links whose objects have role.
func (m *Model) LinksOf(role Role) []Link {
	var out []Link
	for _, l := range m.Links {
		if l.Role == role {
			out = append(out, l)
		}
	}
	return out
}

// ProviderIDLinks returns the links whose objects have role and that
// compare the Node's providerID alone: what such an object carries in that
// link names a host.
func (m *Model) ProviderIDLinks(role Role) []Link {
	var out []Link
	for _, l := range m.LinksOf(role) {
		if len(l.Node) == 1 && slices.Equal(l.Node[0], m.NodeProviderID) {
			out = append(out, l)
		}
	}
	return out
}

// Equal reports whether two models need the same cache: the same links
// (type, role, fields, match) and object fields. Words for people (when,
// blocks, phrase) may differ.
func (m *Model) Equal(other *Model) bool {
	structure := func(links []Link) []Link {
		out := make([]Link, len(links))
		for i, l := range links {
			out[i] = Link{Type: l.Type, Role: l.Role, Node: l.Node, Fields: l.Fields, Match: l.Match}
		}
		return out
	}
	return reflect.DeepEqual(structure(m.Links), structure(other.Links)) && reflect.DeepEqual(m.Referrers, other.Referrers) &&
		slices.Equal(m.PoolName, other.PoolName) && slices.Equal(m.DeletionTimestamp, other.DeletionTimestamp) &&
		slices.Equal(m.ClusterLabel, other.ClusterLabel) && slices.Equal(m.ClusterName, other.ClusterName) &&
		slices.Equal(m.ProviderID, other.ProviderID) && slices.Equal(m.GroupParameters, other.GroupParameters) &&
		slices.Equal(m.NodeProviderID, other.NodeProviderID)
}

// Groups returns the groups of a requesting user the rule can read under
// params (a Constraint's, with the defaults): every string some group
// parameter lists (no other item equals a group). nil means every group: a
// group parameter that is not a list could match a group in ways the rule
// alone knows.
func (m *Model) Groups(params map[string]any) map[string]bool {
	out := map[string]bool{}
	for _, name := range m.GroupParameters {
		v, ok := params[name]
		if !ok {
			continue // unset: the rule finds no group in it
		}
		list, ok := v.([]any)
		if !ok {
			return nil
		}
		for _, item := range list {
			if s, ok := item.(string); ok {
				out[s] = true
			}
		}
	}
	return out
}

// MustEmbeddedModel is EmbeddedModel for tests and benchmarks; it panics when the
// embedded policy does not load, which its own tests rule out.
func MustEmbeddedModel() *Model {
	m, err := EmbeddedModel(context.Background())
	if err != nil {
		panic(err)
	}
	return m
}

// addIndex adds tuple to a spec's index tuples, once.
func addIndex(tuples *[][]Path, tuple []Path) {
	if !slices.ContainsFunc(*tuples, func(have []Path) bool {
		return slices.EqualFunc(have, tuple, func(a, b Path) bool { return slices.Equal(a, b) })
	}) {
		*tuples = append(*tuples, tuple)
	}
}
