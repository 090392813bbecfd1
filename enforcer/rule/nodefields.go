package rule

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/storage"

	"github.com/nodeguard/nodeguard/enforcer/record"
)

// NodeFieldsQuery is the orphan criteria's declaration of what they read of
// a Node besides the link model's Node fields.
const NodeFieldsQuery = "data.nodeguard.nodes.node_fields"

// NodeFields is that declaration: Paths to strings (declared by name, which
// only the criteria read; sorted by it), and Conditions, the entries of a list
// of conditions that the criteria read.
type NodeFields struct {
	Paths      []Path
	Conditions record.Conditions
}

// LoadNodeFields evaluates the declaration in a compiled policy with its
// data (nil: none). A policy without it yields nil and no error: it has no
// orphan criteria to feed.
func LoadNodeFields(ctx context.Context, compiled *ast.Compiler, store storage.Store) (*NodeFields, error) {
	if len(compiled.GetRulesForVirtualDocument(ast.MustParseRef(NodeFieldsQuery))) == 0 {
		return nil, nil
	}
	raw, err := declared(ctx, compiled, store, NodeFieldsQuery)
	if err != nil {
		return nil, err
	}
	return ParseNodeFields(raw)
}

// ParseNodeFields reads the declaration's JSON and checks it.
func ParseNodeFields(raw []byte) (*NodeFields, error) {
	var decl struct {
		Fields     map[string]Path   `json:"fields"`
		Conditions record.Conditions `json:"conditions"`
	}
	if err := json.Unmarshal(raw, &decl); err != nil {
		return nil, fmt.Errorf("decode %s: %w", NodeFieldsQuery, err)
	}
	f := NodeFields{Conditions: decl.Conditions}
	for _, name := range slices.Sorted(maps.Keys(decl.Fields)) {
		f.Paths = append(f.Paths, decl.Fields[name])
	}
	for _, p := range f.Paths {
		if err := checkPath(p); err != nil {
			return nil, fmt.Errorf("%s: %w", NodeFieldsQuery, err)
		}
	}
	c := f.Conditions
	if len(c.Types) > 0 || len(c.Keys) > 0 || len(c.Path) > 0 {
		if err := checkPath(c.Path); err != nil {
			return nil, fmt.Errorf("%s conditions: %w", NodeFieldsQuery, err)
		}
		if !slices.Contains(c.Keys, "type") {
			return nil, fmt.Errorf("%s conditions: keys must include \"type\", which selects the entries", NodeFieldsQuery)
		}
		if slices.Contains(c.Types, "") || slices.Contains(c.Keys, "") {
			return nil, fmt.Errorf("%s conditions: empty type or key", NodeFieldsQuery)
		}
	}
	return &f, nil
}

// Equal reports whether two declarations need the same Node caches.
func (f *NodeFields) Equal(other *NodeFields) bool {
	if f == nil || other == nil {
		return f == other
	}
	return slices.EqualFunc(f.Paths, other.Paths, func(a, b Path) bool { return slices.Equal(a, b) }) &&
		slices.Equal(f.Conditions.Path, other.Conditions.Path) &&
		slices.Equal(f.Conditions.Types, other.Conditions.Types) &&
		slices.Equal(f.Conditions.Keys, other.Conditions.Keys)
}

// NodeCacheShape is what a Node cache keeps of each Node for the orphan
// criteria, whose Node fields are fields: the link model's Node fields, the
// criteria's own and their conditions, the uid and resourceVersion (for
// delete preconditions), indexed by each link's Node fields (all but the
// name, which a store's key answers) so that an object's values find the
// Nodes it could link.
func (m *Model) NodeCacheShape(fields *NodeFields, extra ...Path) (*record.Shape, error) {
	if fields == nil {
		return nil, fmt.Errorf("the policy declares no Node fields for its orphan criteria (%s)", NodeFieldsQuery)
	}
	spec := record.Spec{
		APIVersion: "v1", Kind: "Node",
		Scalars:    slices.Concat([]Path{{"metadata", "uid"}, {"metadata", "resourceVersion"}}, m.NodePaths(), fields.Paths, extra),
		Conditions: fields.Conditions,
		// One cache per workload cluster, often a few thousand Nodes, read
		// off the admission path: few buckets, shared by many Nodes.
		IndexBuckets: nodeIndexBuckets,
	}
	for _, l := range m.Links {
		if len(l.Node) == 1 && isName(l.Node[0]) {
			continue
		}
		addIndex(&spec.Indexes, l.Node)
	}
	s, err := record.NewShape(spec)
	if err != nil {
		return nil, fmt.Errorf("Node cache: %w", err)
	}
	return s, nil
}

// nodeIndexBuckets is the Node caches' index buckets: at 5,000 Nodes a
// bucket holds ~20 (a lookup checks those), at 50,000 ~200.
const nodeIndexBuckets = 256
