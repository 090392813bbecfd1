package facts

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// FromObjects builds an inventory from objects read from files: they are the
// whole inventory. It keeps Machines and MachinePools (the referrers), the
// kinds named in infraKinds and poolKinds (group and kind), and any kind a
// referrer references, as the role its reference names; everything else
// (Nodes, Clusters, ...) is ignored. Objects without a namespace are
// taken to be in "default", as kubectl would create them.
func FromObjects(model *rule.Model, objs []*unstructured.Unstructured, infraKinds, poolKinds []schema.GroupKind) (*Inventory, error) {
	inv := NewInventory(model)
	roles := map[schema.GroupKind]Role{}
	for _, gk := range infraKinds {
		roles[gk] = InfraMachine
	}
	for _, gk := range poolKinds {
		roles[gk] = InfraMachinePool
	}
	referrers := map[schema.GroupKind]Role{}
	for role, r := range model.Referrers {
		referrers[r.GroupKind()] = role
	}
	for _, o := range objs {
		if role, ok := referrers[o.GroupVersionKind().GroupKind()]; ok {
			if ref, ok := inv.Reference(o, role); ok {
				gk := ref.GVK.GroupKind()
				if _, known := roles[gk]; !known {
					roles[gk] = model.Referrers[role].Names
				}
			}
		}
	}
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		role, ok := referrers[gvk.GroupKind()]
		if !ok {
			role, ok = roles[gvk.GroupKind()]
		}
		if !ok {
			continue
		}
		if o.GetNamespace() == "" {
			o = o.DeepCopy()
			o.SetNamespace("default")
		}
		r := inv.Record(o, role)
		inv.AddKind(gvk, role, inv.NewStore(role))
		if err := inv.Store(gvk).Add(r); err != nil {
			return nil, fmt.Errorf("add %s %s/%s: %w", gvk.Kind, r.Namespace(), r.Name(), err)
		}
	}
	return inv, nil
}
