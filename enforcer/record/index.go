package record

import (
	"fmt"
	"hash/maphash"
	"slices"
	"strconv"

	"k8s.io/client-go/tools/cache"
)

// Records are found by their index tuples (Spec.Indexes) through client-go
// indexes, which an informer updates in the same critical section as its
// store: a lookup never misses a record the store holds, which a guard's
// decision needs. client-go keeps a set of object keys per distinct index
// value, ~200 B however few keys it holds (a providerID index cost that per
// object); the value indexed here is one of a few buckets of the tuple's
// hash, so the sets are shared, and a lookup keeps the bucket's records that
// hold the values. The buckets must be far fewer than the records: a shape
// says how many (Spec.IndexBuckets), trading memory against the records a
// lookup checks.
const (
	DefaultIndexBuckets = 1 << 12
	maxIndexBuckets     = 1 << 12
)

// bucketNames are the index values, made once: an index value is then never
// allocated, in an informer's store or in a lookup.
var bucketNames = func() (names [maxIndexBuckets]string) {
	for i := range names {
		names[i] = strconv.FormatUint(uint64(i), 36)
	}
	return names
}()

// IndexName is the client-go index of the shape's tuple t.
func IndexName(t int) string { return "record.index." + strconv.Itoa(t) }

// Indexers returns the client-go indexes of the shape's tuples, for the
// store (or informer) that holds its records.
func (s *Shape) Indexers() cache.Indexers {
	out := cache.Indexers{}
	for t := range s.indexes {
		out[IndexName(t)] = func(obj any) ([]string, error) {
			r, ok := obj.(*Record)
			if !ok || r.shape != s {
				return nil, fmt.Errorf("index %s: %T is not a record of this shape", IndexName(t), obj)
			}
			return s.indexValues(t, r), nil
		}
	}
	return out
}

// indexValues returns the buckets r is found in for tuple t: one for a
// tuple of strings, one per list entry for a list; none when a value is
// missing or empty, on which a link never holds.
func (s *Shape) indexValues(t int, r *Record) []string {
	x := s.indexes[t]
	if x.list >= 0 {
		// A bucket repeated is taken once by client-go (a set).
		var out []string
		for _, v := range r.List(x.list) {
			if v != "" {
				out = append(out, s.bucket(t, v))
			}
		}
		return out
	}
	values := make([]string, len(x.slots))
	for i, slot := range x.slots {
		if values[i], _ = r.Value(slot); values[i] == "" {
			return nil
		}
	}
	return []string{s.bucket(t, values...)}
}

// Find returns the records in store (which carries s.Indexers()) whose
// values for tuple t (IndexOf) are values, or whose list holds values[0]
// for a list tuple; none for an empty value.
func (s *Shape) Find(store cache.Indexer, t int, values []string) []*Record {
	if t < 0 || t >= len(s.indexes) || len(values) != s.indexes[t].width() || slices.Contains(values, "") {
		return nil
	}
	// ByIndex fails only for an index the store lacks: then nothing is found
	// through it, as for any store not built with s.Indexers().
	items, _ := store.ByIndex(IndexName(t), s.bucket(t, values...))
	var out []*Record
	for _, item := range items {
		if r, ok := item.(*Record); ok && s.holds(t, r, values) {
			out = append(out, r)
		}
	}
	return out
}

// holds reports whether r's values for tuple t are values.
func (s *Shape) holds(t int, r *Record, values []string) bool {
	x := s.indexes[t]
	if x.list >= 0 {
		return slices.Contains(r.List(x.list), values[0])
	}
	for i, slot := range x.slots {
		if v, _ := r.Value(slot); v != values[i] {
			return false
		}
	}
	return true
}

// Bucket is the index value of a key, given as its parts, in an index of the
// caller's own over records of s (a key the tuples cannot state, such as a
// normalised reference); its lookups must check what they find, as Find
// does.
func (s *Shape) Bucket(parts ...string) string { return s.bucket(-1, parts...) }

func (s *Shape) bucket(t int, values ...string) string {
	var h maphash.Hash
	h.SetSeed(s.seed)
	h.WriteByte(byte(t))
	for _, v := range values {
		h.WriteString(v)
		h.WriteByte(0)
	}
	return bucketNames[h.Sum64()&(s.buckets-1)]
}
