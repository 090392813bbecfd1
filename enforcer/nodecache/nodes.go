package nodecache

import (
	"fmt"
	"hash/maphash"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"k8s.io/client-go/tools/cache"

	"github.com/nodeguard/nodeguard/enforcer/linkmodel"
)

// Nodes is one cluster's Node cache: the reduced Nodes by name, and for each
// link a map from the link's Node values to the Nodes holding them, so an
// object's values find the Nodes it could link. The maps hold hashes, not
// the values, and point at the Node records (8 bytes): a collision only
// names an extra Node to judge, never misses one.
// It is fed by an informer's events (Watch) or directly (tests).
type Nodes struct {
	shape    *Shape
	store    cache.Store
	onChange func(name string)
	seed     maphash.Seed
	count    atomic.Int64 // Nodes added and not deleted: Len without a walk

	mu    sync.Mutex
	index []map[uint64]*Node   // per shape.tuples: hash -> the Node
	more  []map[uint64][]*Node // hashes held by more than one Node
}

// NewNodes returns an empty cache over store (nil: its own) that calls
// onChange (when set) with the name of each Node added, deleted, or changed
// in what the criteria read.
func NewNodes(shape *Shape, store cache.Store, onChange func(name string)) *Nodes {
	if store == nil {
		store = cache.NewStore(cache.MetaNamespaceKeyFunc)
	}
	n := &Nodes{shape: shape, store: store, onChange: onChange, seed: maphash.MakeSeed()}
	for range shape.tuples {
		n.index = append(n.index, map[uint64]*Node{})
		n.more = append(n.more, map[uint64][]*Node{})
	}
	return n
}

// Shape is what the cache keeps of a Node.
func (c *Nodes) Shape() *Shape { return c.shape }

// Get returns the Node named name.
func (c *Nodes) Get(name string) (*Node, bool) {
	obj, ok, _ := c.store.GetByKey(name)
	if !ok {
		return nil, false
	}
	n, ok := obj.(*Node)
	return n, ok
}

// Names returns the names of every cached Node, sorted.
func (c *Nodes) Names() []string {
	keys := c.store.ListKeys()
	sort.Strings(keys)
	return keys
}

// Len is the number of cached Nodes (for the metrics: it follows the
// events, a moment behind the store).
func (c *Nodes) Len() int { return int(c.count.Load()) }

// Add stores n (a test's or a relist's way in; informers call added).
func (c *Nodes) Add(n *Node) error {
	old, had := c.Get(n.Name())
	if err := c.store.Add(n); err != nil {
		return fmt.Errorf("store Node %s: %w", n.Name(), err)
	}
	if had {
		c.updated(old, n)
	} else {
		c.added(n)
	}
	return nil
}

// Delete removes the Node named name.
func (c *Nodes) Delete(name string) error {
	n, ok := c.Get(name)
	if !ok {
		return nil
	}
	if err := c.store.Delete(n); err != nil {
		return fmt.Errorf("delete Node %s: %w", name, err)
	}
	c.deleted(n)
	return nil
}

func (c *Nodes) added(n *Node) {
	c.count.Add(1)
	c.reindex(nil, n)
	c.changed(n.Name())
}

func (c *Nodes) updated(old, n *Node) {
	c.reindex(old, n)
	if old.SameForJudging(n, c.shape) {
		return
	}
	c.changed(n.Name())
	if old.Name() != n.Name() {
		c.changed(old.Name())
	}
}

func (c *Nodes) deleted(n *Node) {
	c.count.Add(-1)
	c.reindex(n, nil)
	c.changed(n.Name())
}

func (c *Nodes) changed(name string) {
	if c.onChange != nil {
		c.onChange(name)
	}
}

// reindex moves a Node's index entries from old's values to n's (either may
// be nil).
func (c *Nodes) reindex(old, n *Node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for t := range c.shape.tuples {
		if old != nil {
			if h, ok := c.nodeHash(t, old); ok {
				c.remove(t, h, old)
			}
		}
		if n != nil {
			if h, ok := c.nodeHash(t, n); ok {
				c.insert(t, h, n)
			}
		}
	}
}

func (c *Nodes) insert(t int, h uint64, n *Node) {
	if _, ok := c.index[t][h]; !ok {
		c.index[t][h] = n
		return
	}
	c.more[t][h] = append(c.more[t][h], n)
}

func (c *Nodes) remove(t int, h uint64, n *Node) {
	if c.index[t][h] == n {
		if rest := c.more[t][h]; len(rest) > 0 {
			c.index[t][h] = rest[0]
			c.setMore(t, h, rest[1:])
		} else {
			delete(c.index[t], h)
		}
		return
	}
	if i := slices.Index(c.more[t][h], n); i >= 0 {
		c.setMore(t, h, slices.Delete(slices.Clone(c.more[t][h]), i, i+1))
	}
}

func (c *Nodes) setMore(t int, h uint64, nodes []*Node) {
	if len(nodes) == 0 {
		delete(c.more[t], h)
		return
	}
	c.more[t][h] = nodes
}

// nodeHash hashes a Node's values for tuple t; false when one is missing or
// empty (a link never holds on an empty value).
func (c *Nodes) nodeHash(t int, n *Node) (uint64, bool) {
	var h maphash.Hash
	h.SetSeed(c.seed)
	h.WriteByte(byte(t))
	for _, slot := range c.shape.tupleSlots[t] {
		v, ok := n.value(slot)
		if !ok || v == "" {
			return 0, false
		}
		h.WriteString(v)
		h.WriteByte(0)
	}
	return h.Sum64(), true
}

// Linked returns the Nodes that an object with these values for link l's
// fields could be linked to (each of values is one tuple, in the order of
// l.Fields; a "contains" link gives one tuple per list entry). It may name a
// Node that is not linked, never omit one that is.
func (c *Nodes) Linked(l linkmodel.Link, values [][]string) []string {
	var out []string
	if len(l.Node) == 1 && slices.Equal(l.Node[0], linkmodel.Path{"metadata", "name"}) {
		for _, v := range values {
			if len(v) == 1 && v[0] != "" {
				if _, ok := c.Get(v[0]); ok {
					out = append(out, v[0])
				}
			}
		}
		return out
	}
	t := slices.IndexFunc(c.shape.tuples, func(have []linkmodel.Path) bool { return pathsEqual(have, l.Node) })
	if t < 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, v := range values {
		if len(v) != len(l.Node) || slices.Contains(v, "") {
			continue
		}
		var h maphash.Hash
		h.SetSeed(c.seed)
		h.WriteByte(byte(t))
		for _, x := range v {
			h.WriteString(x)
			h.WriteByte(0)
		}
		sum := h.Sum64()
		if n, ok := c.index[t][sum]; ok {
			out = append(out, n.Name())
			for _, m := range c.more[t][sum] {
				out = append(out, m.Name())
			}
		}
	}
	return out
}
