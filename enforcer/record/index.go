package record

import (
	"hash/maphash"
	"slices"
	"sync"
)

// Index finds records by the values of their shape's index tuples
// (Spec.Indexes). It holds hashes, not the values, and points at the records
// (8 bytes each): a collision only names an extra record, never misses one,
// so a reader checks what it finds. It is safe for concurrent use.
type Index struct {
	shape *Shape
	seed  maphash.Seed

	mu    sync.Mutex
	first []map[uint64]*Record   // per tuple: hash -> a record
	more  []map[uint64][]*Record // hashes held by more than one record
}

// NewIndex returns an empty index of records of shape.
func NewIndex(shape *Shape) *Index {
	x := &Index{shape: shape, seed: maphash.MakeSeed()}
	for range shape.spec.Indexes {
		x.first = append(x.first, map[uint64]*Record{})
		x.more = append(x.more, map[uint64][]*Record{})
	}
	return x
}

// Update moves a record's entries from old's values to r's; either may be
// nil (an add, a delete).
func (x *Index) Update(old, r *Record) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for t, slots := range x.shape.indexSlots {
		if old != nil {
			if h, ok := x.recordHash(t, slots, old); ok {
				x.remove(t, h, old)
			}
		}
		if r != nil {
			if h, ok := x.recordHash(t, slots, r); ok {
				x.insert(t, h, r)
			}
		}
	}
}

// Find returns the records whose values for index tuple t (Shape.IndexOf)
// may be values; none for a tuple with an empty value, on which a link never
// holds.
func (x *Index) Find(t int, values []string) []*Record {
	if t < 0 || t >= len(x.first) || len(values) != len(x.shape.indexSlots[t]) || slices.Contains(values, "") {
		return nil
	}
	var h maphash.Hash
	x.start(&h, t)
	for _, v := range values {
		h.WriteString(v)
		h.WriteByte(0)
	}
	sum := h.Sum64()
	x.mu.Lock()
	defer x.mu.Unlock()
	r, ok := x.first[t][sum]
	if !ok {
		return nil
	}
	return append([]*Record{r}, x.more[t][sum]...)
}

func (x *Index) start(h *maphash.Hash, t int) {
	h.SetSeed(x.seed)
	h.WriteByte(byte(t))
}

// recordHash hashes r's values for tuple t; false when one is missing or
// empty.
func (x *Index) recordHash(t int, slots []int, r *Record) (uint64, bool) {
	var h maphash.Hash
	x.start(&h, t)
	for _, slot := range slots {
		v, ok := r.Value(slot)
		if !ok || v == "" {
			return 0, false
		}
		h.WriteString(v)
		h.WriteByte(0)
	}
	return h.Sum64(), true
}

func (x *Index) insert(t int, h uint64, r *Record) {
	if _, ok := x.first[t][h]; !ok {
		x.first[t][h] = r
		return
	}
	x.more[t][h] = append(x.more[t][h], r)
}

func (x *Index) remove(t int, h uint64, r *Record) {
	if x.first[t][h] == r {
		if rest := x.more[t][h]; len(rest) > 0 {
			x.first[t][h] = rest[0]
			x.setMore(t, h, rest[1:])
		} else {
			delete(x.first[t], h)
		}
		return
	}
	if i := slices.Index(x.more[t][h], r); i >= 0 {
		x.setMore(t, h, slices.Delete(slices.Clone(x.more[t][h]), i, i+1))
	}
}

func (x *Index) setMore(t int, h uint64, rs []*Record) {
	if len(rs) == 0 {
		delete(x.more[t], h)
		return
	}
	x.more[t][h] = rs
}
