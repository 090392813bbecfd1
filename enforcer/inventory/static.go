package inventory

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeguard/nodeguard/enforcer/linkmodel"
)

// FromObjects builds an inventory from objects read from files: they are the
// whole inventory. It keeps Machines, the kinds named in infraKinds and
// poolKinds (group and kind), and any kind a Machine references; everything
// else (Nodes, Clusters, ...) is ignored. Objects without a namespace are
// taken to be in "default", as kubectl would create them.
func FromObjects(model *linkmodel.Model, objs []*unstructured.Unstructured, infraKinds, poolKinds []schema.GroupKind) (*Inventory, error) {
	inv := New(model)
	roles := map[schema.GroupKind]Role{}
	for _, gk := range infraKinds {
		roles[gk] = InfraMachine
	}
	for _, gk := range poolKinds {
		roles[gk] = InfraMachinePool
	}
	for _, o := range objs {
		if o.GroupVersionKind().GroupKind() == model.MachineKind {
			if ref, ok := inv.Reference(o); ok {
				gk := ref.GVK.GroupKind()
				if _, known := roles[gk]; !known {
					roles[gk] = InfraMachine
				}
			}
		}
	}
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		role, ok := roles[gvk.GroupKind()]
		if gvk.GroupKind() == model.MachineKind {
			role, ok = Machine, true
		}
		if !ok {
			continue
		}
		r := inv.Record(o, role)
		if r.namespace == "" {
			r.namespace = "default"
		}
		inv.AddKind(gvk, role, inv.NewStore(role))
		if err := inv.store(gvk).Add(r); err != nil {
			return nil, fmt.Errorf("add %s %s/%s: %w", gvk.Kind, r.namespace, r.name, err)
		}
	}
	return inv, nil
}
