// The Node cache keeps the Nodes of one cluster as the orphan criteria
// read them: each Node reduced, by an informer transform, to a record of the
// link model's NodeCacheShape (the link model's Node fields and the
// criteria's own, data.nodeguard.nodes.node_fields, plus its uid and
// resourceVersion for delete preconditions), in a few hundred bytes; and
// indexes (the shape's, in the informer's store) from what a Machine,
// InfraMachine or pool could link by to the Nodes it could link, so a change
// to such an object re-judges only those Nodes.

package facts

import (
	"fmt"
	"slices"
	"sort"
	"sync/atomic"

	"k8s.io/client-go/tools/cache"

	"github.com/nodeguard/nodeguard/enforcer/record"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// NodeShapeOf is the Node shape of the policy e runs: the link model's
// NodeCacheShape for its orphan criteria's Node fields, which it must have,
// and the extra paths (the verdicts' annotations, in mode admission-policy).
func NodeShapeOf(e *rule.Engine, extra ...rule.Path) (*record.Shape, error) {
	fields, err := e.NodeFields()
	if err != nil {
		return nil, err
	}
	s, err := e.Model().NodeCacheShape(fields, extra...)
	if err != nil {
		return nil, fmt.Errorf("nodecache: %w", err)
	}
	return s, nil
}

// Nodes is one cluster's Node cache: the reduced Nodes by name, indexed by
// each link's Node values (the shape's index tuples), so an object's values
// find the Nodes it could link.
// It is fed by an informer (NodeWatch) or directly (tests).
type Nodes struct {
	shape    *record.Shape
	store    cache.Indexer
	onChange func(name string)
	// verdicts are the paths of nodeguard's own verdicts on a Node; a change
	// of them alone goes to onVerdict, when set, not onChange.
	verdicts  []rule.Path
	onVerdict func(name string)
	count     atomic.Int64 // Nodes added and not deleted: Len without a walk
}

// NewNodes returns an empty cache of Nodes of shape (rule.Model's
// NodeCacheShape) over store (nil: its own; else one carrying
// shape.Indexers()) that calls onChange (when set) with the name of each
// Node added, deleted, or changed in what the criteria read.
func NewNodes(shape *record.Shape, store cache.Indexer, onChange func(name string)) *Nodes {
	if store == nil {
		store = cache.NewIndexer(cache.MetaNamespaceKeyFunc, shape.Indexers())
	}
	return &Nodes{shape: shape, store: store, onChange: onChange}
}

// Shape is what the cache keeps of a Node.
func (c *Nodes) Shape() *record.Shape { return c.shape }

// Get returns the Node named name.
func (c *Nodes) Get(name string) (*record.Record, bool) { return get(c.store, name) }

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
func (c *Nodes) Add(n *record.Record) error {
	old, had := c.Get(n.Name())
	if err := c.store.Add(n); err != nil {
		return fmt.Errorf("store Node %s: %w", n.Name(), err)
	}
	if had {
		c.updated(old, n)
	} else {
		c.counted(n, 1)
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
	c.counted(n, -1)
	return nil
}

// counted reports a Node added (delta 1) or deleted (-1).
func (c *Nodes) counted(n *record.Record, delta int64) {
	c.count.Add(delta)
	c.changed(n.Name())
}

// updated reports a change the criteria read: every kept string but the
// resourceVersion, which a kubelet's status report changes without changing
// anything judged; a change of nodeguard's verdicts alone, which no
// criterion reads, to onVerdict when set.
func (c *Nodes) updated(old, n *record.Record) {
	rv := rule.Path{"metadata", "resourceVersion"}
	if old.EqualIgnoring(n, rv) {
		return
	}
	if c.onVerdict != nil && old.Name() == n.Name() && old.EqualIgnoring(n, append(c.verdicts, rv)...) {
		c.onVerdict(n.Name())
		return
	}
	c.changed(n.Name())
	if old.Name() != n.Name() {
		c.changed(old.Name())
	}
}

func (c *Nodes) changed(name string) {
	if c.onChange != nil {
		c.onChange(name)
	}
}

// Linked returns the Nodes that an object with these values for link l's
// fields could be linked to (each of values is one tuple, in the order of
// l.Fields; a "contains" link gives one tuple per list entry).
func (c *Nodes) Linked(l rule.Link, values [][]string) []string {
	var out []string
	if len(l.Node) == 1 && slices.Equal(l.Node[0], rule.Path{"metadata", "name"}) {
		for _, v := range values {
			if len(v) == 1 && v[0] != "" {
				if _, ok := c.Get(v[0]); ok {
					out = append(out, v[0])
				}
			}
		}
		return out
	}
	t := c.shape.IndexOf(l.Node)
	for _, v := range values {
		for _, n := range c.shape.Find(c.store, t, v) {
			out = append(out, n.Name())
		}
	}
	return out
}
