package rule

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// NodeValues returns the Node's values for link's Node fields, and false
// when one is missing or empty: the link then cannot hold.
func NodeValues(node *unstructured.Unstructured, l Link) ([]string, bool) {
	out := make([]string, len(l.Node))
	for i, p := range l.Node {
		s, ok, _ := unstructured.NestedString(node.Object, p...)
		if !ok || s == "" {
			return nil, false
		}
		out[i] = s
	}
	return out, true
}
