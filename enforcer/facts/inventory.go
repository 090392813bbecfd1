// This file holds the Machines, InfraMachines and InfraMachinePools
// the rule reads, in client-go indexers shaped for the questions the rule
// asks: which objects could be linked to this Node? It serves both informer
// caches (live) and objects read from files (offline), so both paths pick
// candidates the same way.

package facts

import (
	"fmt"
	"slices"
	"sort"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	"github.com/nodeguard/nodeguard/enforcer/record"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// Role says what a kind is to the rule (see rule.Model).
type Role = rule.Role

// Roles returns every role, in a fixed order.
func Roles() []Role { return rule.Roles() }

// The roles a kind can have.
const (
	Machine          = rule.Machine
	MachinePool      = rule.MachinePool
	InfraMachine     = rule.InfraMachine
	InfraMachinePool = rule.InfraMachinePool
)

// Indexers returns the indexes the stores of a role carry: its shape's, one
// per link of that role that does not name an object by namespace and name
// (the store's own key finds those), and for a referrer the reference index.
func (inv *Inventory) Indexers(role Role) cache.Indexers {
	shape := inv.model.Shape(role)
	out := shape.Indexers()
	if slots, ok := inv.model.ReferenceSlots(role); ok {
		out[referenceIndex] = func(obj any) ([]string, error) {
			r, ok := obj.(*record.Record)
			if !ok {
				return nil, fmt.Errorf("index %s: inventory holds %T, want *record.Record", referenceIndex, obj)
			}
			ref, ok := reference(r, slots)
			if !ok {
				return nil, nil
			}
			return []string{referenceBucket(shape, ref)}, nil
		}
	}
	return out
}

// referenceIndex indexes a referrer's records by the object their reference
// names, so that a change of that object finds the Nodes the referrers link
// it to. It leaves out the version: a v1beta2 ref names none, and a v1beta1
// one need not name the version cached. Like the shape's indexes it holds
// buckets (record.Shape.Bucket): Referring checks what it finds.
const referenceIndex = "nodeguard.reference"

// referenceBucket is ref's value in the reference index of shape's records.
func referenceBucket(shape *record.Shape, ref Ref) string {
	return shape.Bucket(ref.GVK.Group, ref.GVK.Kind, ref.Namespace, ref.Name)
}

// NewStore returns an indexer with the indexes of role, for objects that do
// not come from an informer; add records (see Record) to it.
func (inv *Inventory) NewStore(role Role) cache.Indexer {
	return cache.NewIndexer(cache.MetaNamespaceKeyFunc, inv.Indexers(role))
}

// Inventory is the set of stores, one per kind. Kinds can be added while it
// is in use (a new InfraMachine kind appears); it is safe for concurrent use.
type Inventory struct {
	model *rule.Model

	mu     sync.RWMutex
	stores map[schema.GroupVersionKind]kindStore
	order  []schema.GroupVersionKind // sorted once per AddKind, not per request
}

type kindStore struct {
	role    Role
	indexer cache.Indexer
}

// NewInventory returns an empty inventory following model.
func NewInventory(model *rule.Model) *Inventory {
	return &Inventory{
		model:  model,
		stores: map[schema.GroupVersionKind]kindStore{},
	}
}

// Model returns the link model the inventory follows.
func (inv *Inventory) Model() *rule.Model { return inv.model }

// Record keeps what the rule reads of u, an object of role.
func (inv *Inventory) Record(u *unstructured.Unstructured, role Role) *record.Record {
	return inv.model.Shape(role).FromUnstructured(u)
}

// Transform is the informer transform for objects of role: it replaces an
// Unstructured with its record. Records and tombstones pass through, so it
// is idempotent as client-go requires.
func (inv *Inventory) Transform(role Role) cache.TransformFunc {
	shape := inv.model.Shape(role)
	return func(obj any) (any, error) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return obj, nil
		}
		return shape.FromUnstructured(u), nil
	}
}

// AddKind registers the store of one kind; the store must carry
// inv.Indexers(role). A kind registered twice keeps the first store.
func (inv *Inventory) AddKind(gvk schema.GroupVersionKind, role Role, indexer cache.Indexer) bool {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if _, ok := inv.stores[gvk]; ok {
		return false
	}
	inv.stores[gvk] = kindStore{role: role, indexer: indexer}
	inv.order = append(inv.order, gvk)
	sort.Slice(inv.order, func(i, j int) bool { return inv.order[i].String() < inv.order[j].String() })
	return true
}

// RemoveKind drops the store of one kind (its CRD is gone, and its objects
// with it).
func (inv *Inventory) RemoveKind(gvk schema.GroupVersionKind) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if _, ok := inv.stores[gvk]; !ok {
		return
	}
	delete(inv.stores, gvk)
	inv.order = slices.DeleteFunc(inv.order, func(g schema.GroupVersionKind) bool { return g == gvk })
}

// Kinds returns the registered kinds of one role, sorted.
func (inv *Inventory) Kinds(role Role) []schema.GroupVersionKind {
	inv.mu.RLock()
	defer inv.mu.RUnlock()
	var out []schema.GroupVersionKind
	for _, gvk := range inv.order {
		if inv.stores[gvk].role == role {
			out = append(out, gvk)
		}
	}
	return out
}

// Count returns the number of cached objects per kind.
func (inv *Inventory) Count() map[schema.GroupVersionKind]int {
	inv.mu.RLock()
	defer inv.mu.RUnlock()
	out := make(map[schema.GroupVersionKind]int, len(inv.stores))
	for gvk, s := range inv.stores {
		out[gvk] = len(s.indexer.ListKeys())
	}
	return out
}

// Ref names an object the rule may look up.
type Ref struct {
	GVK       schema.GroupVersionKind
	Namespace string
	Name      string
}

func (r Ref) String() string {
	return fmt.Sprintf("%s %s/%s", r.GVK.Kind, r.Namespace, r.Name)
}

// Candidates picks every object that could be linked to the Node by a
// declared link: a small superset, found through the indexes, so its cost
// does not grow with the number of objects. Refs lists, for fresh reads, what
// the picked Machines reference (found or not) and the Machines a link names
// by key that the cache lacks.
func (inv *Inventory) Candidates(node *unstructured.Unstructured) (objs []*unstructured.Unstructured, refs []Ref) {
	inv.mu.RLock()
	defer inv.mu.RUnlock()
	p := picker{inv: inv, picked: map[Ref]bool{}, followed: map[Ref]bool{}}
	for _, l := range inv.model.Links {
		values, ok := rule.NodeValues(node, l)
		if !ok {
			continue
		}
		nsAt, nameAt, keyed := l.Keyed()
		if !keyed {
			shape := inv.model.Shape(l.Role)
			t := shape.IndexOf(l.Fields)
			p.each(l.Role, func(gvk schema.GroupVersionKind, s cache.Indexer) bool {
				for _, r := range shape.Find(s, t, values) {
					p.add(gvk, r)
				}
				return false
			})
			continue
		}
		ns, name := values[nsAt], values[nameAt]
		found := p.each(l.Role, func(gvk schema.GroupVersionKind, s cache.Indexer) bool {
			r, ok := get(s, ns+"/"+name)
			if ok {
				p.add(gvk, r)
			}
			return ok
		})
		// A Machine a link names that the cache lacks (created while a watch
		// was down, say): a fresh read can still find it. Other roles have
		// many kinds, so only the cache answers for them.
		if !found && l.Role == Machine {
			p.refs = append(p.refs, Ref{GVK: inv.model.MachineKind.WithVersion(""), Namespace: ns, Name: name})
		}
	}
	return p.objs, p.refs
}

// picker collects Candidates' objects, each once, and follows each picked
// Machine to what it references as it goes. The caller holds inv.mu.
type picker struct {
	inv              *Inventory
	picked, followed map[Ref]bool // objects picked; Machine references followed
	objs             []*unstructured.Unstructured
	refs             []Ref
}

// each calls f with the store of every kind of role; true when f returned
// true for one of them.
func (p *picker) each(role Role, f func(schema.GroupVersionKind, cache.Indexer) bool) bool {
	found := false
	for _, gvk := range p.inv.order {
		if s := p.inv.stores[gvk]; s.role == role && f(gvk, s.indexer) {
			found = true
		}
	}
	return found
}

// add picks r, a stored record of kind gvk, unless picked already; a
// referrer's reference becomes a ref, and the object it names, in every
// version cached, is picked too.
func (p *picker) add(gvk schema.GroupVersionKind, r *record.Record) {
	key := Ref{GVK: gvk, Namespace: r.Namespace(), Name: r.Name()}
	if p.picked[key] {
		return
	}
	p.picked[key] = true
	p.objs = append(p.objs, r.Unstructured())
	ref, ok := p.inv.ReferenceOf(r)
	if !ok || p.followed[ref] {
		return
	}
	p.followed[ref] = true
	p.refs = append(p.refs, ref)
	for _, gvk := range p.inv.order {
		if gvk.Group != ref.GVK.Group || gvk.Kind != ref.GVK.Kind {
			continue
		}
		if named, ok := get(p.inv.stores[gvk].indexer, ref.Namespace+"/"+ref.Name); ok {
			p.add(gvk, named)
		}
	}
}

// get returns the record stored under key.
func get(s cache.Indexer, key string) (*record.Record, bool) {
	item, _, _ := s.GetByKey(key)
	r, ok := item.(*record.Record)
	return r, ok
}

// Referring returns, by role, the cached referrers (Machines, MachinePools)
// whose reference names r, an object of role: what links r to a Node when
// r is linked through them. An InfraMachine that appears after its Machine
// (created late, or moved between management clusters) blocks the Machine's
// Node, which must then be judged again.
func (inv *Inventory) Referring(role Role, r *record.Record) map[Role][]*record.Record {
	gv, err := schema.ParseGroupVersion(r.APIVersion())
	if err != nil {
		return nil
	}
	named := Ref{GVK: schema.GroupVersionKind{Group: gv.Group, Kind: r.Kind()}, Namespace: r.Namespace(), Name: r.Name()}
	inv.mu.RLock()
	defer inv.mu.RUnlock()
	var out map[Role][]*record.Record
	for _, gvk := range inv.order {
		s := inv.stores[gvk]
		if ref, ok := inv.model.Referrers[s.role]; !ok || ref.Names != role {
			continue
		}
		items, _ := s.indexer.ByIndex(referenceIndex, referenceBucket(inv.model.Shape(s.role), named))
		for _, item := range items {
			rec, isRecord := item.(*record.Record)
			if !isRecord {
				continue
			}
			ref, ok := inv.ReferenceOf(rec)
			ref.GVK.Version = "" // a v1beta1 ref's own; the index leaves it out
			if !ok || ref != named {
				continue // another reference in the same bucket
			}
			if out == nil {
				out = map[Role][]*record.Record{}
			}
			out[s.role] = append(out[s.role], rec)
		}
	}
	return out
}

// Reference reads what a referrer of role (a Machine, a MachinePool)
// references, in either shape of Cluster API's refs (see Record.reference),
// from a full object.
func (inv *Inventory) Reference(obj *unstructured.Unstructured, role Role) (Ref, bool) {
	return inv.ReferenceOf(inv.Record(obj, role))
}

// ReferenceOf is Reference for a cached record; false for a record of a role
// that references nothing.
func (inv *Inventory) ReferenceOf(r *record.Record) (Ref, bool) {
	role, ok := inv.model.ReferrerOf(r.Shape())
	if !ok {
		return Ref{}, false
	}
	slots, _ := inv.model.ReferenceSlots(role)
	return reference(r, slots)
}

// Layout arranges objects as Gatekeeper's inventory:
// namespace[ns][apiVersion][kind][name] = object.
func Layout(objs []*unstructured.Unstructured) map[string]any {
	namespaces := map[string]any{}
	for _, o := range objs {
		record.SetPath(namespaces, record.Path{o.GetNamespace(), o.GetAPIVersion(), o.GetKind(), o.GetName()}, o.Object)
	}
	return map[string]any{"namespace": namespaces}
}

// Store returns the store of one kind, nil when it has none: for callers
// that fill an inventory themselves (tests that play informers).
func (inv *Inventory) Store(gvk schema.GroupVersionKind) cache.Indexer {
	inv.mu.RLock()
	defer inv.mu.RUnlock()
	return inv.stores[gvk].indexer
}

// List returns every cached object of one role, as the rule sees it. It
// costs a walk of the whole cache: for periodic scans, not for decisions.
func (inv *Inventory) List(role Role) []*unstructured.Unstructured {
	records := inv.Records(role)
	out := make([]*unstructured.Unstructured, len(records))
	for i, r := range records {
		out[i] = r.Unstructured()
	}
	return out
}

// Records returns every cached record of one role. Like List, it walks the
// whole cache.
func (inv *Inventory) Records(role Role) []*record.Record {
	inv.mu.RLock()
	defer inv.mu.RUnlock()
	var out []*record.Record
	for _, gvk := range inv.order {
		s := inv.stores[gvk]
		if s.role != role {
			continue
		}
		for _, item := range s.indexer.List() {
			if r, ok := item.(*record.Record); ok {
				out = append(out, r)
			}
		}
	}
	return out
}
