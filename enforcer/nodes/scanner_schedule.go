package nodes

import (
	"container/heap"
	"maps"
	"time"
)

// schedule holds when each Node must be judged next: the earliest time asked
// for it. Not safe for concurrent use; the Scanner locks around it.
type schedule struct {
	at    map[nodeKey]time.Time
	peak  int     // the most entries at has held since it was made
	queue entries // may hold stale entries, skipped when popped
}

type entry struct {
	key nodeKey
	at  time.Time
}

func newSchedule() *schedule { return &schedule{at: map[nodeKey]time.Time{}} }

// add asks for k to be judged at t, unless it already is at or before t.
func (s *schedule) add(k nodeKey, t time.Time) {
	if have, ok := s.at[k]; ok && !have.After(t) {
		return
	}
	s.at[k] = t
	s.peak = max(s.peak, len(s.at))
	heap.Push(&s.queue, entry{key: k, at: t})
}

// next is the earliest time asked for, if any.
func (s *schedule) next() (time.Time, bool) {
	for s.queue.Len() > 0 {
		e := s.queue[0]
		if have, ok := s.at[e.key]; ok && have.Equal(e.at) {
			return e.at, true
		}
		heap.Pop(&s.queue)
	}
	return time.Time{}, false
}

// due removes and returns every key asked for at or before now.
func (s *schedule) due(now time.Time) []nodeKey {
	var out []nodeKey
	for {
		t, ok := s.next()
		if !ok || t.After(now) {
			break
		}
		e := heap.Pop(&s.queue).(entry)
		delete(s.at, e.key)
		out = append(out, e.key)
	}
	s.shrink()
	return out
}

// shrink lets go of the room a burst left (every Node of a cluster due at
// once when its cache syncs): Go's maps and slices keep their size, and that
// would cost every watched Node about 170 bytes for good.
func (s *schedule) shrink() {
	if cap(s.queue) > 64 && cap(s.queue) > 4*len(s.queue) {
		s.queue = append(entries(nil), s.queue...)
	}
	if len(s.at) < s.peak/4 {
		at := make(map[nodeKey]time.Time, len(s.at))
		maps.Copy(at, s.at)
		s.at, s.peak = at, len(s.at)
	}
}

// entries is a min-heap by time.
type entries []entry

func (q entries) Len() int           { return len(q) }
func (q entries) Less(i, j int) bool { return q[i].at.Before(q[j].at) }
func (q entries) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *entries) Push(x any)        { *q = append(*q, x.(entry)) }
func (q *entries) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}
