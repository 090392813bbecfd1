package rule

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
)

// decode sets out, a non-nil pointer, from v, the value an entry point
// returned: a struct from an object, by its fields' json tags (embedded
// structs inline; "-" skipped; every other field required unless tagged
// omitempty), a slice from an array or a set, a string, a bool, or a pointer
// to one of these. Anything else in v, or missing, is an error: a policy
// whose answer does not have the expected shape decides nothing.
func decode(v ast.Value, out any) error {
	rv := reflect.ValueOf(out)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("decode into %T: want a non-nil pointer", out)
	}
	return decodeValue(v, rv.Elem())
}

func decodeValue(v ast.Value, out reflect.Value) error {
	switch out.Kind() {
	case reflect.Pointer:
		out.Set(reflect.New(out.Type().Elem()))
		return decodeValue(v, out.Elem())
	case reflect.String:
		s, ok := v.(ast.String)
		if !ok {
			return mistyped("a string", v)
		}
		out.SetString(string(s))
	case reflect.Bool:
		b, ok := v.(ast.Boolean)
		if !ok {
			return mistyped("a boolean", v)
		}
		out.SetBool(bool(b))
	case reflect.Slice:
		if set, ok := v.(ast.Set); ok {
			v = set.Sorted()
		}
		arr, ok := v.(*ast.Array)
		if !ok {
			return mistyped("an array", v)
		}
		s := reflect.MakeSlice(out.Type(), arr.Len(), arr.Len())
		for i := range arr.Len() {
			if err := decodeValue(arr.Elem(i).Value, s.Index(i)); err != nil {
				return fmt.Errorf("[%d]: %w", i, err)
			}
		}
		out.Set(s)
	case reflect.Struct:
		obj, ok := v.(ast.Object)
		if !ok {
			return mistyped("an object", v)
		}
		return decodeFields(obj, obj.Keys(), out)
	default:
		return fmt.Errorf("cannot decode into %s", out.Type())
	}
	return nil
}

// decodeFields decodes obj, whose keys are keys, into out's fields:
// looking each field up among the keys costs no allocation, where a lookup
// by a new key term costs two per field.
func decodeFields(obj ast.Object, keys []*ast.Term, out reflect.Value) error {
	t := out.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct:
			if err := decodeFields(obj, keys, out.Field(i)); err != nil {
				return err
			}
			continue
		case name == "-" || !f.IsExported():
			continue
		case name == "":
			name = f.Name
		}
		var term *ast.Term
		for _, k := range keys {
			if s, ok := k.Value.(ast.String); ok && string(s) == name {
				term = obj.Get(k)
				break
			}
		}
		if term == nil {
			if slices.Contains(strings.Split(opts, ","), "omitempty") {
				continue
			}
			return fmt.Errorf("field %q is missing", name)
		}
		if err := decodeValue(term.Value, out.Field(i)); err != nil {
			return fmt.Errorf("field %q: %w", name, err)
		}
	}
	return nil
}

func mistyped(want string, v ast.Value) error {
	return fmt.Errorf("want %s, got %s %v", want, ast.ValueName(v), v)
}
