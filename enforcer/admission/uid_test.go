package admission

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestUIDOf(t *testing.T) {
	for name, tc := range map[string]struct {
		raw  string
		want string
	}{
		"API server order":   {`{"apiVersion":"v1","kind":"Node","metadata":{"name":"n","uid":"u-1","resourceVersion":"7"}}`, "u-1"},
		"after other fields": {`{"spec":{"providerID":"x"},"metadata":{"annotations":{"a":"b"},"labels":{},"uid":"u-2"},"kind":"Node"}`, "u-2"},
		"no uid":             {`{"metadata":{"name":"n"}}`, ""},
		"no metadata":        {`{"kind":"Node"}`, ""},
		"case matters":       {`{"metadata":{"UID":"u-3"}}`, ""},
		"nested uid only":    {`{"spec":{"uid":"u-4"},"metadata":{"ownerReferences":[{"uid":"u-5"}]}}`, ""},
		"not an object":      {`[1,2]`, ""},
		"malformed":          {`{"metadata":{"uid":`, ""},
		"empty":              {``, ""},
	} {
		assert.Equal(t, tc.want, string(uidOf([]byte(tc.raw))), name)
	}
}

// A Node as the API server writes it: metadata first, name and uid at its
// top, then 256 KiB of annotations (the limit) and a status.
func largeNode(b *testing.B) []byte {
	b.Helper()
	n := corev1.Node{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: "big", UID: "0b8d0b0e-5a5e-4c1a-9d5e-7a5b7c1d2e3f", Annotations: map[string]string{}}}
	for i := 0; i < 800; i++ {
		n.Annotations["example.com/annotation-"+strings.Repeat("x", 5)+string(rune('a'+i%26))+strings.Repeat("0", i%7)+string(rune('A'+i/26%26))+string(rune('a'+i/676))] = strings.Repeat("v", 300)
	}
	raw, err := json.Marshal(n)
	if err != nil {
		b.Fatal(err)
	}
	return raw
}

// go test ./enforcer/admission/ -run '^$' -bench UIDOf
func BenchmarkUIDOf(b *testing.B) {
	raw := largeNode(b)
	b.Run("uid-first", func(b *testing.B) {
		b.SetBytes(int64(len(raw)))
		for b.Loop() {
			if uidOf(raw) == "" {
				b.Fatal("no uid")
			}
		}
	})
	// A forged review may put uid last: the scan then reads it all.
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		b.Fatal(err)
	}
	meta := m["metadata"].(map[string]any)
	delete(meta, "uid")
	m["metadata"] = map[string]any{"annotations": meta["annotations"], "name": "big", "zz": map[string]any{}, "uid": "u"}
	last, err := json.Marshal(m) // Go writes keys in order: uid last
	if err != nil {
		b.Fatal(err)
	}
	b.Run("uid-last", func(b *testing.B) {
		b.SetBytes(int64(len(last)))
		for b.Loop() {
			if uidOf(last) == "" {
				b.Fatal("no uid")
			}
		}
	})
}
