// Package nodecache keeps the Nodes of one cluster as the orphan criteria
// read them: each Node reduced, by an informer transform, to the fields the
// policy declares (the link model's Node fields and the criteria's own,
// data.nodeguard.nodes.node_fields) plus its uid and resourceVersion for
// delete preconditions, in a few hundred bytes; and an index from what a
// Machine, InfraMachine or pool could link by to the Nodes it could link,
// so a change to such an object re-judges only those Nodes.
package nodecache

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/nodeguard/nodeguard/enforcer/engine"
	"github.com/nodeguard/nodeguard/enforcer/linkmodel"
)

// Slots every Node keeps first.
const (
	slotName = iota
	slotUID
	slotResourceVersion
	fixedSlots
)

// MaxSlots bounds the strings kept per Node (its offsets live in the record
// itself), MaxConditionTypes the condition types.
const (
	MaxSlots          = 16
	MaxConditionTypes = 16
)

// Shape is what a Node cache keeps of each Node, derived from the policy.
type Shape struct {
	model  *linkmodel.Model
	fields *linkmodel.NodeFields
	// paths[i] is slot i's path, for the scalar slots (not conditions).
	paths []linkmodel.Path
	// condKeys are the condition keys kept besides "type"; the slot of type
	// t's key k is condSlot + t*len(condKeys) + k.
	condKeys []string
	condSlot int
	slots    int
	// typed reads a corev1.Node by the same paths, through its JSON tags.
	typed     []typedPath
	typedCond typedConditions
	// tuples are the links' Node-field tuples that need an index: all but
	// [metadata.name], which the store's key answers; tupleSlots their slots.
	tuples     [][]linkmodel.Path
	tupleSlots [][]int
}

// ShapeOf is the Node shape of the policy e runs: NewShape of its link
// model and its orphan criteria's Node fields, which it must have.
func ShapeOf(e *engine.Engine) (*Shape, error) {
	fields, err := e.NodeFields()
	if err != nil {
		return nil, err
	}
	return NewShape(e.Model(), fields)
}

// NewShape derives the Node shape from the link model and the orphan
// criteria's Node fields (engine.Engine.NodeFields).
func NewShape(model *linkmodel.Model, fields *linkmodel.NodeFields) (*Shape, error) {
	if fields == nil {
		return nil, fmt.Errorf("nodecache: the policy declares no Node fields for its orphan criteria (%s)", linkmodel.NodeFieldsQuery)
	}
	s := &Shape{model: model, fields: fields}
	s.paths = []linkmodel.Path{{"metadata", "name"}, {"metadata", "uid"}, {"metadata", "resourceVersion"}}
	for _, p := range append(model.NodePaths(), fields.Paths...) {
		if !slices.ContainsFunc(s.paths, func(have linkmodel.Path) bool { return slices.Equal(have, p) }) {
			s.paths = append(s.paths, p)
		}
	}
	for _, k := range fields.Conditions.Keys {
		if k != "type" {
			s.condKeys = append(s.condKeys, k)
		}
	}
	s.condSlot = len(s.paths)
	s.slots = s.condSlot + len(fields.Conditions.Types)*len(s.condKeys)
	if s.slots > MaxSlots || len(fields.Conditions.Types) > MaxConditionTypes {
		return nil, fmt.Errorf("nodecache: the policy declares %d Node strings and %d condition types, at most %d and %d",
			s.slots, len(fields.Conditions.Types), MaxSlots, MaxConditionTypes)
	}
	node := reflect.TypeFor[corev1.Node]()
	for _, p := range s.paths {
		tp, err := compileTyped(node, p)
		if err != nil {
			return nil, fmt.Errorf("nodecache: Node field %s: %w", p, err)
		}
		s.typed = append(s.typed, tp)
	}
	if len(fields.Conditions.Types) > 0 {
		var err error
		if s.typedCond, err = compileConditions(node, fields.Conditions.Path, s.condKeys); err != nil {
			return nil, fmt.Errorf("nodecache: Node conditions %s: %w", fields.Conditions.Path, err)
		}
	}
	for _, l := range model.Links {
		if len(l.Node) == 1 && slices.Equal(l.Node[0], linkmodel.Path{"metadata", "name"}) {
			continue
		}
		if slices.ContainsFunc(s.tuples, func(have []linkmodel.Path) bool { return pathsEqual(have, l.Node) }) {
			continue
		}
		slots := make([]int, len(l.Node))
		for i, p := range l.Node {
			slots[i] = slices.IndexFunc(s.paths, func(have linkmodel.Path) bool { return slices.Equal(have, p) })
		}
		s.tuples, s.tupleSlots = append(s.tuples, l.Node), append(s.tupleSlots, slots)
	}
	return s, nil
}

func pathsEqual(a, b []linkmodel.Path) bool {
	return slices.EqualFunc(a, b, func(x, y linkmodel.Path) bool { return slices.Equal(x, y) })
}

// Record reduces a Node, typed or unstructured, to what the shape keeps.
func (s *Shape) Record(obj any) (*Node, error) {
	values := make([]string, s.slots)
	var present uint32
	var extra []condition
	set := func(slot int, v string, ok bool) {
		if ok {
			values[slot] = v
			present |= 1 << slot
		}
	}
	types := s.fields.Conditions.Types
	seen := uint32(0) // condition types whose first entry is kept
	keep := func(t string, vals []string, oks []bool) {
		ti := slices.Index(types, t)
		if ti < 0 {
			return
		}
		if seen&(1<<ti) != 0 {
			// A second entry of one type: the criteria read every entry, so
			// keep it too (the API server does not forbid it).
			extra = append(extra, condition{typ: ti, values: vals, present: oks})
			return
		}
		seen |= 1 << ti
		for k := range s.condKeys {
			set(s.condSlot+ti*len(s.condKeys)+k, vals[k], oks[k])
		}
	}
	switch o := obj.(type) {
	case *corev1.Node:
		v := reflect.ValueOf(o).Elem()
		for i, tp := range s.typed {
			x, ok := tp.get(v)
			set(i, x, ok)
		}
		if len(types) > 0 {
			s.typedCond.each(v, keep)
		}
	case *unstructured.Unstructured:
		for i, p := range s.paths {
			x, ok, _ := unstructured.NestedFieldNoCopy(o.Object, p...)
			str, isString := x.(string)
			set(i, str, ok && isString)
		}
		if len(types) > 0 {
			list, _, _ := unstructured.NestedFieldNoCopy(o.Object, s.fields.Conditions.Path...)
			items, _ := list.([]any)
			for _, item := range items {
				m, ok := item.(map[string]any)
				if !ok {
					continue
				}
				t, ok := m["type"].(string)
				if !ok {
					continue
				}
				vals, oks := make([]string, len(s.condKeys)), make([]bool, len(s.condKeys))
				for k, key := range s.condKeys {
					vals[k], oks[k] = m[key].(string)
				}
				keep(t, vals, oks)
			}
		}
	default:
		return nil, fmt.Errorf("nodecache: want a Node, got %T", obj)
	}
	return newNode(values, present|seen<<MaxSlots, extra), nil
}

// Object rebuilds the Node as the criteria see it: apiVersion, kind, the
// kept fields and the kept condition entries.
func (s *Shape) Object(n *Node) map[string]any {
	out := map[string]any{"apiVersion": "v1", "kind": "Node"}
	for i, p := range s.paths {
		if v, ok := n.value(i); ok {
			linkmodel.SetPath(out, p, v)
		}
	}
	types := s.fields.Conditions.Types
	var conditions []any
	entry := func(ti int, value func(k int) (string, bool)) map[string]any {
		c := map[string]any{"type": types[ti]}
		for k, key := range s.condKeys {
			if v, ok := value(k); ok {
				c[key] = v
			}
		}
		return c
	}
	for ti := range types {
		if n.present&(1<<(MaxSlots+ti)) == 0 {
			continue
		}
		conditions = append(conditions, entry(ti, func(k int) (string, bool) { return n.value(s.condSlot + ti*len(s.condKeys) + k) }))
	}
	for _, c := range n.extra() {
		conditions = append(conditions, entry(c.typ, func(k int) (string, bool) { return c.values[k], c.present[k] }))
	}
	if conditions != nil {
		linkmodel.SetPath(out, s.fields.Conditions.Path, conditions)
	}
	return out
}

// Unstructured is Object as an Unstructured.
func (s *Shape) Unstructured(n *Node) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: s.Object(n)}
}

// typedPath reads one path of JSON keys from a typed object: struct fields
// by their json tags, map keys, and a string (or a JSON string, such as a
// metav1.Time) at the end.
type typedPath []typedStep

type typedStep struct {
	field     []int  // a struct field, by index path
	omitEmpty bool   // its tag says omitempty: "" is absent in JSON
	mapKey    string // or a map key
	isMap     bool
}

func compileTyped(t reflect.Type, p linkmodel.Path) (typedPath, error) {
	var out typedPath
	for i, seg := range p {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		switch t.Kind() {
		case reflect.Struct:
			f, ok := jsonField(t, seg)
			if !ok {
				return nil, fmt.Errorf("%s has no field %q", t, seg)
			}
			_, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			out = append(out, typedStep{field: f.Index, omitEmpty: slices.Contains(strings.Split(opts, ","), "omitempty")})
			t = f.Type
		case reflect.Map:
			if t.Key().Kind() != reflect.String {
				return nil, fmt.Errorf("%s is not keyed by strings", t)
			}
			out = append(out, typedStep{mapKey: seg, isMap: true})
			t = t.Elem()
		default:
			return nil, fmt.Errorf("%s at %q is not an object", t, strings.Join(p[:i], "."))
		}
	}
	if !isStringLeaf(t) {
		return nil, fmt.Errorf("%s is not a string", t)
	}
	return out, nil
}

// jsonField finds the field a JSON key decodes into, through inline
// (embedded, untagged) structs as encoding/json does; an embedded struct with
// a name in its tag (ObjectMeta's "metadata") is a field like any other.
func jsonField(t reflect.Type, key string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			if inner, ok := jsonField(f.Type, key); ok {
				inner.Index = append([]int{i}, inner.Index...)
				return inner, true
			}
			continue
		}
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		if name == key {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

var marshaler = reflect.TypeFor[json.Marshaler]()

func isStringLeaf(t reflect.Type) bool {
	return t.Kind() == reflect.String || t.Implements(marshaler) || reflect.PointerTo(t).Implements(marshaler)
}

func (p typedPath) get(v reflect.Value) (string, bool) {
	for _, st := range p {
		for v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return "", false
			}
			v = v.Elem()
		}
		if st.isMap {
			if v.IsNil() {
				return "", false
			}
			v = v.MapIndex(reflect.ValueOf(st.mapKey).Convert(v.Type().Key()))
			if !v.IsValid() {
				return "", false
			}
			continue
		}
		v = v.FieldByIndex(st.field)
	}
	str, ok := leafString(v)
	if ok && str == "" && len(p) > 0 && p[len(p)-1].omitEmpty && v.Kind() == reflect.String {
		return "", false
	}
	return str, ok
}

// leafString is the JSON string a leaf encodes as; false for null, empty
// pointers or anything not a string, as the criteria see those.
func leafString(v reflect.Value) (string, bool) {
	if v.Kind() == reflect.Pointer && v.IsNil() {
		return "", false
	}
	if v.Kind() == reflect.String {
		return v.String(), true
	}
	m, ok := v.Interface().(json.Marshaler)
	if !ok && v.CanAddr() {
		m, ok = v.Addr().Interface().(json.Marshaler)
	}
	if !ok {
		return "", false
	}
	raw, err := m.MarshalJSON()
	if err != nil || len(raw) == 0 || raw[0] != '"' {
		return "", false
	}
	s, err := strconv.Unquote(string(raw))
	return s, err == nil
}

// typedConditions reads a list of condition structs by their "type" and keys.
type typedConditions struct {
	list typedPath
	typ  typedPath
	keys []typedPath
}

func compileConditions(t reflect.Type, p linkmodel.Path, keys []string) (typedConditions, error) {
	var out typedConditions
	list, err := compileList(t, p)
	if err != nil {
		return out, err
	}
	out.list = list.path
	if out.typ, err = compileTyped(list.elem, linkmodel.Path{"type"}); err != nil {
		return out, err
	}
	for _, k := range keys {
		kp, err := compileTyped(list.elem, linkmodel.Path{k})
		if err != nil {
			return out, err
		}
		out.keys = append(out.keys, kp)
	}
	return out, nil
}

type listPath struct {
	path typedPath
	elem reflect.Type
}

// compileList is compileTyped for a path that ends at a slice of structs.
func compileList(t reflect.Type, p linkmodel.Path) (listPath, error) {
	var out typedPath
	for _, seg := range p {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return listPath{}, fmt.Errorf("%s is not an object", t)
		}
		f, ok := jsonField(t, seg)
		if !ok {
			return listPath{}, fmt.Errorf("%s has no field %q", t, seg)
		}
		out = append(out, typedStep{field: f.Index})
		t = f.Type
	}
	if t.Kind() != reflect.Slice || t.Elem().Kind() != reflect.Struct {
		return listPath{}, fmt.Errorf("%s is not a list of objects", t)
	}
	return listPath{path: out, elem: t.Elem()}, nil
}

func (c typedConditions) each(v reflect.Value, keep func(t string, vals []string, oks []bool)) {
	for _, st := range c.list {
		v = v.FieldByIndex(st.field)
	}
	for i := range v.Len() {
		item := v.Index(i)
		t, ok := c.typ.get(item)
		if !ok {
			continue
		}
		vals, oks := make([]string, len(c.keys)), make([]bool, len(c.keys))
		for k, kp := range c.keys {
			vals[k], oks[k] = kp.get(item)
		}
		keep(t, vals, oks)
	}
}
