package record

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// reader reads a shape's fields from one Go type through its JSON tags.
type reader struct {
	slots []typedPath // by slot; nil: not read (a fixed apiVersion or kind)
	lists []listPath
	cond  *typedConditions
}

// reader returns the compiled reader of struct type t, compiling it once.
func (s *Shape) reader(t reflect.Type) (*reader, error) {
	if rd, ok := s.readers.Load(t); ok {
		return rd.(*reader), nil
	}
	rd := &reader{slots: make([]typedPath, len(s.paths))}
	for i, p := range s.paths {
		if (i == slotAPIVersion && s.spec.APIVersion != "") || (i == slotKind && s.spec.Kind != "") {
			continue
		}
		tp, err := compileTyped(t, p)
		if err != nil {
			return nil, fmt.Errorf("record: %s field %s: %w", t, p, err)
		}
		rd.slots[i] = tp
	}
	for _, p := range s.spec.Lists {
		l, err := compileList(t, p)
		if err != nil {
			return nil, fmt.Errorf("record: %s list %s: %w", t, p, err)
		}
		if !isStringLeaf(l.elem) {
			return nil, fmt.Errorf("record: %s list %s: %s is not a string", t, p, l.elem)
		}
		rd.lists = append(rd.lists, l)
	}
	if c := s.spec.Conditions; len(c.Types) > 0 {
		tc, err := compileConditions(t, c.Path, s.condKeys)
		if err != nil {
			return nil, fmt.Errorf("record: %s conditions %s: %w", t, c.Path, err)
		}
		rd.cond = &tc
	}
	actual, _ := s.readers.LoadOrStore(t, rd)
	return actual.(*reader), nil
}

func (rd *reader) read(v reflect.Value, x *reduction) {
	for i, tp := range rd.slots {
		if tp != nil {
			str, ok := tp.get(v)
			x.set(i, str, ok)
		}
	}
	for i, l := range rd.lists {
		x.list(i, l.strings(v))
	}
	if rd.cond != nil {
		rd.cond.each(v, x.condition)
	}
}

// strings reads a list of strings.
func (l listPath) strings(v reflect.Value) []string {
	v, ok := follow(v, l.path)
	if !ok || v.Kind() != reflect.Slice || v.Len() == 0 {
		return nil
	}
	var out []string
	for i := range v.Len() {
		if s, ok := leafString(v.Index(i)); ok {
			out = append(out, s)
		}
	}
	return out
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

func compileTyped(t reflect.Type, p Path) (typedPath, error) {
	out, t, err := compileSteps(t, p, true)
	if err == nil && !isStringLeaf(t) {
		err = fmt.Errorf("%s is not a string", t)
	}
	return out, err
}

// compileSteps compiles the steps of p from t, through struct fields and,
// when maps is set, map keys; it returns the type p ends at.
func compileSteps(t reflect.Type, p Path, maps bool) (typedPath, reflect.Type, error) {
	var out typedPath
	for i, seg := range p {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		switch {
		case t.Kind() == reflect.Struct:
			f, ok := jsonField(t, seg)
			if !ok {
				return nil, nil, fmt.Errorf("%s has no field %q", t, seg)
			}
			_, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			out = append(out, typedStep{field: f.Index, omitEmpty: slices.Contains(strings.Split(opts, ","), "omitempty")})
			t = f.Type
		case maps && t.Kind() == reflect.Map:
			if t.Key().Kind() != reflect.String {
				return nil, nil, fmt.Errorf("%s is not keyed by strings", t)
			}
			out = append(out, typedStep{mapKey: seg, isMap: true})
			t = t.Elem()
		default:
			return nil, nil, fmt.Errorf("%s at %q is not an object", t, strings.Join(p[:i], "."))
		}
	}
	return out, t, nil
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
	for t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.String {
		t = t.Elem()
	}
	return t.Kind() == reflect.String || t.Implements(marshaler) || reflect.PointerTo(t).Implements(marshaler)
}

func (p typedPath) get(v reflect.Value) (string, bool) {
	v, ok := p.walk(v)
	if !ok {
		return "", false
	}
	str, ok := leafString(v)
	if ok && str == "" && len(p) > 0 && p[len(p)-1].omitEmpty && v.Kind() == reflect.String {
		return "", false
	}
	return str, ok
}

// walk follows p from v, through pointers, struct fields and map keys;
// false at a nil pointer or map, or a missing key.
func (p typedPath) walk(v reflect.Value) (reflect.Value, bool) {
	for _, st := range p {
		var ok bool
		if v, ok = deref(v); !ok {
			return v, false
		}
		if !st.isMap {
			v = v.FieldByIndex(st.field)
			continue
		}
		if v.IsNil() {
			return v, false
		}
		if v = v.MapIndex(reflect.ValueOf(st.mapKey).Convert(v.Type().Key())); !v.IsValid() {
			return v, false
		}
	}
	return v, true
}

// leafString is the JSON string a leaf encodes as; false for null, empty
// pointers or anything not a string, as the criteria see those.
func leafString(v reflect.Value) (string, bool) {
	if v.Kind() == reflect.Pointer && v.IsNil() {
		return "", false
	}
	if v.Kind() == reflect.Pointer && v.Elem().Kind() == reflect.String {
		v = v.Elem()
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

func compileConditions(t reflect.Type, p Path, keys []string) (typedConditions, error) {
	var out typedConditions
	list, err := compileList(t, p)
	if err != nil {
		return out, err
	}
	if list.elem.Kind() != reflect.Struct {
		return out, fmt.Errorf("%s is not a list of objects", list.elem)
	}
	out.list = list.path
	if out.typ, err = compileTyped(list.elem, Path{"type"}); err != nil {
		return out, err
	}
	for _, k := range keys {
		kp, err := compileTyped(list.elem, Path{k})
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

// compileList is compileTyped for a path of struct fields that ends at a
// slice.
func compileList(t reflect.Type, p Path) (listPath, error) {
	out, t, err := compileSteps(t, p, false)
	if err != nil {
		return listPath{}, err
	}
	if t.Kind() != reflect.Slice {
		return listPath{}, fmt.Errorf("%s is not a list", t)
	}
	return listPath{path: out, elem: t.Elem()}, nil
}

func (c typedConditions) each(v reflect.Value, keep func(t string, vals []string, oks []bool)) {
	v, ok := follow(v, c.list)
	if !ok {
		return
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

// follow walks p from v and through the pointers it ends at.
func follow(v reflect.Value, p typedPath) (reflect.Value, bool) {
	if v, ok := p.walk(v); ok {
		return deref(v)
	}
	return v, false
}

func deref(v reflect.Value) (reflect.Value, bool) {
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return v, false
		}
		v = v.Elem()
	}
	return v, true
}
