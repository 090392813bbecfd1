package inventory

import (
	"fmt"
	"math/bits"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeguard/nodeguard/enforcer/linkmodel"
)

// Record is what the inventory caches of one object: its key and the fields
// the link model says the rule reads of its role, as plain strings. An
// Unstructured keeps each level in its own map (hundreds of bytes each); a
// Record costs a few hundred bytes in all. A field that is absent, or not a
// string, is not present: the rule only ever compares these fields with
// strings, so it cannot tell the two apart.
type Record struct {
	apiVersion, kind string
	namespace, name  string
	shape            *linkmodel.Shape
	present          uint64     // bit i: shape.Scalars[i] is present
	values           []string   // by shape.Scalars
	lists            [][]string // by shape.Lists; nil when none is set
}

var (
	_ runtime.Object            = (*Record)(nil)
	_ metav1.ObjectMetaAccessor = (*Record)(nil)
)

// GetObjectKind lets a Record sit in an informer's store; the store does not
// read it.
func (r *Record) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject copies the record; its strings are immutable.
func (r *Record) DeepCopyObject() runtime.Object {
	out := *r
	out.values = append([]string(nil), r.values...)
	if r.lists != nil {
		out.lists = make([][]string, len(r.lists))
		for i, l := range r.lists {
			out.lists[i] = append([]string(nil), l...)
		}
	}
	return &out
}

// GetObjectMeta gives client-go's key functions the namespace and name; it
// is built on demand so the record does not carry a whole ObjectMeta.
func (r *Record) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: r.namespace, Name: r.name}
}

// Namespace returns the object's namespace.
func (r *Record) Namespace() string { return r.namespace }

// Name returns the object's name.
func (r *Record) Name() string { return r.name }

// Kind returns the object's kind.
func (r *Record) Kind() string { return r.kind }

// NewRecord keeps what the rule reads of u, an object of the shape's role.
func NewRecord(u *unstructured.Unstructured, shape *linkmodel.Shape) *Record {
	r := &Record{
		apiVersion: u.GetAPIVersion(),
		kind:       u.GetKind(),
		namespace:  u.GetNamespace(),
		name:       u.GetName(),
		shape:      shape,
		values:     make([]string, len(shape.Scalars)),
	}
	for i, p := range shape.Scalars {
		if v, ok, _ := unstructured.NestedFieldNoCopy(u.Object, p...); ok {
			if s, ok := v.(string); ok {
				r.values[i] = s
				r.present |= 1 << i
			}
		}
	}
	for i, p := range shape.Lists {
		list, ok, _ := unstructured.NestedStringSlice(u.Object, p...)
		if !ok || len(list) == 0 {
			continue
		}
		if r.lists == nil {
			r.lists = make([][]string, len(shape.Lists))
		}
		r.lists[i] = list
	}
	return r
}

// Same reports whether r and o hold the same object as the rule reads it:
// the same key and kept fields.
func (r *Record) Same(o *Record) bool {
	if r.namespace != o.namespace || r.name != o.name || r.kind != o.kind || r.apiVersion != o.apiVersion ||
		r.shape != o.shape || r.present != o.present || len(r.lists) != len(o.lists) {
		return false
	}
	for i := range r.values {
		if r.values[i] != o.values[i] {
			return false
		}
	}
	for i := range r.lists {
		if !slices.Equal(r.lists[i], o.lists[i]) {
			return false
		}
	}
	return true
}

// value returns the scalar in slot i, and whether it is present.
func (r *Record) value(i int) (string, bool) {
	if i < 0 || r.present&(1<<i) == 0 {
		return "", false
	}
	return r.values[i], true
}

// list returns the list in slot i.
func (r *Record) list(i int) []string {
	if i < 0 || r.lists == nil {
		return nil
	}
	return r.lists[i]
}

// Unstructured rebuilds the object as the rule sees it: Gatekeeper's shape,
// with only the fields the record kept.
func (r *Record) Unstructured() *unstructured.Unstructured {
	meta := map[string]any{"name": r.name}
	if r.namespace != "" {
		meta["namespace"] = r.namespace
	}
	out := map[string]any{"apiVersion": r.apiVersion, "kind": r.kind, "metadata": meta}
	for present := r.present; present != 0; present &= present - 1 {
		i := bits.TrailingZeros64(present)
		linkmodel.SetPath(out, r.shape.Scalars[i], r.values[i])
	}
	for i, l := range r.lists {
		if len(l) == 0 {
			continue
		}
		list := make([]any, len(l))
		for j, id := range l {
			list[j] = id
		}
		linkmodel.SetPath(out, r.shape.Lists[i], list)
	}
	return &unstructured.Unstructured{Object: out}
}

// reference reads an object reference from the record's reference slots:
// v1beta2 {apiGroup, kind, name} in the object's namespace, or v1beta1
// {apiVersion, kind, name, namespace}. The version of the returned GVK is
// the ref's own (v1beta1) or empty (v1beta2).
func (r *Record) reference(slots [5]int) (Ref, bool) {
	apiGroup, hasGroup := r.value(slots[0])
	apiVersion, _ := r.value(slots[1])
	kind, _ := r.value(slots[2])
	name, _ := r.value(slots[3])
	ns, _ := r.value(slots[4])
	if kind == "" || name == "" {
		return Ref{}, false
	}
	gvk := schema.GroupVersionKind{Kind: kind}
	if hasGroup {
		gvk.Group = apiGroup
	} else if gv, err := schema.ParseGroupVersion(apiVersion); err == nil {
		gvk.Group, gvk.Version = gv.Group, gv.Version
	}
	if ns == "" {
		ns = r.namespace
	}
	return Ref{GVK: gvk, Namespace: ns, Name: name}, true
}

// recordOf reads a stored object.
func recordOf(obj any) (*Record, error) {
	r, ok := obj.(*Record)
	if !ok {
		return nil, fmt.Errorf("inventory holds %T, want *inventory.Record", obj)
	}
	return r, nil
}

// LinkValues returns what the record holds for link l's fields: one tuple,
// in the order of l.Fields, for an "equal" link; one per list entry for a
// "contains" link; none when a field is missing or empty, since a link never
// holds then. The record must be of l's role.
func (r *Record) LinkValues(l linkmodel.Link) [][]string {
	if l.Match == linkmodel.Contains {
		var out [][]string
		for _, v := range r.list(r.shape.ListSlot(l.Fields[0])) {
			if v != "" {
				out = append(out, []string{v})
			}
		}
		return out
	}
	tuple := make([]string, len(l.Fields))
	for i, f := range l.Fields {
		var v string
		switch {
		case slices.Equal(f, linkmodel.Path{"metadata", "namespace"}):
			v = r.namespace
		case slices.Equal(f, linkmodel.Path{"metadata", "name"}):
			v = r.name
		default:
			v, _ = r.value(r.shape.Slot(f))
		}
		if v == "" {
			return nil
		}
		tuple[i] = v
	}
	return [][]string{tuple}
}

// Value returns the record's string at p, a field its role keeps, and
// whether it is present.
func (r *Record) Value(p linkmodel.Path) (string, bool) { return r.value(r.shape.Slot(p)) }

// APIVersion returns the object's apiVersion.
func (r *Record) APIVersion() string { return r.apiVersion }
