package inventory

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kjson "sigs.k8s.io/json"
)

// The Node annotations CAPI writes that the rule (link 4) and Candidates read.
const (
	AnnotationMachine          = "cluster.x-k8s.io/machine"
	AnnotationClusterNamespace = "cluster.x-k8s.io/cluster-namespace"
)

// nodeFields is what the rule and Candidates read of a Node. Decoding into it
// skips everything else without building it, so a hostile oldObject (hundreds
// of thousands of nested objects, huge status) costs about its own size in
// memory instead of an Unstructured map per level.
type nodeFields struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name        string            `json:"name"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		ProviderID string `json:"providerID"`
	} `json:"spec"`
}

// NodeFromJSON decodes a Node (an AdmissionReview's oldObject) keeping only
// what the rule reads; see StripNode. Field names match case-sensitively, as
// the API server's own decoding does.
func NodeFromJSON(raw []byte) (*unstructured.Unstructured, error) {
	var n nodeFields
	if err := kjson.UnmarshalCaseSensitivePreserveInts(raw, &n); err != nil {
		return nil, fmt.Errorf("decode Node: %w", err)
	}
	return n.unstructured(), nil
}

// StripNode keeps only what the rule reads of a Node: apiVersion, kind,
// metadata.name, spec.providerID and the two CAPI annotations. Like the
// Records of the cache, the rule's input then costs the same for every Node,
// whatever its status, labels or managed fields hold.
func StripNode(u *unstructured.Unstructured) *unstructured.Unstructured {
	var n nodeFields
	n.APIVersion, n.Kind = u.GetAPIVersion(), u.GetKind()
	n.Metadata.Name = u.GetName()
	n.Metadata.Annotations = u.GetAnnotations()
	n.Spec.ProviderID, _, _ = unstructured.NestedString(u.Object, "spec", "providerID")
	return n.unstructured()
}

func (n *nodeFields) unstructured() *unstructured.Unstructured {
	meta := map[string]any{"name": n.Metadata.Name}
	ann := map[string]any{}
	for _, k := range []string{AnnotationMachine, AnnotationClusterNamespace} {
		if v, ok := n.Metadata.Annotations[k]; ok {
			ann[k] = v
		}
	}
	if len(ann) > 0 {
		meta["annotations"] = ann
	}
	out := map[string]any{"apiVersion": n.APIVersion, "kind": n.Kind, "metadata": meta}
	if n.Spec.ProviderID != "" {
		out["spec"] = map[string]any{"providerID": n.Spec.ProviderID}
	}
	return &unstructured.Unstructured{Object: out}
}
