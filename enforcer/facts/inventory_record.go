package facts

import (
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeguard/nodeguard/enforcer/record"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// reference reads an object reference from the record's reference slots:
// v1beta2 {apiGroup, kind, name} in the object's namespace, or v1beta1
// {apiVersion, kind, name, namespace}. The version of the returned GVK is
// the ref's own (v1beta1) or empty (v1beta2).
func reference(r *record.Record, slots [5]int) (Ref, bool) {
	apiGroup, hasGroup := r.Value(slots[0])
	apiVersion, _ := r.Value(slots[1])
	kind, _ := r.Value(slots[2])
	name, _ := r.Value(slots[3])
	ns, _ := r.Value(slots[4])
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
		ns = r.Namespace()
	}
	return Ref{GVK: gvk, Namespace: ns, Name: name}, true
}

// LinkValues returns what r, a record of l's role, holds for link l's
// fields: one tuple, in the order of l.Fields, for an "equal" link; one per
// list entry for a "contains" link; none when a field is missing or empty,
// since a link never holds then.
func LinkValues(r *record.Record, l rule.Link) [][]string {
	s := r.Shape()
	if l.Match == rule.Contains {
		var out [][]string
		for _, v := range r.List(s.ListSlot(l.Fields[0])) {
			if v != "" {
				out = append(out, []string{v})
			}
		}
		return out
	}
	tuple := make([]string, len(l.Fields))
	for i, f := range l.Fields {
		v, _ := r.Value(s.Slot(f))
		if v == "" {
			return nil
		}
		tuple[i] = v
	}
	return [][]string{tuple}
}
