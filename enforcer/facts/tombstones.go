// This file remembers the hosts Cluster API believes destroyed: when
// a Machine, InfraMachine or pool membership that carried a providerID goes
// away, that providerID is tombstoned for a window (default 24 h) from when
// nodeguard saw it go. A Node
// that comes back alive with a tombstoned providerID and nothing linking it
// is a ghost (policies/nodeguard/ghosts decides; this file only keeps
// the record the criteria read).
//
// Tombstones are keyed by providerID, never by Node name: names are reused
// (IP-based names for a new instance at the same address), so a name is
// evidence only. A providerID carried again by a new link ends its
// tombstone. The store is bounded (TombstoneOptions.Max, and a ConfigMap's size when
// kept, see TombstoneKeeper) and drops the oldest first.

package facts

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Tombstone is the record that what carried a providerID went away.
type Tombstone struct {
	ProviderID string `json:"providerID"`
	// Object names what went: "DockerMachine default/dev-md-0-abcde".
	Object string `json:"object"`
	// Node is the name the Node had then, when known: evidence only.
	Node string `json:"node,omitempty"`
	// Cluster is the Cluster API Cluster ("namespace/name") the object
	// belonged to, when known.
	Cluster string `json:"cluster,omitempty"`
	// DeletedAt is when its deletion began (the object's
	// deletionTimestamp), or when it was seen gone; Until ends the window,
	// counted from when it was seen gone: a deletion stuck for longer than
	// the window (a finalizer removed by hand days later) is tombstoned too.
	DeletedAt time.Time `json:"deletedAt"`
	Until     time.Time `json:"until"`
}

// Value is the tombstone as the Rego criteria read it (input.tombstone).
func (t Tombstone) Value() map[string]any {
	return map[string]any{"providerID": t.ProviderID, "object": t.Object, "node": t.Node,
		"deletedAt": t.DeletedAt.UTC().Format(time.RFC3339), "until": t.Until.UTC().Format(time.RFC3339)}
}

// Defaults of Options.
const (
	DefaultTombstoneWindow = 24 * time.Hour
	DefaultTombstoneMax    = 2000
)

// TombstoneOptions configure a Tombstones store.
type TombstoneOptions struct {
	// Window is how long a providerID stays tombstoned (default
	// DefaultTombstoneWindow).
	Window time.Duration
	// Max bounds the tombstones kept (default DefaultTombstoneMax); the oldest go
	// first.
	Max   int
	Clock clock.PassiveClock
	// Changed, when set, is told each providerID whose tombstone was set,
	// moved or ended, after the change (outside the store's lock).
	Changed func(providerID string)
	// Metrics, when set, exports the count and the evictions.
	Metrics *TombstoneMetrics
}

// Tombstones holds the tombstones; safe for concurrent use.
type Tombstones struct {
	opts TombstoneOptions

	mu      sync.Mutex
	current map[string]Tombstone
	// base is what the ConfigMap holds as last read or written, and ops
	// the changes made here since, replayed on a base someone else wrote
	// (TombstoneKeeper).
	base map[string]Tombstone
	ops  []op
}

// op is one change made here: a tombstone set, or a providerID ended.
type op struct {
	set Tombstone
	end string
}

// NewTombstones returns an empty Tombstones.
func NewTombstones(opts TombstoneOptions) *Tombstones {
	if opts.Window <= 0 {
		opts.Window = DefaultTombstoneWindow
	}
	if opts.Max <= 0 {
		opts.Max = DefaultTombstoneMax
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Tombstones{opts: opts, current: map[string]Tombstone{}, base: map[string]Tombstone{}}
}

// Window is how long a providerID stays tombstoned.
func (s *Tombstones) Window() time.Duration { return s.opts.Window }

// Record tombstones t.ProviderID for the window from now (or from
// t.DeletedAt, if later), as deleted at t.DeletedAt. A
// providerID tombstoned already keeps the later deletion (its object and
// time: the InfraMachine's over the Machine's whose deletion began first),
// and the Node name either knew.
func (s *Tombstones) Record(t Tombstone) {
	if t.ProviderID == "" {
		return
	}
	t.DeletedAt = t.DeletedAt.UTC().Truncate(time.Second)
	from := s.opts.Clock.Now().UTC().Truncate(time.Second)
	if t.DeletedAt.After(from) {
		from = t.DeletedAt // the API server's clock ahead of ours
	}
	t.Until = from.Add(s.opts.Window)
	s.mu.Lock()
	changed := s.change(op{set: t})
	evicted := s.evict(s.current, s.opts.Max)
	s.mu.Unlock()
	s.opts.Metrics.evicted(len(evicted))
	if changed {
		evicted = append([]string{t.ProviderID}, evicted...)
	}
	s.tell(evicted...)
}

// End ends the tombstone of a providerID a new link carries: a legitimate
// reuse. It reports whether there was one.
func (s *Tombstones) End(providerID string) bool {
	s.mu.Lock()
	changed := s.change(op{end: providerID})
	s.mu.Unlock()
	if changed {
		s.tell(providerID)
	} else {
		s.tell()
	}
	return changed
}

// change makes a change here, to be written; the caller holds s.mu.
func (s *Tombstones) change(o op) bool {
	changed := s.apply(s.current, o)
	if changed {
		s.ops = append(s.ops, o)
	}
	return changed
}

// apply makes one change to m and reports whether m changed.
func (s *Tombstones) apply(m map[string]Tombstone, o op) bool {
	if o.end != "" {
		_, had := m[o.end]
		delete(m, o.end)
		return had
	}
	t := o.set
	have, ok := m[t.ProviderID]
	if ok {
		if !t.DeletedAt.After(have.DeletedAt) {
			t.DeletedAt, t.Until, t.Object, t.Cluster = have.DeletedAt, have.Until, have.Object, have.Cluster
		}
		if t.Node == "" {
			t.Node = have.Node
		}
		if t == have {
			return false
		}
	}
	m[t.ProviderID] = t
	return true
}

// evict drops the oldest tombstones of m beyond max and returns their
// providerIDs.
func (s *Tombstones) evict(m map[string]Tombstone, max int) []string {
	if len(m) <= max {
		return nil
	}
	oldest := slices.SortedFunc(maps.Values(m), byAge)
	var out []string
	for _, t := range oldest[:len(m)-max] {
		delete(m, t.ProviderID)
		out = append(out, t.ProviderID)
	}
	return out
}

// byAge orders the oldest deletion first, then by providerID.
func byAge(a, b Tombstone) int {
	if c := a.DeletedAt.Compare(b.DeletedAt); c != 0 {
		return c
	}
	return strings.Compare(a.ProviderID, b.ProviderID)
}

// tell updates the count and tells Changed of pids.
func (s *Tombstones) tell(pids ...string) {
	s.opts.Metrics.set(s.Len())
	for _, pid := range pids {
		if s.opts.Changed != nil {
			s.opts.Changed(pid)
		}
	}
}

// Get returns the tombstone of a providerID whose window has not passed.
func (s *Tombstones) Get(providerID string) (Tombstone, bool) {
	if providerID == "" {
		return Tombstone{}, false
	}
	s.mu.Lock()
	t, ok := s.current[providerID]
	s.mu.Unlock()
	if !ok || !s.opts.Clock.Now().Before(t.Until) {
		return Tombstone{}, false
	}
	return t, true
}

// List returns every tombstone whose window has not passed, the newest
// deletion first.
func (s *Tombstones) List() []Tombstone {
	now := s.opts.Clock.Now()
	s.mu.Lock()
	out := make([]Tombstone, 0, len(s.current))
	for _, t := range s.current {
		if now.Before(t.Until) {
			out = append(out, t)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b Tombstone) int { return byAge(b, a) })
	return out
}

// Len is the number of tombstones held (some may have ended their window
// since the last TombstoneKeeper write pruned them).
func (s *Tombstones) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.current)
}

// EncodeTombstones is the JSON a ConfigMap keeps of tombstones: an array, the newest
// deletion first.
func EncodeTombstones(ts []Tombstone) ([]byte, error) {
	ts = slices.Clone(ts)
	slices.SortFunc(ts, func(a, b Tombstone) int { return byAge(b, a) })
	if ts == nil {
		ts = []Tombstone{}
	}
	return json.Marshal(ts)
}

// DecodeTombstones reads what EncodeTombstones wrote.
func DecodeTombstones(raw string) ([]Tombstone, error) {
	if raw == "" {
		return nil, nil
	}
	var ts []Tombstone
	if err := json.Unmarshal([]byte(raw), &ts); err != nil {
		return nil, fmt.Errorf("decode tombstones: %w", err)
	}
	for i, t := range ts {
		if t.ProviderID == "" {
			return nil, fmt.Errorf("decode tombstones: entry %d has no providerID", i)
		}
	}
	return ts, nil
}

// reload takes ts as what the ConfigMap holds now (written by someone else:
// another replica, `nodeguard ghosts --clear`, or nothing when it was
// deleted) and replays on it the changes made here since the last write.
func (s *Tombstones) reload(ts []Tombstone) {
	base := byProviderID(ts)
	s.mu.Lock()
	next := maps.Clone(base)
	for _, o := range s.ops {
		s.apply(next, o)
	}
	evicted := s.evict(next, s.opts.Max)
	var changed []string
	for pid, t := range next {
		if have, ok := s.current[pid]; !ok || have != t {
			changed = append(changed, pid)
		}
	}
	for pid := range s.current {
		if _, ok := next[pid]; !ok {
			changed = append(changed, pid)
		}
	}
	s.base, s.current = base, next
	s.mu.Unlock()
	s.opts.Metrics.evicted(len(evicted))
	s.tell(changed...)
}

// pending returns what to write: the tombstones whose window has not passed
// (the others are dropped now), the number of changes they include, and
// whether they differ from what the ConfigMap holds.
func (s *Tombstones) pending() ([]Tombstone, int, bool) {
	now := s.opts.Clock.Now()
	s.mu.Lock()
	var expired []string
	for pid, t := range s.current {
		if !now.Before(t.Until) {
			delete(s.current, pid)
			expired = append(expired, pid)
		}
	}
	out := slices.Collect(maps.Values(s.current))
	differs := !maps.Equal(s.current, s.base)
	n := len(s.ops)
	s.mu.Unlock()
	s.tell(expired...)
	return out, n, differs
}

// written says the ConfigMap now holds ts, which includes the first n
// changes made here.
func (s *Tombstones) written(ts []Tombstone, n int) {
	base := byProviderID(ts)
	s.mu.Lock()
	s.base = base
	s.ops = slices.Clone(s.ops[n:])
	s.mu.Unlock()
}

func byProviderID(ts []Tombstone) map[string]Tombstone {
	m := make(map[string]Tombstone, len(ts))
	for _, t := range ts {
		m[t.ProviderID] = t
	}
	return m
}

// drop removes tombstones that did not fit the ConfigMap, as evictions.
func (s *Tombstones) drop(ts []Tombstone) {
	pids := make([]string, len(ts))
	s.mu.Lock()
	for i, t := range ts {
		pids[i] = t.ProviderID
		delete(s.current, t.ProviderID)
	}
	s.mu.Unlock()
	s.opts.Metrics.evicted(len(ts))
	s.tell(pids...)
}
