package record

import (
	"fmt"
	"reflect"
	"sort"
)

// pathTree is the kept fields as a tree; a leaf has a type and no children.
type pathTree struct {
	leaf     reflect.Type
	children map[string]*pathTree
}

// jsonType builds the struct type FromJSON decodes into: a *string per
// string field (nil: absent), a []*string per list, a list of structs of
// *string for the conditions, a nested struct per object on the way, each
// field tagged with its JSON key.
func (s *Shape) jsonType() (reflect.Type, error) {
	root := &pathTree{children: map[string]*pathTree{}}
	str := reflect.TypeFor[*string]()
	for _, p := range s.paths {
		if err := root.add(p, str); err != nil {
			return nil, err
		}
	}
	for _, p := range s.spec.Lists {
		if err := root.add(p, reflect.TypeFor[[]*string]()); err != nil {
			return nil, err
		}
	}
	if c := s.spec.Conditions; len(c.Types) > 0 {
		entry := &pathTree{children: map[string]*pathTree{"type": {leaf: str}}}
		for _, k := range s.condKeys {
			if !validTag(k) {
				return nil, fmt.Errorf("record: condition key %q cannot be decoded by name", k)
			}
			entry.children[k] = &pathTree{leaf: str}
		}
		if err := root.add(c.Path, reflect.SliceOf(entry.structType())); err != nil {
			return nil, err
		}
	}
	return root.structType(), nil
}

func (t *pathTree) add(p Path, leaf reflect.Type) error {
	for i, seg := range p {
		if !validTag(seg) {
			return fmt.Errorf("record: field %s: segment %q cannot be decoded by name", p, seg)
		}
		last := i == len(p)-1
		c, ok := t.children[seg]
		if !ok {
			c = &pathTree{}
			if last {
				c.leaf = leaf
			} else {
				c.children = map[string]*pathTree{}
			}
			t.children[seg] = c
		} else if last || c.children == nil {
			return fmt.Errorf("record: field %s overlaps another kept field", p)
		}
		t = c
	}
	return nil
}

func (t *pathTree) structType() reflect.Type {
	keys := make([]string, 0, len(t.children))
	for k := range t.children {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fields := make([]reflect.StructField, len(keys))
	for i, k := range keys {
		c := t.children[k]
		typ := c.leaf
		if typ == nil {
			typ = c.structType()
		}
		fields[i] = reflect.StructField{Name: fmt.Sprintf("F%d", i), Type: typ, Tag: reflect.StructTag(fmt.Sprintf("json:%q", k))}
	}
	return reflect.StructOf(fields)
}
