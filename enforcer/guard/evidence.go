package guard

import (
	"maps"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/record"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// Evidence keeps one InfraMachine per (apiVersion, kind, namespace, cluster
// label, providerID scheme): enough for the criteria to see which schemes a
// cluster's synced InfraMachines use, without handing every InfraMachine to
// every evaluation. Any live InfraMachine of a key serves: the criteria read
// only its key, and one the rule would read for a Node otherwise (its
// providerID is the Node's) is a candidate of that Node anyway. The Rego
// decides what counts as evidence; this only bounds the input. Safe for
// concurrent use.
type Evidence struct {
	// label and providerID are the InfraMachine fields the criteria read
	// (the link model's cluster_label and provider_id).
	label, providerID rule.Path

	mu      sync.Mutex
	byKey   map[evidenceKey]*evidenceGroup
	objects []*unstructured.Unstructured // one per key; nil after a change
	// byCluster is objects by the namespace and cluster label of their key,
	// built with objects.
	byCluster map[[2]string][]*unstructured.Unstructured
}

type evidenceKey struct {
	apiVersion, kind, namespace, cluster, scheme string
}

// evidenceGroup is every InfraMachine of one key (their records: 8 bytes
// each, the inventory holds them anyway), and the one shown.
type evidenceGroup struct {
	shown   *record.Record
	members map[*record.Record]struct{}
}

// NewEvidence starts empty; Update fills it.
func NewEvidence(model *rule.Model) *Evidence {
	return &Evidence{label: model.ClusterLabel, providerID: model.ProviderID, byKey: map[evidenceKey]*evidenceGroup{}}
}

// EvidenceOf walks the inventory's InfraMachines once: for one-off judgments.
func EvidenceOf(inv *facts.Inventory) *Evidence {
	e := NewEvidence(inv.Model())
	for _, r := range inv.Records(facts.InfraMachine) {
		e.Update(nil, r)
	}
	return e
}

func (e *Evidence) key(r *record.Record) (evidenceKey, bool) {
	pid, _ := r.Get(e.providerID)
	scheme, _, ok := strings.Cut(pid, "://")
	if !ok || scheme == "" {
		return evidenceKey{}, false
	}
	cluster, _ := r.Get(e.label)
	return evidenceKey{apiVersion: r.APIVersion(), kind: r.Kind(), namespace: r.Namespace(), cluster: cluster, scheme: scheme}, true
}

// Update applies one InfraMachine change (old nil: added; r nil: deleted)
// and reports whether the set of keys changed: then the criteria may judge
// any Node differently.
func (e *Evidence) Update(old, r *record.Record) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	var removed, added *evidenceKey
	if old != nil {
		if k, ok := e.key(old); ok && e.remove(k, old) {
			removed = &k
		}
	}
	if r != nil {
		if k, ok := e.key(r); ok && e.add(k, r) {
			added = &k
		}
	}
	if removed != nil && added != nil && *removed == *added {
		return false // the one member of a key, updated in place
	}
	return removed != nil || added != nil
}

// remove drops a member; true when its key is gone with it.
func (e *Evidence) remove(k evidenceKey, r *record.Record) bool {
	g := e.byKey[k]
	if g == nil {
		return false
	}
	if _, ok := g.members[r]; !ok {
		// Not the record added (a caller that rebuilt it): the same object.
		for m := range g.members {
			if m.Namespace() == r.Namespace() && m.Name() == r.Name() {
				r = m
				break
			}
		}
	}
	delete(g.members, r)
	if len(g.members) == 0 {
		delete(e.byKey, k)
		e.objects = nil
		return true
	}
	if g.shown == r {
		for other := range g.members {
			g.shown = other
			break
		}
		e.objects = nil
	}
	return false
}

// add adds a member; true when its key is new.
func (e *Evidence) add(k evidenceKey, r *record.Record) bool {
	g := e.byKey[k]
	if g == nil {
		e.byKey[k] = &evidenceGroup{shown: r, members: map[*record.Record]struct{}{r: {}}}
		e.objects = nil
		return true
	}
	g.members[r] = struct{}{}
	return false
}

// Objects returns one InfraMachine per key, as the rule sees it.
func (e *Evidence) Objects() []*unstructured.Unstructured {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.objects != nil || len(e.byKey) == 0 {
		return e.objects
	}
	out := make([]*unstructured.Unstructured, 0, len(e.byKey))
	e.byCluster = map[[2]string][]*unstructured.Unstructured{}
	for _, k := range slices.SortedFunc(maps.Keys(e.byKey), func(a, b evidenceKey) int { return strings.Compare(keyString(a), keyString(b)) }) {
		u := e.byKey[k].shown.Unstructured()
		out = append(out, u)
		at := [2]string{k.namespace, k.cluster}
		e.byCluster[at] = append(e.byCluster[at], u)
	}
	e.objects = out
	return out
}

// ObjectsFor returns what Objects does that a cluster route ("namespace/
// name"; "" for all) can count: the criteria take as evidence for a cluster
// only InfraMachines in its namespace labelled with its name
// (orphans.rego, _evidence_for_cluster), so every other cluster's would be
// read for each Node and thrown away, a cost that grew with the fleet.
func (e *Evidence) ObjectsFor(cluster string) []*unstructured.Unstructured {
	all := e.Objects()
	ns, name, ok := strings.Cut(cluster, "/")
	if !ok {
		return all
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.objects == nil {
		return filterCluster(all, ns, name, e.label) // changed since: filter what was read
	}
	return e.byCluster[[2]string{ns, name}]
}

// filterCluster keeps the objects in namespace ns whose label (path) is name.
func filterCluster(objs []*unstructured.Unstructured, ns, name string, label rule.Path) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if v, _, _ := unstructured.NestedString(o.Object, label...); o.GetNamespace() == ns && v == name {
			out = append(out, o)
		}
	}
	return out
}

func keyString(k evidenceKey) string {
	return strings.Join([]string{k.apiVersion, k.kind, k.namespace, k.cluster, k.scheme}, "\x00")
}
