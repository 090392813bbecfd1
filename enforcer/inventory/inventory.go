// Package inventory holds the Machines, InfraMachines and InfraMachinePools
// the rule reads, in client-go indexers shaped for the questions the rule
// asks: which objects could be linked to this Node? It serves both informer
// caches (live) and objects read from files (offline), so both paths pick
// candidates the same way.
package inventory

import (
	"fmt"
	"sort"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
)

// Role says what a kind is to the rule.
type Role int

// The roles a kind can have.
const (
	Machine Role = iota
	InfraMachine
	InfraMachinePool
)

func (r Role) String() string {
	switch r {
	case Machine:
		return "Machine"
	case InfraMachine:
		return "InfraMachine"
	default:
		return "InfraMachinePool"
	}
}

// Index names, one per question.
const (
	// ByNodeName: Machines whose status.nodeRef.name is the Node's name.
	ByNodeName = "nodeguard.nodeRefName"
	// ByProviderID: objects whose spec.providerID, or an entry of whose
	// spec.providerIDList, is the Node's providerID.
	ByProviderID = "nodeguard.providerID"
)

// Indexers returns the indexers every store of the inventory carries.
func Indexers() cache.Indexers {
	return cache.Indexers{ByNodeName: indexNodeName, ByProviderID: indexProviderID}
}

func indexNodeName(obj any) ([]string, error) {
	r, err := recordOf(obj)
	if err != nil {
		return nil, fmt.Errorf("index %s: %w", ByNodeName, err)
	}
	if r.nodeRefName == "" {
		return nil, nil
	}
	return []string{r.nodeRefName}, nil
}

func indexProviderID(obj any) ([]string, error) {
	r, err := recordOf(obj)
	if err != nil {
		return nil, fmt.Errorf("index %s: %w", ByProviderID, err)
	}
	var ids []string
	if r.providerID != "" {
		ids = append(ids, r.providerID)
	}
	for _, id := range r.providerIDList {
		if id != "" {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// NewStore returns an indexer with the inventory's indexes, for objects that
// do not come from an informer; add Records (see Strip) to it.
func NewStore() cache.Indexer {
	return cache.NewIndexer(cache.MetaNamespaceKeyFunc, Indexers())
}

// Inventory is the set of stores, one per kind. Kinds can be added while it
// is in use (a new InfraMachine kind appears); it is safe for concurrent use.
type Inventory struct {
	mu     sync.RWMutex
	stores map[schema.GroupVersionKind]kindStore
	order  []schema.GroupVersionKind // sorted once per AddKind, not per request
}

type kindStore struct {
	role    Role
	indexer cache.Indexer
}

// New returns an empty inventory.
func New() *Inventory {
	return &Inventory{stores: map[schema.GroupVersionKind]kindStore{}}
}

// AddKind registers the store of one kind. A kind registered twice keeps the
// first store.
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

// Candidates picks every object that could be linked to the Node: a small
// superset, found through the indexes, so its cost does not grow with the
// number of Machines. Refs lists, for fresh reads, what the picked Machines
// reference (found or not) and the Machine the Node's annotations name when
// the cache lacks it.
func (inv *Inventory) Candidates(node *unstructured.Unstructured) (objs []*unstructured.Unstructured, refs []Ref) {
	name := node.GetName()
	providerID, _, _ := unstructured.NestedString(node.Object, "spec", "providerID")
	ann := node.GetAnnotations()
	annotated := ""
	if ann[AnnotationMachine] != "" && ann[AnnotationClusterNamespace] != "" {
		annotated = ann[AnnotationClusterNamespace] + "/" + ann[AnnotationMachine]
	}

	inv.mu.RLock()
	defer inv.mu.RUnlock()
	seen := map[Ref]bool{}
	var picked []*Record
	add := func(gvk schema.GroupVersionKind, items []any) {
		for _, item := range items {
			r, err := recordOf(item)
			if err != nil {
				continue
			}
			key := Ref{GVK: gvk, Namespace: r.namespace, Name: r.name}
			if !seen[key] {
				seen[key] = true
				picked = append(picked, r)
			}
		}
	}
	annotatedFound := false
	for _, gvk := range inv.order {
		s := inv.stores[gvk]
		if s.role == Machine {
			items, _ := s.indexer.ByIndex(ByNodeName, name)
			add(gvk, items)
			if annotated != "" {
				if item, ok, _ := s.indexer.GetByKey(annotated); ok {
					add(gvk, []any{item})
					annotatedFound = true
				}
			}
		}
		if providerID != "" {
			items, _ := s.indexer.ByIndex(ByProviderID, providerID)
			add(gvk, items)
		}
	}
	// The Machine the Node names but the cache lacks (created while a watch
	// was down, say): a fresh read can still find it.
	if annotated != "" && !annotatedFound {
		refs = append(refs, Ref{GVK: schema.GroupVersionKind{Group: MachineGroup, Kind: "Machine"},
			Namespace: ann[AnnotationClusterNamespace], Name: ann[AnnotationMachine]})
	}
	// What the picked Machines reference, in every version the inventory holds.
	refSeen := map[Ref]bool{}
	for _, m := range append([]*Record(nil), picked...) {
		if m.kind != "Machine" {
			continue
		}
		ref, ok := m.InfraRef()
		if !ok || refSeen[ref] {
			continue
		}
		refSeen[ref] = true
		refs = append(refs, ref)
		for _, gvk := range inv.order {
			if gvk.Group != ref.GVK.Group || gvk.Kind != ref.GVK.Kind {
				continue
			}
			if item, ok, _ := inv.stores[gvk].indexer.GetByKey(ref.Namespace + "/" + ref.Name); ok {
				add(gvk, []any{item})
			}
		}
	}
	objs = make([]*unstructured.Unstructured, len(picked))
	for i, r := range picked {
		objs[i] = r.Unstructured()
	}
	return objs, refs
}

// InfraRef reads a Machine's spec.infrastructureRef in either shape: v1beta2
// {apiGroup, kind, name} in the Machine's namespace, or v1beta1 {apiVersion,
// kind, name, namespace}. The version of the returned GVK is the ref's own
// (v1beta1) or empty (v1beta2).
func InfraRef(machine *unstructured.Unstructured) (Ref, bool) {
	return NewRecord(machine).InfraRef()
}

// Layout arranges objects as Gatekeeper's inventory:
// namespace[ns][apiVersion][kind][name] = object.
func Layout(objs []*unstructured.Unstructured) map[string]any {
	namespaces := map[string]any{}
	for _, o := range objs {
		byGV := child(namespaces, o.GetNamespace())
		byKind := child(byGV, o.GetAPIVersion())
		byName := child(byKind, o.GetKind())
		byName[o.GetName()] = o.Object
	}
	return map[string]any{"namespace": namespaces}
}

func child(m map[string]any, key string) map[string]any {
	if c, ok := m[key].(map[string]any); ok {
		return c
	}
	c := map[string]any{}
	m[key] = c
	return c
}

func (inv *Inventory) store(gvk schema.GroupVersionKind) cache.Indexer {
	inv.mu.RLock()
	defer inv.mu.RUnlock()
	return inv.stores[gvk].indexer
}

// List returns every cached object of one role, as the rule sees it. It
// costs a walk of the whole cache: for periodic scans, not for decisions.
func (inv *Inventory) List(role Role) []*unstructured.Unstructured {
	inv.mu.RLock()
	defer inv.mu.RUnlock()
	var out []*unstructured.Unstructured
	for _, gvk := range inv.order {
		s := inv.stores[gvk]
		if s.role != role {
			continue
		}
		for _, item := range s.indexer.List() {
			if r, err := recordOf(item); err == nil {
				out = append(out, r.Unstructured())
			}
		}
	}
	return out
}
