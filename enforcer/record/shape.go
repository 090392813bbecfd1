package record

import (
	"fmt"
	"hash/maphash"
	"reflect"
	"slices"
	"sync"
)

// Slots every record keeps first: an object's key.
const (
	slotAPIVersion = iota
	slotKind
	slotNamespace
	slotName
	fixedSlots
)

// MaxSlots bounds the strings kept per record (the fixed four, the scalars
// and the condition keys), MaxConditionTypes the condition types: a record
// notes which are present in one 64-bit word.
const (
	MaxSlots          = 48
	MaxConditionTypes = 64 - MaxSlots
)

// Spec declares what a Shape keeps of each object besides its apiVersion,
// kind, namespace and name.
type Spec struct {
	// APIVersion and Kind, when set, are every object's: a typed informer's
	// objects carry no TypeMeta. Unset, each object's own are kept.
	APIVersion, Kind string
	// Scalars are string fields; a field that is absent or not a string is
	// not present (the rule only compares these fields with strings).
	Scalars []Path
	// Lists are lists of strings.
	Lists []Path
	// Conditions are the entries of a list of conditions kept by type.
	Conditions Conditions
	// Indexes are the tuples records are found by (Find): string fields, or
	// one list field (a record is found by each of its entries).
	Indexes [][]Path
	// IndexBuckets is how many index values each tuple's records share (a
	// power of two up to 4096; 0: DefaultIndexBuckets). Fewer cost less
	// memory and a lookup more records to check (see index.go).
	IndexBuckets int
}

// Shape is what records of one kind of object keep, derived from a Spec (the
// link model derives one per role and for Nodes). Its records are read only
// through it.
type Shape struct {
	spec Spec
	// paths[i] is slot i's path, for the scalar slots (not conditions).
	paths []Path
	// condKeys are the condition keys kept besides "type"; the slot of type
	// t's key k is condSlot + t*len(condKeys) + k.
	condKeys []string
	condSlot int
	slots    int
	// indexes are spec.Indexes' tuples as slots; seed hashes their values.
	indexes []indexTuple
	seed    maphash.Seed
	buckets uint64
	uidSlot int
	rvSlot  int
	// decoded is the struct type FromJSON decodes into: a field per kept
	// path, so nothing else of the object is built.
	decoded reflect.Type
	// readers are the compiled typed readers, by reflect.Type.
	readers sync.Map
}

// NewShape checks spec and derives the shape.
func NewShape(spec Spec) (*Shape, error) {
	s := &Shape{spec: spec, uidSlot: -1, rvSlot: -1, seed: maphash.MakeSeed()}
	s.paths = []Path{{"apiVersion"}, {"kind"}, {"metadata", "namespace"}, {"metadata", "name"}}
	for _, p := range spec.Scalars {
		if err := checkPath(p); err != nil {
			return nil, err
		}
		if s.Slot(p) < 0 {
			s.paths = append(s.paths, p)
		}
	}
	s.spec.Lists = nil
	for _, p := range spec.Lists {
		if err := checkPath(p); err != nil {
			return nil, err
		}
		if s.Slot(p) >= 0 {
			return nil, fmt.Errorf("record: %s is kept both as a string and as a list", p)
		}
		if s.ListSlot(p) < 0 {
			s.spec.Lists = append(s.spec.Lists, p)
		}
	}
	c := spec.Conditions
	if len(c.Types) > 0 {
		if err := checkPath(c.Path); err != nil {
			return nil, err
		}
		for _, k := range c.Keys {
			if k != "type" {
				s.condKeys = append(s.condKeys, k)
			}
		}
	}
	s.condSlot = len(s.paths)
	s.slots = s.condSlot + len(c.Types)*len(s.condKeys)
	if s.slots > MaxSlots || len(c.Types) > MaxConditionTypes {
		return nil, fmt.Errorf("record: %d strings and %d condition types kept, at most %d and %d",
			s.slots, len(c.Types), MaxSlots, MaxConditionTypes)
	}
	s.buckets = uint64(spec.IndexBuckets)
	if s.buckets == 0 {
		s.buckets = DefaultIndexBuckets
	}
	if s.buckets > maxIndexBuckets || s.buckets&(s.buckets-1) != 0 {
		return nil, fmt.Errorf("record: %d index buckets: a power of two up to %d", spec.IndexBuckets, maxIndexBuckets)
	}
	for _, tuple := range spec.Indexes {
		x, err := s.indexTuple(tuple)
		if err != nil {
			return nil, err
		}
		s.indexes = append(s.indexes, x)
	}
	s.uidSlot, s.rvSlot = s.Slot(Path{"metadata", "uid"}), s.Slot(Path{"metadata", "resourceVersion"})
	var err error
	if s.decoded, err = s.jsonType(); err != nil {
		return nil, err
	}
	return s, nil
}

// indexTuple is one index tuple: the slots of its string fields, or the
// list slot of its one list field (list >= 0).
type indexTuple struct {
	slots []int
	list  int
}

func (x indexTuple) width() int {
	if x.list >= 0 {
		return 1
	}
	return len(x.slots)
}

func (s *Shape) indexTuple(tuple []Path) (indexTuple, error) {
	if len(tuple) == 1 {
		if l := s.ListSlot(tuple[0]); l >= 0 {
			return indexTuple{list: l}, nil
		}
	}
	x := indexTuple{list: -1, slots: make([]int, len(tuple))}
	if len(tuple) == 0 {
		return x, fmt.Errorf("record: an index tuple is empty")
	}
	for i, p := range tuple {
		if x.slots[i] = s.Slot(p); x.slots[i] < 0 {
			return x, fmt.Errorf("record: index field %s is not a kept string (nor a list indexed alone)", p)
		}
	}
	return x, nil
}

func checkPath(p Path) error {
	if len(p) == 0 || slices.Contains(p, "") {
		return fmt.Errorf("record: field path %q is empty or has an empty segment", p)
	}
	return nil
}

// Slot returns the position of string field p in the shape's records, or -1
// when it does not keep p.
func (s *Shape) Slot(p Path) int {
	return slices.IndexFunc(s.paths, func(have Path) bool { return slices.Equal(have, p) })
}

// ListSlot returns the position of list field p, or -1.
func (s *Shape) ListSlot(p Path) int {
	return slices.IndexFunc(s.spec.Lists, func(have Path) bool { return slices.Equal(have, p) })
}

// Scalars are the string fields kept besides the key, in slot order.
func (s *Shape) Scalars() []Path { return slices.Clone(s.paths[fixedSlots:]) }

// Lists are the list fields kept.
func (s *Shape) Lists() []Path { return slices.Clone(s.spec.Lists) }

// IndexOf returns the position of tuple among the shape's indexes, or -1.
func (s *Shape) IndexOf(tuple []Path) int {
	return slices.IndexFunc(s.spec.Indexes, func(have []Path) bool {
		return slices.EqualFunc(have, tuple, func(a, b Path) bool { return slices.Equal(a, b) })
	})
}
