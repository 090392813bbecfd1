package record_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/nodeguard/nodeguard/enforcer/record"
	"github.com/nodeguard/nodeguard/internal/testnodes"
)

// nodeSpec is what the orphan criteria keep of a Node (as the policy
// declares it today), written out so these tests do not depend on it.
func nodeSpec() record.Spec {
	return record.Spec{
		APIVersion: "v1", Kind: "Node",
		Scalars: []record.Path{{"metadata", "uid"}, {"metadata", "resourceVersion"}, {"spec", "providerID"},
			{"metadata", "creationTimestamp"},
			{"metadata", "annotations", "cluster.x-k8s.io/cluster-name"},
			{"metadata", "annotations", "cluster.x-k8s.io/cluster-namespace"},
			{"metadata", "annotations", "cluster.x-k8s.io/machine"}},
		Conditions: record.Conditions{Path: record.Path{"status", "conditions"}, Types: []string{"Ready"}, Keys: []string{"type", "status", "lastTransitionTime"}},
		Indexes:    [][]record.Path{{{"spec", "providerID"}}},
	}
}

func nodeShape(t testing.TB) *record.Shape {
	t.Helper()
	s, err := record.NewShape(nodeSpec())
	require.NoError(t, err)
	return s
}

// forms gives one Node in each form a record is made from: typed (a typed
// informer's), Unstructured (a dynamic client's), JSON (an admission
// request's).
func forms(t *testing.T, s *record.Shape, n *corev1.Node) map[string]*record.Record {
	t.Helper()
	typed, err := s.Reduce(n)
	require.NoError(t, err)
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(n)
	require.NoError(t, err)
	raw, err := json.Marshal(n)
	require.NoError(t, err)
	fromJSON, err := s.FromJSON(raw)
	require.NoError(t, err)
	return map[string]*record.Record{"typed": typed, "unstructured": s.FromUnstructured(&unstructured.Unstructured{Object: m}), "json": fromJSON}
}

// Every form keeps exactly the declared fields, and the same record.
func TestEveryFormKeepsExactlyTheDeclaredFields(t *testing.T) {
	s := nodeShape(t)
	want := map[string]any{
		"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{
			"name": "ip-10-0-0-7.ec2.internal", "uid": "6a1f3c2e-8d4b-4c1a-9e2f-0b1c2d3e4f50", "resourceVersion": "123456789",
			"creationTimestamp": "2026-11-30T11:00:00Z",
			"annotations": map[string]any{"cluster.x-k8s.io/cluster-name": "prod-1", "cluster.x-k8s.io/cluster-namespace": "fleet",
				"cluster.x-k8s.io/machine": "prod-1-md-0-abcde-00007"},
		},
		"spec":   map[string]any{"providerID": "aws:///us-east-1a/i-00000000000000007"},
		"status": map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": "False", "lastTransitionTime": "2026-11-30T11:00:00Z"}}},
	}
	all := forms(t, s, testnodes.Real(7))
	for form, r := range all {
		assert.Equal(t, want, r.Object(), form)
		assert.True(t, r.Equal(all["typed"]), form)
		assert.Equal(t, "ip-10-0-0-7.ec2.internal", r.Name(), form)
		assert.Equal(t, "123456789", r.ResourceVersion(), form)
		assert.EqualValues(t, "6a1f3c2e-8d4b-4c1a-9e2f-0b1c2d3e4f50", r.UID(), form)
		meta := r.GetObjectMeta()
		assert.Equal(t, "ip-10-0-0-7.ec2.internal", meta.GetName(), form)
		assert.Equal(t, "123456789", meta.GetResourceVersion(), form)
	}
}

func TestAbsentFieldsStayAbsent(t *testing.T) {
	s := nodeShape(t)
	for form, r := range forms(t, s, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "bare"}}) {
		assert.Equal(t, map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": "bare"}}, r.Object(), form)
		_, ok := r.Get(record.Path{"spec", "providerID"})
		assert.False(t, ok, form)
	}
}

// The criteria read every entry of a kept condition type, so a second Ready
// entry (which the API server does not forbid) is kept too, in order; and a
// record whose strings pass 32 KiB is kept whole.
func TestRareRecordsAreKeptWhole(t *testing.T) {
	s := nodeShape(t)
	n := testnodes.Real(1)
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue})
	n.Annotations["cluster.x-k8s.io/cluster-name"] = strings.Repeat("x", 70_000)
	all := forms(t, s, n)
	for form, r := range all {
		o := r.Object()
		conditions, _, _ := unstructured.NestedSlice(o, "status", "conditions")
		assert.Equal(t, []any{
			map[string]any{"type": "Ready", "status": "False", "lastTransitionTime": "2026-11-30T11:00:00Z"},
			map[string]any{"type": "Ready", "status": "True"},
		}, conditions, form)
		name, _, _ := unstructured.NestedString(o, "metadata", "annotations", "cluster.x-k8s.io/cluster-name")
		assert.Len(t, name, 70_000, form)
		assert.Equal(t, n.Name, r.Name(), form)
		assert.True(t, r.Equal(all["typed"]), form)
	}
}

// UUIDs and RFC 3339 UTC times are kept in binary; whatever is kept comes
// back as the very string it was, canonical or not.
func TestKeptStringsComeBackExactly(t *testing.T) {
	s := nodeShape(t)
	for _, v := range []string{
		"6a1f3c2e-8d4b-4c1a-9e2f-0b1c2d3e4f50", "6A1F3C2E-8D4B-4C1A-9E2F-0B1C2D3E4F50", "{6a1f3c2e-8d4b-4c1a-9e2f-0b1c2d3e4f50}",
		"2026-11-30T11:00:00Z", "1969-07-20T20:17:40Z", "2026-11-30T11:00:00+01:00", "2026-11-30T11:00:00.5Z", "2026-11-30 11:00:00Z",
		"", "x", strings.Repeat("y", 36), strings.Repeat("z", 20),
	} {
		u := &unstructured.Unstructured{Object: map[string]any{
			"metadata": map[string]any{"name": "n", "uid": v, "creationTimestamp": v,
				"annotations": map[string]any{"cluster.x-k8s.io/machine": v}},
			"status": map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": v, "lastTransitionTime": v}}},
		}}
		o := s.FromUnstructured(u).Object()
		for _, p := range [][]string{{"metadata", "uid"}, {"metadata", "creationTimestamp"}, {"metadata", "annotations", "cluster.x-k8s.io/machine"}} {
			got, _, _ := unstructured.NestedString(o, p...)
			assert.Equal(t, v, got, "%v of %q", p, v)
		}
		conditions, _, _ := unstructured.NestedSlice(o, "status", "conditions")
		assert.Equal(t, []any{map[string]any{"type": "Ready", "status": v, "lastTransitionTime": v}}, conditions)
	}
}

// A field that is not a string is absent from an Unstructured or a typed
// object (the rule cannot tell the two apart), and an error in JSON, as
// the API server would never send it.
func TestNonStringFields(t *testing.T) {
	s := nodeShape(t)
	r := s.FromUnstructured(&unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": "n"}, "spec": map[string]any{"providerID": int64(3)}}})
	_, ok := r.Get(record.Path{"spec", "providerID"})
	assert.False(t, ok)
	_, err := s.FromJSON([]byte(`{"metadata":{"name":"n"},"spec":{"providerID":3}}`))
	assert.Error(t, err)
	_, err = s.Reduce(map[string]any{})
	assert.Error(t, err)
}

// A hostile object costs a scan of its bytes: nothing undeclared is built.
func TestFromJSONSkipsTheUndeclared(t *testing.T) {
	s := nodeShape(t)
	raw := `{"metadata":{"name":"n","labels":{"a":"b"}},"status":{"images":` + strings.Repeat("[", 5_000) + strings.Repeat("]", 5_000) +
		`,"conditions":[{"type":"Ready","status":"True","reason":{"deep":[1,2,3]}}]}}`
	r, err := s.FromJSON([]byte(raw))
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": "n"},
		"status": map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": "True"}}}}, r.Object())
}

type pool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		ProviderIDList []string `json:"providerIDList,omitempty"`
	} `json:"spec"`
}

// Lists are kept in order from every form; an empty list is absent.
func TestLists(t *testing.T) {
	s, err := record.NewShape(record.Spec{Lists: []record.Path{{"spec", "providerIDList"}}})
	require.NoError(t, err)
	p := &pool{TypeMeta: metav1.TypeMeta{APIVersion: "infrastructure.cluster.x-k8s.io/v1beta2", Kind: "AWSManagedMachinePool"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "fleet", Name: "pool"}}
	p.Spec.ProviderIDList = []string{"aws:///a/i-1", "aws:///a/i-2"}
	want := map[string]any{"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "AWSManagedMachinePool",
		"metadata": map[string]any{"namespace": "fleet", "name": "pool"},
		"spec":     map[string]any{"providerIDList": []any{"aws:///a/i-1", "aws:///a/i-2"}}}
	typed, err := s.Reduce(p)
	require.NoError(t, err)
	raw, err := json.Marshal(p)
	require.NoError(t, err)
	fromJSON, err := s.FromJSON(raw)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(raw, &m))
	for form, r := range map[string]*record.Record{"typed": typed, "json": fromJSON, "unstructured": s.FromUnstructured(&unstructured.Unstructured{Object: m})} {
		assert.Equal(t, want, r.Object(), form)
		assert.Equal(t, []string{"aws:///a/i-1", "aws:///a/i-2"}, r.List(s.ListSlot(record.Path{"spec", "providerIDList"})), form)
		assert.True(t, r.Equal(typed), form)
	}
	p.Spec.ProviderIDList = nil
	empty, err := s.Reduce(p)
	require.NoError(t, err)
	assert.NotContains(t, empty.Object(), "spec")
	assert.False(t, empty.Equal(typed))
}

func TestEqualIgnoring(t *testing.T) {
	s := nodeShape(t)
	a, err := s.Reduce(testnodes.Real(1))
	require.NoError(t, err)
	n := testnodes.Real(1)
	n.ResourceVersion = "2"
	b, err := s.Reduce(n)
	require.NoError(t, err)
	assert.False(t, a.Equal(b))
	assert.True(t, a.EqualIgnoring(b, record.Path{"metadata", "resourceVersion"}))
	n.Spec.ProviderID = "aws:///elsewhere"
	c, err := s.Reduce(n)
	require.NoError(t, err)
	assert.False(t, a.EqualIgnoring(c, record.Path{"metadata", "resourceVersion"}))
	assert.Same(t, a, a.DeepCopyObject(), "a record is immutable, so a copy is itself")
}

func TestShapeRefusesWhatItCannotKeep(t *testing.T) {
	many := record.Spec{}
	for i := range record.MaxSlots {
		many.Scalars = append(many.Scalars, record.Path{"spec", fmt.Sprint("f", i)})
	}
	for name, spec := range map[string]record.Spec{
		"too many strings":   many,
		"empty segment":      {Scalars: []record.Path{{"spec", ""}}},
		"overlapping fields": {Scalars: []record.Path{{"spec", "a"}, {"spec", "a", "b"}}},
		"string and list":    {Scalars: []record.Path{{"spec", "a"}}, Lists: []record.Path{{"spec", "a"}}},
		"index not kept":     {Indexes: [][]record.Path{{{"spec", "a"}}}},
		"undecodable key":    {Scalars: []record.Path{{"spec", `a"b`}}},
	} {
		_, err := record.NewShape(spec)
		assert.Error(t, err, name)
	}
	s := nodeShape(t)
	_, err := s.Reduce(&struct{ Spec struct{} }{})
	assert.Error(t, err, "a type without a kept field cannot be read")
}
