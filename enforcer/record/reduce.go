package record

import (
	"fmt"
	"reflect"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kjson "sigs.k8s.io/json"
)

// reduction gathers what a record keeps while an object is read.
type reduction struct {
	s       *Shape
	values  []string
	present uint64
	lists   [][]string
	extra   []condition
	seen    uint64 // condition types whose first entry is kept
}

func (s *Shape) reduction() *reduction {
	return &reduction{s: s, values: make([]string, s.slots)}
}

func (x *reduction) set(slot int, v string, ok bool) {
	if ok {
		x.values[slot] = v
		x.present |= 1 << slot
	}
}

func (x *reduction) list(i int, l []string) {
	if len(l) == 0 {
		return
	}
	if x.lists == nil {
		x.lists = make([][]string, len(x.s.spec.Lists))
	}
	x.lists[i] = l
}

// condition keeps one condition entry of type t, if t is kept.
func (x *reduction) condition(t string, vals []string, oks []bool) {
	ti := slices.Index(x.s.spec.Conditions.Types, t)
	if ti < 0 {
		return
	}
	if x.seen&(1<<ti) != 0 {
		// A second entry of one type: the criteria read every entry, so
		// keep it too (the API server does not forbid it).
		x.extra = append(x.extra, condition{typ: ti, values: vals, present: oks})
		return
	}
	x.seen |= 1 << ti
	for k := range x.s.condKeys {
		x.set(x.s.condSlot+ti*len(x.s.condKeys)+k, vals[k], oks[k])
	}
}

func (x *reduction) record() *Record {
	s := x.s
	if s.spec.APIVersion != "" {
		x.set(slotAPIVersion, s.spec.APIVersion, true)
	}
	if s.spec.Kind != "" {
		x.set(slotKind, s.spec.Kind, true)
	}
	return s.build(x.values, x.present|x.seen<<MaxSlots, x.lists, x.extra)
}

// Reduce keeps what the shape declares of obj: an Unstructured, or a typed
// object (a pointer to a struct, such as a *corev1.Node), read through its
// JSON tags as it would encode. It is the one way an object becomes a record.
func (s *Shape) Reduce(obj any) (*Record, error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		return s.FromUnstructured(u), nil
	}
	t := reflect.TypeOf(obj)
	if t == nil || t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct {
		return nil, fmt.Errorf("record: want an object, got %T", obj)
	}
	rd, err := s.reader(t.Elem())
	if err != nil {
		return nil, err
	}
	v := reflect.ValueOf(obj)
	if v.IsNil() {
		return nil, fmt.Errorf("record: nil %T", obj)
	}
	x := s.reduction()
	rd.read(v.Elem(), x)
	return x.record(), nil
}

// FromUnstructured keeps what the shape declares of u.
func (s *Shape) FromUnstructured(u *unstructured.Unstructured) *Record {
	x := s.reduction()
	for i, p := range s.paths {
		v, ok, _ := unstructured.NestedFieldNoCopy(u.Object, p...)
		str, isString := v.(string)
		x.set(i, str, ok && isString)
	}
	for i, p := range s.spec.Lists {
		l, _, _ := unstructured.NestedStringSlice(u.Object, p...)
		x.list(i, l)
	}
	if c := s.spec.Conditions; len(c.Types) > 0 {
		list, _, _ := unstructured.NestedFieldNoCopy(u.Object, c.Path...)
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
			x.condition(t, vals, oks)
		}
	}
	return x.record()
}

// FromJSON decodes an object (an AdmissionReview's oldObject) keeping only
// what the shape declares. It decodes into a struct type built once from the
// paths, so everything else is skipped without being built: a hostile object
// (hundreds of thousands of nested objects, a huge status) costs about its
// own size in memory, not a map per level. Field names match
// case-sensitively, as the API server's own decoding does; a kept field that
// is not a string (a list entry that is not one) is an error.
func (s *Shape) FromJSON(raw []byte) (*Record, error) {
	v := reflect.New(s.decoded)
	if err := kjson.UnmarshalCaseSensitivePreserveInts(raw, v.Interface()); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	return s.Reduce(v.Interface())
}
