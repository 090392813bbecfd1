package facts

import (
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/version"
)

// Kinds by the contract: Cluster API's contract says which CRDs are
// infrastructure (the contract label) and what an InfraMachine
// (spec.providerID) and an InfraMachinePool (spec.providerIDList) hold, so a
// provider kind no parameter lists is found all the same: by the informers
// when its CRD is established, by `nodeguard check` in manifests.

// ContractLabels are the contract labels of provider CRDs, newest contract
// first: the value lists the CRD's versions that implement the contract,
// joined by "_".
func ContractLabels() []string {
	return []string{"cluster.x-k8s.io/v1beta2", "cluster.x-k8s.io/v1beta1"}
}

// ContractVersion reads a CRD's contract labels as Cluster API does
// (internal/contract): the newest contract's label that is set, and the
// highest of the versions it lists.
func ContractVersion(labels map[string]string) (string, bool) {
	for _, l := range ContractLabels() {
		if v := labels[l]; v != "" {
			return slices.MaxFunc(strings.Split(v, "_"), version.CompareKubeAwareVersionStrings), true
		}
	}
	return "", false
}

// ContractKind is what a CRD is to the contract.
type ContractKind struct {
	GVK      schema.GroupVersionKind
	Resource schema.GroupVersionResource
	Role     Role
}

// ContractKindOf classifies a CRD (whole, or as the contract informer keeps
// it): labelled for a contract, and served at the contract's
// version with spec.providerIDList (a pool; self-managed pools have
// spec.providerID too) or spec.providerID (an InfraMachine). A ...Template
// kind nests them under spec.template and is neither.
func ContractKindOf(crd *unstructured.Unstructured) (ContractKind, bool) {
	v, ok := ContractVersion(crd.GetLabels())
	if !ok {
		return ContractKind{}, false
	}
	gk, plural := CRDNames(crd)
	group, kind := gk.Group, gk.Kind
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	for _, item := range versions {
		ver, _ := item.(map[string]any)
		if name, _ := ver["name"].(string); name != v {
			continue
		}
		if served, _ := ver["served"].(bool); !served {
			return ContractKind{}, false
		}
		spec, _, _ := unstructured.NestedMap(ver, "schema", "openAPIV3Schema", "properties", "spec", "properties")
		out := ContractKind{GVK: schema.GroupVersionKind{Group: group, Version: v, Kind: kind},
			Resource: schema.GroupVersionResource{Group: group, Version: v, Resource: plural}}
		switch {
		case spec["providerIDList"] != nil:
			out.Role = InfraMachinePool
		case spec["providerID"] != nil:
			out.Role = InfraMachine
		default:
			return ContractKind{}, false
		}
		return out, kind != "" && plural != ""
	}
	return ContractKind{}, false
}

// CRDEstablished says whether a CRD's resource is served: its Established
// condition is True.
func CRDEstablished(crd *unstructured.Unstructured) bool {
	conditions, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, c := range conditions {
		c, _ := c.(map[string]any)
		if c["type"] == "Established" && c["status"] == "True" {
			return true
		}
	}
	return false
}

// CRDNames returns the kind a CRD defines and its plural resource name.
func CRDNames(crd *unstructured.Unstructured) (schema.GroupKind, string) {
	group, _, _ := unstructured.NestedString(crd.Object, "spec", "group")
	kind, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "kind")
	plural, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "plural")
	return schema.GroupKind{Group: group, Kind: kind}, plural
}
