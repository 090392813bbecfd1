package linkmodel_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/nodeguard/nodeguard/enforcer/linkmodel"
)

func TestEmbeddedModelDeclaresTheFiveLinks(t *testing.T) {
	m, err := linkmodel.Embedded(context.Background())
	require.NoError(t, err)
	var types []string
	for _, l := range m.Links {
		types = append(types, l.Type)
		assert.NotEmpty(t, l.When, l.Type)
		assert.NotEmpty(t, l.Blocks, l.Type)
		assert.NotEmpty(t, l.Phrase, l.Type)
	}
	assert.Equal(t, []string{"machineNodeRef", "machineProviderID", "nodeAnnotation", "infraProviderID", "poolProviderIDList"}, types)
	assert.Equal(t, "cluster.x-k8s.io", m.MachineKind.Group)
	ns, name, keyed := m.Links[2].Keyed()
	assert.True(t, keyed, "the annotations name a Machine by namespace and name")
	assert.Equal(t, []int{0, 1}, []int{ns, name})
	_, _, keyed = m.Links[0].Keyed()
	assert.False(t, keyed)
}

// What the enforcer keeps of each role follows from the declaration alone.
func TestShapesKeepTheDeclaredFields(t *testing.T) {
	m := linkmodel.MustEmbedded()
	paths := func(role linkmodel.Role) []string {
		var out []string
		for _, f := range m.Fields(role) {
			s := f.Path.String()
			if f.List {
				s += "[]"
			}
			out = append(out, s)
		}
		return out
	}
	assert.ElementsMatch(t, []string{
		"metadata.namespace", "metadata.name", "metadata.deletionTimestamp", "metadata.labels.cluster.x-k8s.io/cluster-name",
		"spec.clusterName", "spec.infrastructureRef.apiGroup", "spec.infrastructureRef.apiVersion", "spec.infrastructureRef.kind",
		"spec.infrastructureRef.name", "spec.infrastructureRef.namespace", "status.nodeRef.name", "spec.providerID",
	}, paths(linkmodel.Machine))
	assert.ElementsMatch(t, []string{"metadata.namespace", "metadata.name", "metadata.deletionTimestamp",
		"metadata.labels.cluster.x-k8s.io/cluster-name", "spec.providerID"}, paths(linkmodel.InfraMachine))
	assert.ElementsMatch(t, []string{"metadata.namespace", "metadata.name", "metadata.deletionTimestamp",
		"metadata.labels.cluster.x-k8s.io/cluster-name", "spec.providerIDList[]"}, paths(linkmodel.InfraMachinePool))
}

func TestParseRefusesWhatTheEnforcerCannotFollow(t *testing.T) {
	valid := func() map[string]any {
		return map[string]any{
			"machine_kind": map[string]any{"group": "cluster.x-k8s.io", "kind": "Machine"},
			"reference":    []any{"spec", "infrastructureRef"}, "deletion_timestamp": []any{"metadata", "deletionTimestamp"},
			"cluster_label": []any{"metadata", "labels", "c"}, "cluster_name": []any{"spec", "clusterName"},
			"provider_id": []any{"spec", "providerID"},
			"links": []any{map[string]any{"type": "a", "role": "InfraMachine", "node": []any{[]any{"spec", "providerID"}},
				"fields": []any{[]any{"spec", "providerID"}}, "match": "equal"}},
			"node_fields": []any{[]any{"metadata", "name"}, []any{"spec", "providerID"}},
		}
	}
	// nodeFields sets the link's Node fields, declared in node_fields too.
	nodeFields := func(m map[string]any, paths ...[]any) {
		link := m["links"].([]any)[0].(map[string]any)
		link["node"] = []any{}
		for _, p := range paths {
			link["node"] = append(link["node"].([]any), p)
			m["node_fields"] = append(m["node_fields"].([]any), p)
		}
	}
	parse := func(edit func(m map[string]any)) error {
		m := valid()
		edit(m)
		raw, err := json.Marshal(m)
		require.NoError(t, err)
		_, err = linkmodel.Parse(raw)
		return err
	}
	require.NoError(t, parse(func(map[string]any) {}))
	link := func(m map[string]any) map[string]any { return m["links"].([]any)[0].(map[string]any) }
	for name, edit := range map[string]func(m map[string]any){
		"unknown role":        func(m map[string]any) { link(m)["role"] = "Cluster" },
		"unknown match":       func(m map[string]any) { link(m)["match"] = "prefix" },
		"fields without node": func(m map[string]any) { link(m)["node"] = []any{} },
		"contains two fields": func(m map[string]any) {
			link(m)["match"] = "contains"
			link(m)["fields"] = []any{[]any{"a"}, []any{"b"}}
		},
		"empty path segment": func(m map[string]any) { link(m)["fields"] = []any{[]any{"spec", ""}} },
		"repeated type":      func(m map[string]any) { m["links"] = append(m["links"].([]any), link(m)) },
		"no machine kind":    func(m map[string]any) { delete(m, "machine_kind") },
		"no reference":       func(m map[string]any) { delete(m, "reference") },
		"node field in string": func(m map[string]any) {
			nodeFields(m, []any{"spec", "providerID"}, []any{"spec", "providerID", "x"})
			link(m)["fields"] = []any{[]any{"a"}, []any{"b"}}
		},
		"undecodable key":           func(m map[string]any) { nodeFields(m, []any{"metadata", "labels", "a,b"}) },
		"node field not declared":   func(m map[string]any) { link(m)["node"] = []any{[]any{"metadata", "labels", "a"}} },
		"node_fields without name":  func(m map[string]any) { m["node_fields"] = []any{[]any{"spec", "providerID"}} },
		"empty node_fields segment": func(m map[string]any) { m["node_fields"] = append(m["node_fields"].([]any), []any{"spec", ""}) },
	} {
		assert.Error(t, parse(edit), name)
	}
}

// The Node reaches the rule as what the rule reads of it, whichever way it
// came: decoded from a review or stripped from an object.
func TestNodeKeepsWhatTheRuleReads(t *testing.T) {
	m := linkmodel.MustEmbedded()
	raw := []byte(`{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1","labels":{"a":"b"},
		"annotations":{"cluster.x-k8s.io/machine":"m1","cluster.x-k8s.io/cluster-namespace":"ns","other":"x"},
		"managedFields":[{"manager":"kubelet"}]},
		"spec":{"providerID":"docker:////n1","taints":[{},{},{}]},"status":{"images":[{"names":["a"]}]}}`)
	want := map[string]any{"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": "n1", "annotations": map[string]any{
			"cluster.x-k8s.io/machine": "m1", "cluster.x-k8s.io/cluster-namespace": "ns"}},
		"spec": map[string]any{"providerID": "docker:////n1"}}
	got, err := m.NodeFromJSON(raw)
	require.NoError(t, err)
	assert.Equal(t, want, got.Object)
	full := &unstructured.Unstructured{}
	require.NoError(t, full.UnmarshalJSON(raw))
	assert.Equal(t, want, m.StripNode(full).Object)

	// Names match as the API server matches them: "providerid" is not
	// spec.providerID.
	got, err = m.NodeFromJSON([]byte(`{"apiVersion":"v1","kind":"Node","metadata":{"name":"n2"},"spec":{"providerid":"x"}}`))
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": "n2"}}, got.Object)

	_, err = m.NodeFromJSON([]byte(`{"spec":"not an object"}`))
	assert.Error(t, err)
	_, err = m.NodeFromJSON([]byte(`{"spec":{"providerID":7}}`))
	assert.Error(t, err, "a declared field that is not a string")
}
