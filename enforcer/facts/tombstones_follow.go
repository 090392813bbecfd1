package facts

import (
	"slices"
	"time"

	"github.com/nodeguard/nodeguard/enforcer/record"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// Follow records the tombstones one inventory change makes and ends those a
// new link ends. For each link of the object's role that compares the
// Node's providerID alone (rule.Model.ProviderIDLinks), a providerID
// the old object carried and the new one does not (it went, or a pool's
// list shrank) is tombstoned; one the new object carries and the old did
// not (an add: a new object, or one the informers list at start) ends its
// tombstone. nodeName, when set, names the Node that has a providerID now
// (evidence); a Machine's own link by Node name is asked first.
func (s *Tombstones) Follow(model *rule.Model, c Change, nodeName func(providerID string) string) {
	if c.Moved {
		// Relabelled to another shard: its host lives on, it is no ghost's.
		return
	}
	for _, l := range model.ProviderIDLinks(c.Role) {
		was, is := carried(c.Old, l), carried(c.New, l)
		for _, pid := range is {
			if !slices.Contains(was, pid) {
				s.End(pid)
			}
		}
		for _, pid := range was {
			if slices.Contains(is, pid) {
				continue
			}
			t := Tombstone{ProviderID: pid, Object: c.Old.Kind() + " " + c.Old.Namespace() + "/" + c.Old.Name(),
				Cluster: clusterOf(model, c.Old), DeletedAt: s.opts.Clock.Now()}
			if c.New == nil {
				// Gone: its deletion began at its deletionTimestamp, the
				// same time for every replica that saw it.
				if ts, ok := c.Old.Get(model.DeletionTimestamp); ok {
					if at, err := time.Parse(time.RFC3339, ts); err == nil {
						t.DeletedAt = at
					}
				}
			}
			t.Node = namedNode(model, c.Role, c.Old)
			if t.Node == "" && nodeName != nil {
				t.Node = nodeName(pid)
			}
			s.Record(t)
		}
	}
}

// carried is what r holds for link l's one field; none for no record.
func carried(r *record.Record, l rule.Link) []string {
	if r == nil {
		return nil
	}
	var out []string
	for _, v := range LinkValues(r, l) {
		out = append(out, v[0])
	}
	return out
}

// namedNode is the Node name r holds in a link on the Node's name (a
// Machine's status.nodeRef.name), or "".
func namedNode(model *rule.Model, role rule.Role, r *record.Record) string {
	for _, l := range model.LinksOf(role) {
		if len(l.Node) == 1 && slices.Equal(l.Node[0], rule.Path{"metadata", "name"}) {
			if vs := LinkValues(r, l); len(vs) > 0 {
				return vs[0][0]
			}
		}
	}
	return ""
}

// clusterOf is "namespace/name" of the Cluster r is labelled for (or, for a
// referrer, names in its spec), or "".
func clusterOf(model *rule.Model, r *record.Record) string {
	name, _ := r.Get(model.ClusterLabel)
	if name == "" {
		name, _ = r.Get(model.ClusterName)
	}
	if name == "" {
		return ""
	}
	return r.Namespace() + "/" + name
}
