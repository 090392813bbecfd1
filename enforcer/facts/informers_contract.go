package facts

import (
	"fmt"
	"slices"
	"sort"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
)

// Kinds by the contract (inventory_contract.go) are watched from the moment
// their CRD is established, even one no parameter lists and no Machine
// references any more (an InfraMachine whose Machine's finalizer was removed
// by hand, a managed pool): one CRD informer, no poll.

// reduceCRD keeps what ContractKindOf and the parameter kinds read of a
// CRD: provider CRDs are large (a schema of hundreds of KiB each), and the
// informer holds every CRD of the cluster.
func reduceCRD(obj any) (any, error) {
	crd, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	var versions []any
	list, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	for _, item := range list {
		ver, _ := item.(map[string]any)
		props := map[string]any{}
		spec, _, _ := unstructured.NestedMap(ver, "schema", "openAPIV3Schema", "properties", "spec", "properties")
		for _, field := range []string{"providerID", "providerIDList"} {
			if spec[field] != nil {
				props[field] = map[string]any{}
			}
		}
		versions = append(versions, map[string]any{"name": ver["name"], "served": ver["served"],
			"schema": map[string]any{"openAPIV3Schema": map[string]any{"properties": map[string]any{"spec": map[string]any{"properties": props}}}}})
	}
	var conditions []any
	all, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, c := range all {
		if c, _ := c.(map[string]any); c["type"] == "Established" {
			conditions = append(conditions, map[string]any{"type": c["type"], "status": c["status"]})
		}
	}
	gk, plural := CRDNames(crd)
	out := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": crd.GetAPIVersion(), "kind": crd.GetKind(),
		"metadata": map[string]any{"name": crd.GetName(), "resourceVersion": crd.GetResourceVersion()},
		"spec": map[string]any{"group": gk.Group,
			"names": map[string]any{"kind": gk.Kind, "plural": plural}, "versions": versions},
		"status": map[string]any{"conditions": conditions},
	}}
	if labels := crd.GetLabels(); len(labels) > 0 {
		out.SetLabels(labels)
	}
	return out, nil
}

// startContract starts the CRD informer: an established CRD that the
// contract classifies gets its informer, as does a kind the parameters
// list whose CRD appears after start; a deleted CRD's kind is dropped (its
// objects went with it). Ready waits for the CRD list.
func (s *Syncer) startContract() error {
	factory := dynamicinformer.NewDynamicSharedInformerFactory(s.opts.Client, 0)
	informer := factory.ForResource(crdGVR).Informer()
	if err := informer.SetTransform(reduceCRD); err != nil {
		return fmt.Errorf("set transform on the CRD informer: %w", err)
	}
	onCRD := func(obj any) {
		crd, ok := obj.(*unstructured.Unstructured)
		if !ok || !CRDEstablished(crd) {
			return
		}
		if k, ok := ContractKindOf(crd); ok {
			s.noteFailure(k.GVK.GroupKind(), s.track(k.GVK, k.Role, SourceContract, &k.Resource))
			return
		}
		// A kind the parameters list whose CRD came after start.
		gk, _ := CRDNames(crd)
		s.mu.Lock()
		role, listed := s.parameters[gk]
		s.mu.Unlock()
		if listed {
			s.trackIfServed(gk, role, SourceParameter)
		}
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    onCRD,
		UpdateFunc: func(_, obj any) { onCRD(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if crd, ok := obj.(*unstructured.Unstructured); ok {
				gk, _ := CRDNames(crd)
				s.untrack(gk)
			}
		},
	}); err != nil {
		return fmt.Errorf("watch CRDs: %w", err)
	}
	s.mu.Lock()
	s.contract = informer
	s.mu.Unlock()
	go informer.RunWithContext(s.ctx)
	return nil
}

// Watched is one watched kind and why.
type Watched struct {
	GVK     schema.GroupVersionKind
	Role    Role
	Sources []string
	Synced  bool
}

// Watched returns every watched kind, sorted: for the metric
// nodeguard_watched_kinds and people asking what nodeguard sees.
func (s *Syncer) Watched() []Watched {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Watched, 0, len(s.informers))
	for _, t := range s.informers {
		out = append(out, Watched{GVK: t.gvk, Role: t.role, Sources: slices.Sorted(slices.Values(t.sources)), Synced: t.informer.HasSynced()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GVK.String() < out[j].GVK.String() })
	return out
}
