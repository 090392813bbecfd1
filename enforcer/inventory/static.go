package inventory

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// MachineGroup is Cluster API's core group.
const MachineGroup = "cluster.x-k8s.io"

// FromObjects builds an inventory from objects read from files: they are the
// whole inventory. It keeps Machines, the kinds named in infraKinds and
// poolKinds (group and kind), and any kind a Machine references; everything
// else (Nodes, Clusters, ...) is ignored. Objects without a namespace are
// taken to be in "default", as kubectl would create them.
func FromObjects(objs []*unstructured.Unstructured, infraKinds, poolKinds []schema.GroupKind) (*Inventory, error) {
	roles := map[schema.GroupKind]Role{}
	for _, gk := range infraKinds {
		roles[gk] = InfraMachine
	}
	for _, gk := range poolKinds {
		roles[gk] = InfraMachinePool
	}
	for _, o := range objs {
		if isMachine(o.GroupVersionKind()) {
			if ref, ok := InfraRef(o); ok {
				gk := ref.GVK.GroupKind()
				if _, known := roles[gk]; !known {
					roles[gk] = InfraMachine
				}
			}
		}
	}
	inv := New()
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		role, ok := roles[gvk.GroupKind()]
		if isMachine(gvk) {
			role, ok = Machine, true
		}
		if !ok {
			continue
		}
		r := NewRecord(o)
		if r.namespace == "" {
			r.namespace = "default"
		}
		inv.AddKind(gvk, role, NewStore())
		if err := inv.store(gvk).Add(r); err != nil {
			return nil, fmt.Errorf("add %s %s/%s: %w", gvk.Kind, r.namespace, r.name, err)
		}
	}
	return inv, nil
}

func isMachine(gvk schema.GroupVersionKind) bool {
	return gvk.Group == MachineGroup && gvk.Kind == "Machine"
}
