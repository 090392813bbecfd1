package nodecache

import (
	"encoding/binary"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// Node is what a Node cache keeps of one Node: its kept strings in one
// allocation, with their end offsets, which bits say are present. A string
// that is a canonical UUID (a uid) or RFC 3339 UTC time (creation and
// transition times) is kept in binary, 16 or 8 bytes instead of 36 or 20, and
// rebuilt to the same string; the high bit of its end offset says so. A Node
// with more than 32 KiB of kept strings (annotations can be that large), or
// with two conditions of one kept type, keeps them in rare instead. It is
// immutable once built; its Shape reads it. A fleet's Nodes cost about 120
// bytes of strings each this way, and 64 for the rest.
type Node struct {
	data    string
	ends    [MaxSlots]uint16
	present uint32 // bit i < MaxSlots: slot i; bit MaxSlots+t: a condition of type t
	rare    *rare
}

const (
	packed     = 1 << 15 // in an end offset: the slot is binary
	maxInline  = packed - 1
	uuidLength = 16
	timeLength = 8
)

type rare struct {
	values []string // by slot, instead of data
	extra  []condition
}

// condition is a second (or later) entry of a kept condition type.
type condition struct {
	typ     int
	values  []string
	present []bool
}

var (
	_ runtime.Object            = (*Node)(nil)
	_ metav1.ObjectMetaAccessor = (*Node)(nil)
)

func newNode(values []string, present uint32, extra []condition) *Node {
	n := &Node{present: present}
	total := 0
	for _, v := range values {
		total += len(v)
	}
	if total > maxInline || extra != nil {
		n.rare = &rare{values: values, extra: extra}
		return n
	}
	var b strings.Builder
	b.Grow(total)
	for i, v := range values {
		bin, ok := pack(v)
		if ok {
			b.Write(bin)
		} else {
			b.WriteString(v)
		}
		n.ends[i] = uint16(b.Len())
		if ok {
			n.ends[i] |= packed
		}
	}
	n.data = b.String()
	return n
}

// pack returns v in binary when unpack rebuilds exactly v from it.
func pack(v string) ([]byte, bool) {
	switch len(v) {
	case 36:
		u, err := uuid.Parse(v)
		if err != nil || u.String() != v {
			return nil, false
		}
		return u[:], true
	case 20:
		t, err := time.Parse(time.RFC3339, v)
		if err != nil || t.UTC().Format(time.RFC3339) != v {
			return nil, false
		}
		return binary.BigEndian.AppendUint64(nil, uint64(t.Unix())), true
	}
	return nil, false
}

func unpack(b string) string {
	if len(b) == uuidLength {
		var u uuid.UUID
		copy(u[:], b)
		return u.String()
	}
	return time.Unix(int64(binary.BigEndian.Uint64([]byte(b))), 0).UTC().Format(time.RFC3339)
}

// value returns slot i's string and whether it is present.
func (n *Node) value(i int) (string, bool) {
	if n.present&(1<<i) == 0 {
		return "", false
	}
	if n.rare != nil {
		return n.rare.values[i], true
	}
	start := uint16(0)
	if i > 0 {
		start = n.ends[i-1] &^ packed
	}
	if n.ends[i]&packed != 0 {
		return unpack(n.data[start : n.ends[i]&^packed]), true
	}
	return n.data[start:n.ends[i]], true
}

func (n *Node) extra() []condition {
	if n.rare == nil {
		return nil
	}
	return n.rare.extra
}

// Name is the Node's name.
func (n *Node) Name() string { v, _ := n.value(slotName); return v }

// UID is the Node's uid.
func (n *Node) UID() types.UID { v, _ := n.value(slotUID); return types.UID(v) }

// ResourceVersion is the Node's resourceVersion.
func (n *Node) ResourceVersion() string { v, _ := n.value(slotResourceVersion); return v }

// SameForJudging reports whether the criteria would read the same of both:
// every kept string but the resourceVersion, which a kubelet's status
// report changes without changing anything judged.
func (n *Node) SameForJudging(other *Node, s *Shape) bool {
	if n.present&^(1<<slotResourceVersion) != other.present&^(1<<slotResourceVersion) {
		return false
	}
	for i := range s.slots {
		if i == slotResourceVersion {
			continue
		}
		a, _ := n.value(i)
		b, _ := other.value(i)
		if a != b {
			return false
		}
	}
	ea, eb := n.extra(), other.extra()
	if len(ea) != len(eb) {
		return false
	}
	for i := range ea {
		if ea[i].typ != eb[i].typ || !slices.Equal(ea[i].values, eb[i].values) || !slices.Equal(ea[i].present, eb[i].present) {
			return false
		}
	}
	return true
}

// GetObjectKind lets a Node sit in an informer's store; the store does not
// read it.
func (n *Node) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject returns n: a Node is immutable.
func (n *Node) DeepCopyObject() runtime.Object { return n }

// GetObjectMeta gives client-go's key functions the name (and the reflector
// the resourceVersion); built on demand so the Node does not carry one.
func (n *Node) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Name: n.Name(), UID: n.UID(), ResourceVersion: n.ResourceVersion()}
}
