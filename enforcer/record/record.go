package record

import (
	"encoding/binary"
	"math/bits"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// Record is what is cached of one object: the strings its shape keeps, in
// one allocation that starts with their end offsets, and a word saying which
// are present. A string that is a canonical UUID (a uid) or an RFC 3339 UTC
// time (creation, deletion and transition times) is kept in binary, 16 or 8
// bytes instead of 36 or 20, and rebuilt to the same string; the high bit of
// its end offset says so. Lists, a second condition of one kept type, and
// strings passing 32 KiB in all (annotations can) are kept in rare instead.
// A record is immutable once built.
type Record struct {
	shape   *Shape
	present uint64 // bit i < MaxSlots: slot i; bit MaxSlots+t: a condition of type t
	data    string
	rare    *rare
}

const (
	packed     = 1 << 15 // in an end offset: the string is binary
	maxInline  = packed - 1
	uuidLength = 16
	timeLength = 8
)

type rare struct {
	values []string   // by slot, instead of data
	lists  [][]string // by list
	extra  []condition
}

// condition is a second (or later) entry of a kept condition type.
type condition struct {
	typ     int
	values  []string
	present []bool
}

var (
	_ runtime.Object            = (*Record)(nil)
	_ metav1.ObjectMetaAccessor = (*Record)(nil)
)

func (s *Shape) build(values []string, present uint64, lists [][]string, extra []condition) *Record {
	r := &Record{shape: s, present: present}
	if lists != nil || extra != nil {
		r.rare = &rare{lists: lists, extra: extra}
	}
	total := 0
	for _, v := range values {
		total += len(v)
	}
	if total > maxInline {
		if r.rare == nil {
			r.rare = &rare{}
		}
		r.rare.values = values
		return r
	}
	// The strings, packed, go to a buffer on the stack (for all but large
	// records) so that the record's data is its only allocation.
	var ends [MaxSlots]uint16
	var scratch [512]byte
	body := scratch[:0]
	for i, v := range values {
		var ok bool
		if body, ok = appendPacked(body, v); !ok {
			body = append(body, v...)
		}
		ends[i] = uint16(len(body))
		if ok {
			ends[i] |= packed
		}
	}
	var b strings.Builder
	b.Grow(2*len(values) + len(body))
	for _, end := range ends[:len(values)] {
		b.WriteByte(byte(end))
		b.WriteByte(byte(end >> 8))
	}
	b.Write(body)
	r.data = b.String()
	return r
}

// appendPacked appends v in binary when unpack rebuilds exactly v from it.
func appendPacked(b []byte, v string) ([]byte, bool) {
	switch len(v) {
	case 36:
		u, err := uuid.Parse(v)
		if err != nil || u.String() != v {
			return b, false
		}
		return append(b, u[:]...), true
	case 20:
		t, err := time.Parse(time.RFC3339, v)
		if err != nil || t.UTC().Format(time.RFC3339) != v {
			return b, false
		}
		return binary.BigEndian.AppendUint64(b, uint64(t.Unix())), true
	}
	return b, false
}

func unpack(b string) string {
	if len(b) == uuidLength {
		var u uuid.UUID
		copy(u[:], b)
		return u.String()
	}
	return time.Unix(int64(binary.BigEndian.Uint64([]byte(b))), 0).UTC().Format(time.RFC3339)
}

// Value returns the string in slot i (Shape.Slot), and whether it is present.
func (r *Record) Value(i int) (string, bool) {
	if i < 0 || r.present&(1<<i) == 0 {
		return "", false
	}
	if r.rare != nil && r.rare.values != nil {
		return r.rare.values[i], true
	}
	base := 2 * r.shape.slots
	start := uint16(0)
	if i > 0 {
		start = r.end(i-1) &^ packed
	}
	end := r.end(i)
	v := r.data[base+int(start) : base+int(end&^packed)]
	if end&packed != 0 {
		return unpack(v), true
	}
	return v, true
}

// end is slot i's end offset, as build wrote it (little-endian).
func (r *Record) end(i int) uint16 { return uint16(r.data[2*i]) | uint16(r.data[2*i+1])<<8 }

// Get returns the string at p, a field the shape keeps, and whether it is
// present.
func (r *Record) Get(p Path) (string, bool) { return r.Value(r.shape.Slot(p)) }

// List returns the list in list slot i (Shape.ListSlot); nil when unset.
func (r *Record) List(i int) []string {
	if i < 0 || r.rare == nil || r.rare.lists == nil {
		return nil
	}
	return r.rare.lists[i]
}

func (r *Record) extra() []condition {
	if r.rare == nil {
		return nil
	}
	return r.rare.extra
}

// Shape is what the record keeps.
func (r *Record) Shape() *Shape { return r.shape }

// APIVersion returns the object's apiVersion.
func (r *Record) APIVersion() string { v, _ := r.Value(slotAPIVersion); return v }

// Kind returns the object's kind.
func (r *Record) Kind() string { v, _ := r.Value(slotKind); return v }

// Namespace returns the object's namespace.
func (r *Record) Namespace() string { v, _ := r.Value(slotNamespace); return v }

// Name returns the object's name.
func (r *Record) Name() string { v, _ := r.Value(slotName); return v }

// UID is the object's uid, when its shape keeps it.
func (r *Record) UID() types.UID { v, _ := r.Value(r.shape.uidSlot); return types.UID(v) }

// ResourceVersion is the object's resourceVersion, when its shape keeps it.
func (r *Record) ResourceVersion() string { v, _ := r.Value(r.shape.rvSlot); return v }

// Equal reports whether r and o keep the same of one shape.
func (r *Record) Equal(o *Record) bool { return r.equal(o, 0) }

// EqualIgnoring is Equal but for the string at p: a Node's resourceVersion
// changes with every status report of its kubelet, nothing judged with it.
func (r *Record) EqualIgnoring(o *Record, ps ...Path) bool {
	skip := uint64(0)
	for _, p := range ps {
		if i := r.shape.Slot(p); i >= 0 {
			skip |= 1 << i
		}
	}
	return r.equal(o, skip)
}

func (r *Record) equal(o *Record, skip uint64) bool {
	if r.shape != o.shape {
		return false
	}
	if r.present&^skip != o.present&^skip {
		return false
	}
	if skip == 0 && r.data != "" && o.data != "" {
		if r.data != o.data {
			return false
		}
	} else {
		for i := range r.shape.slots {
			if skip&(1<<i) != 0 {
				continue
			}
			a, _ := r.Value(i)
			b, _ := o.Value(i)
			if a != b {
				return false
			}
		}
	}
	for i := range r.shape.spec.Lists {
		if !slices.Equal(r.List(i), o.List(i)) {
			return false
		}
	}
	ea, eb := r.extra(), o.extra()
	return slices.EqualFunc(ea, eb, func(a, b condition) bool {
		return a.typ == b.typ && slices.Equal(a.values, b.values) && slices.Equal(a.present, b.present)
	})
}

// Object rebuilds the object as the rule sees it: Gatekeeper's shape, with
// only the kept fields and condition entries.
func (r *Record) Object() map[string]any {
	s := r.shape
	out := map[string]any{}
	for present := r.present & (1<<s.condSlot - 1); present != 0; present &= present - 1 {
		i := bits.TrailingZeros64(present)
		v, _ := r.Value(i)
		if i == slotNamespace && v == "" {
			continue
		}
		SetPath(out, s.paths[i], v)
	}
	for i, l := range s.spec.Lists {
		list := r.List(i)
		if len(list) == 0 {
			continue
		}
		items := make([]any, len(list))
		for j, v := range list {
			items[j] = v
		}
		SetPath(out, l, items)
	}
	types := s.spec.Conditions.Types
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
		if r.present&(1<<(MaxSlots+ti)) == 0 {
			continue
		}
		conditions = append(conditions, entry(ti, func(k int) (string, bool) { return r.Value(s.condSlot + ti*len(s.condKeys) + k) }))
	}
	for _, c := range r.extra() {
		conditions = append(conditions, entry(c.typ, func(k int) (string, bool) { return c.values[k], c.present[k] }))
	}
	if conditions != nil {
		SetPath(out, s.spec.Conditions.Path, conditions)
	}
	return out
}

// Unstructured is Object as an Unstructured.
func (r *Record) Unstructured() *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: r.Object()}
}

// GetObjectKind lets a record sit in an informer's store; the store does not
// read it.
func (r *Record) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject returns r: a record is immutable.
func (r *Record) DeepCopyObject() runtime.Object { return r }

// GetObjectMeta gives client-go's key functions the namespace and name (and
// the reflector the resourceVersion, when kept); built on demand so the
// record does not carry a whole ObjectMeta.
func (r *Record) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: r.Namespace(), Name: r.Name(), UID: r.UID(), ResourceVersion: r.ResourceVersion()}
}
