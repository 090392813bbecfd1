package facts_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/record"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/internal/testcluster"
)

var (
	machineV1beta2 = testcluster.MachineGVK
	dockerMachine  = testcluster.DockerMachineGVK
	dockerPool     = testcluster.DockerMachinePoolGVK
	obj            = testcluster.Object
)

func machine(ns, name, nodeName, providerID, infraName string) *unstructured.Unstructured {
	spec := map[string]any{"infrastructureRef": map[string]any{
		"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": infraName,
	}}
	if providerID != "" {
		spec["providerID"] = providerID
	}
	fields := map[string]any{"spec": spec}
	if nodeName != "" {
		fields["status"] = map[string]any{"nodeRef": map[string]any{"name": nodeName}}
	}
	return obj(machineV1beta2, ns, name, fields)
}

func node(name, providerID string, annotations map[string]string) *unstructured.Unstructured {
	n := obj(schema.GroupVersionKind{Version: "v1", Kind: "Node"}, "", name, map[string]any{"spec": map[string]any{"providerID": providerID}})
	n.SetAnnotations(annotations)
	return n
}

func keys(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		out = append(out, fmt.Sprintf("%s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName()))
	}
	return out
}

func TestCandidatesFindEveryLinkAndNothingElse(t *testing.T) {
	inv := newInventory()
	machines, infras, pools := inv.NewStore(facts.Machine), inv.NewStore(facts.InfraMachine), inv.NewStore(facts.InfraMachinePool)
	inv.AddKind(machineV1beta2, facts.Machine, machines)
	inv.AddKind(dockerMachine, facts.InfraMachine, infras)
	inv.AddKind(dockerPool, facts.InfraMachinePool, pools)
	for i := range 1000 {
		name := fmt.Sprintf("other-%d", i)
		add(t, inv, machines, facts.Machine, machine("default", name, name, "docker:////"+name, name))
		add(t, inv, infras, facts.InfraMachine, obj(dockerMachine, "default", name, map[string]any{"spec": map[string]any{"providerID": "docker:////" + name}}))
	}
	add(t, inv, machines, facts.Machine, machine("default", "by-node-ref", "n1", "", "infra-a"))
	add(t, inv, machines, facts.Machine, machine("default", "by-provider-id", "", "docker:////n1", "infra-b"))
	add(t, inv, machines, facts.Machine, machine("team", "by-annotation", "", "", "infra-c"))
	add(t, inv, infras, facts.InfraMachine, obj(dockerMachine, "default", "infra-a", nil))
	add(t, inv, infras, facts.InfraMachine, obj(dockerMachine, "team", "infra-c", nil))
	add(t, inv, infras, facts.InfraMachine, obj(dockerMachine, "default", "orphan", map[string]any{"spec": map[string]any{"providerID": "docker:////n1"}}))
	add(t, inv, pools, facts.InfraMachinePool, obj(dockerPool, "default", "pool", map[string]any{"spec": map[string]any{"providerIDList": []any{"docker:////x", "docker:////n1"}}}))

	objs, refs := inv.Candidates(node("n1", "docker:////n1", map[string]string{
		"cluster.x-k8s.io/machine": "by-annotation", "cluster.x-k8s.io/cluster-namespace": "team",
	}))
	assert.ElementsMatch(t, []string{
		"Machine default/by-node-ref", "Machine default/by-provider-id", "Machine team/by-annotation",
		"DockerMachine default/infra-a", "DockerMachine team/infra-c", "DockerMachine default/orphan",
		"DockerMachinePool default/pool",
	}, keys(objs))
	var refNames []string
	for _, r := range refs {
		refNames = append(refNames, r.String())
	}
	// infra-b is referenced but not cached: it is still a ref, for fresh reads.
	assert.ElementsMatch(t, []string{"DockerMachine default/infra-a", "DockerMachine default/infra-b", "DockerMachine team/infra-c"}, refNames)
}

func TestCandidatesNameTheAnnotatedMachineTheCacheLacks(t *testing.T) {
	inv := newInventory()
	machines := inv.NewStore(facts.Machine)
	inv.AddKind(machineV1beta2, facts.Machine, machines)
	annotated := node("n1", "", map[string]string{"cluster.x-k8s.io/machine": "m", "cluster.x-k8s.io/cluster-namespace": "team"})

	objs, refs := inv.Candidates(annotated)
	assert.Empty(t, objs)
	require.Len(t, refs, 1, "the Machine the Node names is a ref, for fresh reads")
	assert.Equal(t, facts.Ref{GVK: schema.GroupVersionKind{Group: "cluster.x-k8s.io", Kind: "Machine"}, Namespace: "team", Name: "m"}, refs[0])

	add(t, inv, machines, facts.Machine, machine("team", "m", "", "", "infra"))
	objs, refs = inv.Candidates(annotated)
	assert.Equal(t, []string{"Machine team/m"}, keys(objs))
	require.Len(t, refs, 1, "once cached, only what the Machine references is a ref")
	assert.Equal(t, "DockerMachine team/infra", refs[0].String())
}

func TestCandidatesWithoutProviderIDOrAnnotations(t *testing.T) {
	inv := newInventory()
	machines, infras := inv.NewStore(facts.Machine), inv.NewStore(facts.InfraMachine)
	inv.AddKind(machineV1beta2, facts.Machine, machines)
	inv.AddKind(dockerMachine, facts.InfraMachine, infras)
	add(t, inv, infras, facts.InfraMachine, obj(dockerMachine, "default", "empty-id", map[string]any{"spec": map[string]any{"providerID": ""}}))
	objs, refs := inv.Candidates(node("n1", "", nil))
	assert.Empty(t, objs, "an empty providerID must not match objects without one")
	assert.Empty(t, refs)
}

func TestReferenceShapes(t *testing.T) {
	inv := newInventory()
	m := obj(machineV1beta2, "ns", "m", map[string]any{"spec": map[string]any{"infrastructureRef": map[string]any{
		"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "AWSMachine", "name": "a",
	}}})
	ref, ok := inv.Reference(m, facts.Machine)
	require.True(t, ok)
	assert.Equal(t, facts.Ref{GVK: schema.GroupVersionKind{Group: "infrastructure.cluster.x-k8s.io", Kind: "AWSMachine"}, Namespace: "ns", Name: "a"}, ref)

	old := obj(schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta1", Kind: "Machine"}, "ns", "m",
		map[string]any{"spec": map[string]any{"infrastructureRef": map[string]any{
			"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "AWSMachine", "name": "a", "namespace": "other",
		}}})
	ref, ok = inv.Reference(old, facts.Machine)
	require.True(t, ok)
	assert.Equal(t, facts.Ref{GVK: schema.GroupVersionKind{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Kind: "AWSMachine"}, Namespace: "other", Name: "a"}, ref)

	_, ok = inv.Reference(obj(machineV1beta2, "ns", "m", nil), facts.Machine)
	assert.False(t, ok)
}

func newInventory() *facts.Inventory { return facts.NewInventory(rule.MustEmbeddedModel()) }

func add(t *testing.T, inv *facts.Inventory, store cache.Indexer, role facts.Role, u *unstructured.Unstructured) {
	t.Helper()
	require.NoError(t, store.Add(inv.Record(u, role)))
}

func TestStripKeepsOnlyWhatTheRuleReads(t *testing.T) {
	m := machine("default", "m", "n1", "docker:////n1", "m")
	m.SetLabels(map[string]string{"cluster.x-k8s.io/cluster-name": "dev", "other": "x"})
	m.SetAnnotations(map[string]string{"big": "annotation"})
	m.SetUID("u1")
	m.SetResourceVersion("42")
	require.NoError(t, unstructured.SetNestedField(m.Object, "v1.34.1", "spec", "version"))
	require.NoError(t, unstructured.SetNestedField(m.Object, "dev", "spec", "clusterName"))
	require.NoError(t, unstructured.SetNestedField(m.Object, "Running", "status", "phase"))
	require.NoError(t, unstructured.SetNestedField(m.Object, "Node", "status", "nodeRef", "kind"))
	require.NoError(t, unstructured.SetNestedField(m.Object, "2026-11-29T10:00:00Z", "metadata", "deletionTimestamp"))

	inv := newInventory()
	transform := inv.Transform(facts.Machine)
	out, err := transform(m)
	require.NoError(t, err)
	r := out.(*record.Record)
	assert.Equal(t, map[string]any{
		"apiVersion": "cluster.x-k8s.io/v1beta2",
		"kind":       "Machine",
		"metadata": map[string]any{
			"name": "m", "namespace": "default", "deletionTimestamp": "2026-11-29T10:00:00Z",
			"labels": map[string]any{"cluster.x-k8s.io/cluster-name": "dev"},
		},
		"spec": map[string]any{
			"providerID": "docker:////n1", "clusterName": "dev",
			"infrastructureRef": map[string]any{"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": "m"},
		},
		"status": map[string]any{"nodeRef": map[string]any{"name": "n1"}},
	}, r.Unstructured().Object)

	again, err := transform(r)
	require.NoError(t, err)
	assert.Same(t, r, again, "client-go may hand the transform an object it already transformed")

	tombstone := cache.DeletedFinalStateUnknown{Key: "default/m", Obj: r}
	passed, err := transform(tombstone)
	require.NoError(t, err)
	assert.Equal(t, tombstone, passed)
}

func TestRecordKeepsPoolListsAndV1beta1Refs(t *testing.T) {
	pool := obj(dockerPool, "default", "p", map[string]any{"spec": map[string]any{"providerIDList": []any{"a", "b"}}})
	old := obj(schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta1", Kind: "Machine"}, "ns", "m",
		map[string]any{"spec": map[string]any{"infrastructureRef": map[string]any{
			"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "AWSMachine", "name": "a", "namespace": "other",
		}}})
	inv := newInventory()
	assert.Equal(t, pool.Object, inv.Record(pool, facts.InfraMachinePool).Unstructured().Object)
	assert.Equal(t, old.Object, inv.Record(old, facts.Machine).Unstructured().Object)
	copied := inv.Record(old, facts.Machine).DeepCopyObject().(*record.Record)
	assert.Equal(t, old.Object, copied.Unstructured().Object)
}

func TestLayoutIsGatekeepersShape(t *testing.T) {
	m := machine("default", "m", "n1", "", "m")
	got := facts.Layout([]*unstructured.Unstructured{m})
	assert.Equal(t, m.Object, got["namespace"].(map[string]any)["default"].(map[string]any)["cluster.x-k8s.io/v1beta2"].(map[string]any)["Machine"].(map[string]any)["m"])
}

func TestFromObjectsKeepsMachinesListedAndReferencedKinds(t *testing.T) {
	objs := []*unstructured.Unstructured{
		machine("", "m", "n1", "", "x"),
		obj(dockerMachine, "", "x", nil),
		obj(schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "Cluster"}, "default", "dev", nil),
		obj(schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "FooMachinePool"}, "default", "p", nil),
		node("n1", "", nil),
	}
	inv, err := facts.FromObjects(rule.MustEmbeddedModel(), objs, nil, []schema.GroupKind{{Group: "example.com", Kind: "FooMachinePool"}})
	require.NoError(t, err)
	assert.Equal(t, []schema.GroupVersionKind{machineV1beta2}, inv.Kinds(facts.Machine))
	assert.Equal(t, []schema.GroupVersionKind{dockerMachine}, inv.Kinds(facts.InfraMachine))
	assert.Equal(t, "example.com/v1, Kind=FooMachinePool", inv.Kinds(facts.InfraMachinePool)[0].String())
	got, _ := inv.Candidates(node("n1", "", nil))
	assert.ElementsMatch(t, []string{"Machine default/m", "DockerMachine default/x"}, keys(got), "no namespace means default")
	assert.Equal(t, 1, inv.Count()[dockerMachine])
}

// A v1beta1 Machine names its InfraMachine with a version; cached at that
// very version, or another, the InfraMachine is a candidate all the same.
func TestCandidatesFollowAVersionedReference(t *testing.T) {
	v1beta1 := schema.GroupVersionKind{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta1", Kind: "DockerMachine"}
	for _, cached := range []schema.GroupVersionKind{v1beta1, dockerMachine} {
		inv := newInventory()
		machines, infras := inv.NewStore(facts.Machine), inv.NewStore(facts.InfraMachine)
		inv.AddKind(machineV1beta2, facts.Machine, machines)
		inv.AddKind(cached, facts.InfraMachine, infras)
		m := obj(machineV1beta2, "default", "m", map[string]any{
			"spec":   map[string]any{"infrastructureRef": map[string]any{"apiVersion": v1beta1.GroupVersion().String(), "kind": "DockerMachine", "name": "d", "namespace": "default"}},
			"status": map[string]any{"nodeRef": map[string]any{"name": "n1"}},
		})
		add(t, inv, machines, facts.Machine, m)
		add(t, inv, infras, facts.InfraMachine, obj(cached, "default", "d", nil))
		objs, refs := inv.Candidates(node("n1", "", nil))
		assert.ElementsMatch(t, []string{"Machine default/m", "DockerMachine default/d"}, keys(objs), cached.Version)
		require.Len(t, refs, 1)
		assert.Equal(t, facts.Ref{GVK: v1beta1, Namespace: "default", Name: "d"}, refs[0])
	}
}

// An InfraMachine finds the Machines that reference it, in either shape of
// ref, and nothing else: its Node is linked through them.
func TestReferringFindsTheMachinesThatNameAnInfraMachine(t *testing.T) {
	inv := newInventory()
	machines, infras := inv.NewStore(facts.Machine), inv.NewStore(facts.InfraMachine)
	inv.AddKind(machineV1beta2, facts.Machine, machines)
	inv.AddKind(dockerMachine, facts.InfraMachine, infras)
	add(t, inv, machines, facts.Machine, machine("default", "m", "n", "", "dm"))
	add(t, inv, machines, facts.Machine, machine("other", "m", "n2", "", "dm"))
	add(t, inv, machines, facts.Machine, machine("default", "m2", "n3", "", "dm2"))
	v1beta1 := obj(schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta1", Kind: "Machine"}, "default", "old", map[string]any{
		"spec": map[string]any{"infrastructureRef": map[string]any{"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "DockerMachine", "name": "dm", "namespace": "default"}}})
	add(t, inv, machines, facts.Machine, v1beta1)

	dm := inv.Record(obj(dockerMachine, "default", "dm", nil), facts.InfraMachine)
	got := inv.Referring(facts.InfraMachine, dm)
	var names []string
	for _, r := range got[facts.Machine] {
		names = append(names, r.Namespace()+"/"+r.Name())
	}
	assert.ElementsMatch(t, []string{"default/m", "default/old"}, names)
	assert.Len(t, got, 1, "only Machines reference DockerMachines")
	assert.Empty(t, inv.Referring(facts.InfraMachine, inv.Record(obj(dockerMachine, "default", "none", nil), facts.InfraMachine)))

	// The index holds buckets of references, shared by many at this count:
	// each DockerMachine still finds exactly its own Machine.
	for i := range 10000 {
		add(t, inv, machines, facts.Machine, machine("fleet", fmt.Sprintf("m-%d", i), "", "", fmt.Sprintf("dm-%d", i)))
	}
	for _, i := range []int{0, 1, 4096, 9999} {
		got := inv.Referring(facts.InfraMachine, inv.Record(obj(dockerMachine, "fleet", fmt.Sprintf("dm-%d", i), nil), facts.InfraMachine))
		require.Len(t, got[facts.Machine], 1, "dm-%d", i)
		assert.Equal(t, fmt.Sprintf("m-%d", i), got[facts.Machine][0].Name())
	}
}
