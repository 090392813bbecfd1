package linkmodel

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
	"unicode"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kjson "sigs.k8s.io/json"
)

// nodeDecoder decodes a Node keeping only the declared Node fields. It
// decodes into a struct type built once from the paths, so everything else is
// skipped without being built: a hostile oldObject (hundreds of thousands of
// nested objects, a huge status) costs about its own size in memory, not an
// Unstructured map per level.
type nodeDecoder struct {
	typ  reflect.Type
	tree *pathTree
}

// pathTree is the declared Node fields as a tree; a leaf (no children) is a
// string field.
type pathTree struct {
	keys     []string // sorted; field i of the struct decodes keys[i]
	children map[string]*pathTree
}

func newNodeDecoder(paths []Path) (nodeDecoder, error) {
	root := &pathTree{children: map[string]*pathTree{}}
	for _, p := range append([]Path{{"apiVersion"}, {"kind"}}, paths...) {
		t := root
		for i, seg := range p {
			if !validTag(seg) {
				return nodeDecoder{}, fmt.Errorf("node field %s: segment %q cannot be decoded by name", p, seg)
			}
			last := i == len(p)-1
			c, ok := t.children[seg]
			if !ok {
				c = &pathTree{}
				if !last {
					c.children = map[string]*pathTree{}
				}
				t.children[seg] = c
			} else if last != (c.children == nil) {
				return nodeDecoder{}, fmt.Errorf("node field %s overlaps another node field", p)
			}
			t = c
		}
	}
	typ, err := root.structType()
	if err != nil {
		return nodeDecoder{}, err
	}
	return nodeDecoder{typ: typ, tree: root}, nil
}

// structType builds the struct decoding t: a *string per leaf (nil: absent),
// a nested struct per inner node, each tagged with its JSON key.
func (t *pathTree) structType() (reflect.Type, error) {
	t.keys = t.keys[:0]
	for k := range t.children {
		t.keys = append(t.keys, k)
	}
	sort.Strings(t.keys)
	fields := make([]reflect.StructField, len(t.keys))
	for i, k := range t.keys {
		c := t.children[k]
		typ := reflect.TypeFor[*string]()
		if c.children != nil {
			var err error
			if typ, err = c.structType(); err != nil {
				return nil, err
			}
		}
		fields[i] = reflect.StructField{Name: fmt.Sprintf("F%d", i), Type: typ, Tag: reflect.StructTag(fmt.Sprintf("json:%q", k))}
	}
	return reflect.StructOf(fields), nil
}

// validTag mirrors encoding/json's rule for a key usable as a struct tag name;
// a key it would not accept would silently decode nothing.
func validTag(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		switch {
		case strings.ContainsRune("!#$%&()*+-./:;<=>?@[]^_{|}~ ", c):
		case !unicode.IsLetter(c) && !unicode.IsDigit(c):
			return false
		}
	}
	return true
}

// NodeFromJSON decodes a Node (an AdmissionReview's oldObject) keeping only
// apiVersion, kind and the declared Node fields. Field names match
// case-sensitively, as the API server's own decoding does; a declared field
// that is not a string is an error.
func (m *Model) NodeFromJSON(raw []byte) (*unstructured.Unstructured, error) {
	v := reflect.New(m.node.typ)
	if err := kjson.UnmarshalCaseSensitivePreserveInts(raw, v.Interface()); err != nil {
		return nil, fmt.Errorf("decode Node: %w", err)
	}
	out := map[string]any{}
	m.node.tree.collect(v.Elem(), out)
	return &unstructured.Unstructured{Object: out}, nil
}

func (t *pathTree) collect(v reflect.Value, out map[string]any) {
	for i, k := range t.keys {
		f := v.Field(i)
		c := t.children[k]
		if c.children == nil {
			if !f.IsNil() {
				out[k] = f.Elem().String()
			}
			continue
		}
		sub := map[string]any{}
		c.collect(f, sub)
		if len(sub) > 0 {
			out[k] = sub
		}
	}
}

// StripNode keeps only what the rule reads of a Node, as NodeFromJSON does:
// the rule's input then costs the same for every Node, whatever its status,
// labels or managed fields hold.
func (m *Model) StripNode(u *unstructured.Unstructured) *unstructured.Unstructured {
	out := map[string]any{}
	for _, p := range m.stripped {
		if s, ok, _ := unstructured.NestedString(u.Object, p...); ok {
			SetPath(out, p, s)
		}
	}
	return &unstructured.Unstructured{Object: out}
}

// SetPath sets a nested field of an Unstructured-shaped map, creating the
// maps on the way.
func SetPath(m map[string]any, p Path, v any) {
	for _, seg := range p[:len(p)-1] {
		c, ok := m[seg].(map[string]any)
		if !ok {
			c = map[string]any{}
			m[seg] = c
		}
		m = c
	}
	m[p[len(p)-1]] = v
}

// NodeValues returns the Node's values for link's Node fields, and false
// when one is missing or empty: the link then cannot hold.
func NodeValues(node *unstructured.Unstructured, l Link) ([]string, bool) {
	out := make([]string, len(l.Node))
	for i, p := range l.Node {
		s, ok, _ := unstructured.NestedString(node.Object, p...)
		if !ok || s == "" {
			return nil, false
		}
		out[i] = s
	}
	return out, true
}
