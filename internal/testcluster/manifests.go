package testcluster

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Objects decodes a stream of YAML (or JSON) documents, as kubectl apply
// reads a manifest, skipping empty ones.
func Objects(t testing.TB, stream []byte) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(stream), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			require.ErrorContains(t, err, "EOF")
			return out
		}
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
}
