package nodecache_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nodeguard/nodeguard/enforcer/engine"
	"github.com/nodeguard/nodeguard/enforcer/linkmodel"
	"github.com/nodeguard/nodeguard/enforcer/nodecache"
	"github.com/nodeguard/nodeguard/enforcer/record"
)

func shape(t testing.TB) *record.Shape {
	t.Helper()
	eval, err := engine.New(context.Background())
	require.NoError(t, err)
	s, err := nodecache.ShapeOf(eval)
	require.NoError(t, err)
	return s
}

var created = metav1.NewTime(time.Date(2026, 11, 30, 11, 0, 0, 0, time.UTC))

// realNode is a Node as a kubelet and CAPI leave it: most of it is never read.
func realNode(i int) *corev1.Node {
	name := fmt.Sprintf("ip-10-0-%d-%d.ec2.internal", i/250, i%250)
	n := &corev1.Node{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: "6a1f3c2e-8d4b-4c1a-9e2f-0b1c2d3e4f50", ResourceVersion: "123456789", CreationTimestamp: created,
			Labels: map[string]string{"kubernetes.io/hostname": name, "node.kubernetes.io/instance-type": "m6i.2xlarge", "topology.kubernetes.io/zone": "us-east-1a"},
			Annotations: map[string]string{"cluster.x-k8s.io/cluster-name": "prod-1", "cluster.x-k8s.io/cluster-namespace": "fleet",
				"cluster.x-k8s.io/machine": fmt.Sprintf("prod-1-md-0-abcde-%05d", i), "cluster.x-k8s.io/owner-kind": "MachineSet",
				"node.alpha.kubernetes.io/ttl": "0"},
		},
		Spec: corev1.NodeSpec{ProviderID: fmt.Sprintf("aws:///us-east-1a/i-%017x", i), PodCIDR: "192.168.1.0/24"},
	}
	for _, c := range []corev1.NodeConditionType{corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodeReady} {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: c, Status: corev1.ConditionFalse,
			LastHeartbeatTime: created, LastTransitionTime: created, Reason: "KubeletHasSufficient" + string(c), Message: "kubelet is posting status"})
	}
	n.Status.Capacity = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("32Gi")}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.1.2"}, {Type: corev1.NodeHostName, Address: name}}
	for j := range 20 {
		n.Status.Images = append(n.Status.Images, corev1.ContainerImage{Names: []string{fmt.Sprintf("registry.k8s.io/image-%d:v1.%d", j, j)}, SizeBytes: 1 << 27})
	}
	return n
}

func asUnstructured(t testing.TB, n *corev1.Node) *unstructured.Unstructured {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(n)
	require.NoError(t, err)
	return &unstructured.Unstructured{Object: m}
}

// What the cache keeps is exactly the declared fields, whichever client the
// Node came through: the typed path reads them through JSON tags, the
// unstructured one by path, and both rebuild the same object.
func TestKeepsExactlyTheDeclaredFields(t *testing.T) {
	s := shape(t)
	n := realNode(7)
	typed, err := s.Reduce(n)
	require.NoError(t, err)
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
	assert.Equal(t, want, typed.Object())
	u, err := s.Reduce(asUnstructured(t, n))
	require.NoError(t, err)
	assert.Equal(t, want, u.Object())
	assert.Equal(t, "ip-10-0-0-7.ec2.internal", typed.Name())
	assert.Equal(t, "123456789", typed.ResourceVersion())
	assert.EqualValues(t, "6a1f3c2e-8d4b-4c1a-9e2f-0b1c2d3e4f50", typed.UID())
}

func TestAbsentFieldsStayAbsent(t *testing.T) {
	s := shape(t)
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "bare"}}
	for _, obj := range []any{n, asUnstructured(t, n)} {
		r, err := s.Reduce(obj)
		require.NoError(t, err)
		assert.Equal(t, map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": "bare"}}, r.Object(), "%T", obj)
	}
}

// The criteria read every entry of a kept condition type, so a second Ready
// entry (which the API server does not forbid) is kept too, in order; and a
// Node whose kept strings pass 64 KiB is kept whole.
func TestRareNodesAreKeptWhole(t *testing.T) {
	s := shape(t)
	n := realNode(1)
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue})
	n.Annotations["cluster.x-k8s.io/cluster-name"] = strings.Repeat("x", 70_000)
	for _, obj := range []any{n, asUnstructured(t, n)} {
		r, err := s.Reduce(obj)
		require.NoError(t, err)
		o := r.Object()
		conditions, _, _ := unstructured.NestedSlice(o, "status", "conditions")
		assert.Equal(t, []any{
			map[string]any{"type": "Ready", "status": "False", "lastTransitionTime": "2026-11-30T11:00:00Z"},
			map[string]any{"type": "Ready", "status": "True"},
		}, conditions, "%T", obj)
		name, _, _ := unstructured.NestedString(o, "metadata", "annotations", "cluster.x-k8s.io/cluster-name")
		assert.Len(t, name, 70_000)
		assert.Equal(t, n.Name, r.Name())
	}
}

func TestOnlyAChangeTheCriteriaReadIsAChange(t *testing.T) {
	s := shape(t)
	var changed []string
	nodes := nodecache.NewNodes(s, nil, func(name string) { changed = append(changed, name) })
	n := realNode(3)
	add := func(n *corev1.Node) {
		r, err := s.Reduce(n)
		require.NoError(t, err)
		require.NoError(t, nodes.Add(r))
	}
	add(n)
	assert.Equal(t, []string{n.Name}, changed)
	// A kubelet's status report: heartbeat, images, resourceVersion.
	n.ResourceVersion = "123456790"
	n.Status.Conditions[2].LastHeartbeatTime = metav1.NewTime(created.Add(time.Minute))
	n.Status.Images = n.Status.Images[1:]
	add(n)
	assert.Len(t, changed, 1, "nothing judged changed")
	got, ok := nodes.Get(n.Name)
	require.True(t, ok)
	assert.Equal(t, "123456790", got.ResourceVersion(), "the cache still holds the new resourceVersion, for preconditions")
	n.Status.Conditions[2].Status = corev1.ConditionUnknown
	add(n)
	assert.Len(t, changed, 2, "Ready changed")
	// The index follows the record of each update, and only it.
	var infraProviderID linkmodel.Link
	for _, l := range linkmodel.MustEmbedded().Links {
		if l.Type == "infraProviderID" {
			infraProviderID = l
		}
	}
	assert.Equal(t, []string{n.Name}, nodes.Linked(infraProviderID, [][]string{{n.Spec.ProviderID}}))
	require.NoError(t, nodes.Delete(n.Name))
	assert.Len(t, changed, 3)
	assert.Zero(t, nodes.Len())
}

// An object finds the Nodes it could link through every declared link: by
// the Node's name, its providerID, or its annotations naming a Machine.
func TestLinkedFindsTheNodesAnObjectCouldLink(t *testing.T) {
	s := shape(t)
	model := linkmodel.MustEmbedded()
	nodes := nodecache.NewNodes(s, nil, nil)
	for i := range 3 {
		r, err := s.Reduce(realNode(i))
		require.NoError(t, err)
		require.NoError(t, nodes.Add(r))
	}
	link := func(typ string) linkmodel.Link {
		for _, l := range model.Links {
			if l.Type == typ {
				return l
			}
		}
		t.Fatalf("no link %s", typ)
		return linkmodel.Link{}
	}
	n1 := realNode(1)
	assert.Equal(t, []string{n1.Name}, nodes.Linked(link("machineNodeRef"), [][]string{{n1.Name}}))
	assert.Empty(t, nodes.Linked(link("machineNodeRef"), [][]string{{"not-a-node"}}))
	assert.Equal(t, []string{n1.Name}, nodes.Linked(link("machineProviderID"), [][]string{{n1.Spec.ProviderID}}))
	assert.Equal(t, []string{n1.Name}, nodes.Linked(link("infraProviderID"), [][]string{{n1.Spec.ProviderID}}))
	assert.Equal(t, []string{n1.Name}, nodes.Linked(link("nodeAnnotation"), [][]string{{"fleet", "prod-1-md-0-abcde-00001"}}))
	assert.Empty(t, nodes.Linked(link("nodeAnnotation"), [][]string{{"elsewhere", "prod-1-md-0-abcde-00001"}}))
	assert.ElementsMatch(t, []string{realNode(0).Name, realNode(2).Name},
		nodes.Linked(link("poolProviderIDList"), [][]string{{realNode(0).Spec.ProviderID}, {realNode(2).Spec.ProviderID}, {"aws:///nowhere"}}))

	// Two Nodes with one providerID (a Node re-registered under a new name):
	// both are found, and each is forgotten on its own.
	dup := realNode(1)
	dup.Name = "renamed"
	r, err := s.Reduce(dup)
	require.NoError(t, err)
	require.NoError(t, nodes.Add(r))
	assert.ElementsMatch(t, []string{n1.Name, "renamed"}, nodes.Linked(link("infraProviderID"), [][]string{{n1.Spec.ProviderID}}))
	require.NoError(t, nodes.Delete(n1.Name))
	assert.Equal(t, []string{"renamed"}, nodes.Linked(link("infraProviderID"), [][]string{{n1.Spec.ProviderID}}))
	// A changed providerID moves the Node in the index.
	dup.Spec.ProviderID = "aws:///us-east-1a/i-new"
	r, err = s.Reduce(dup)
	require.NoError(t, err)
	require.NoError(t, nodes.Add(r))
	assert.Empty(t, nodes.Linked(link("infraProviderID"), [][]string{{n1.Spec.ProviderID}}))
	assert.Equal(t, []string{"renamed"}, nodes.Linked(link("infraProviderID"), [][]string{{"aws:///us-east-1a/i-new"}}))
}

// A Watch fills the cache from a (fake) API server through an informer and
// reports adds, changes the criteria read, and deletes.
func TestWatchFollowsTheAPIServer(t *testing.T) {
	s := shape(t)
	client := fake.NewClientset(realNode(0), realNode(1))
	var mu sync.Mutex
	changed := map[string]int{}
	w, err := nodecache.NewWatch(nodecache.WatchOptions{Shape: s, Kube: client, OnChange: func(name string) {
		mu.Lock()
		changed[name]++
		mu.Unlock()
	}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	require.Eventually(t, w.HasSynced, 5*time.Second, 10*time.Millisecond)
	count := func(name string) int {
		mu.Lock()
		defer mu.Unlock()
		return changed[name]
	}
	n0 := realNode(0)
	assert.Eventually(t, func() bool { return count(n0.Name) == 1 && count(realNode(1).Name) == 1 }, 5*time.Second, 10*time.Millisecond)

	n0.ResourceVersion = "2"
	n0.Status.Images = nil
	_, err = client.CoreV1().Nodes().Update(ctx, n0, metav1.UpdateOptions{})
	require.NoError(t, err)
	assert.Eventually(t, func() bool { r, _ := w.Get(n0.Name); return r.ResourceVersion() == "2" }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, 1, count(n0.Name), "a change nothing judged reads")

	n0.Spec.ProviderID = "aws:///us-east-1a/i-moved"
	_, err = client.CoreV1().Nodes().Update(ctx, n0, metav1.UpdateOptions{})
	require.NoError(t, err)
	assert.Eventually(t, func() bool { return count(n0.Name) == 2 }, 5*time.Second, 10*time.Millisecond)

	require.NoError(t, client.CoreV1().Nodes().Delete(ctx, n0.Name, metav1.DeleteOptions{}))
	assert.Eventually(t, func() bool { return count(n0.Name) == 3 }, 5*time.Second, 10*time.Millisecond)
	_, ok := w.Get(n0.Name)
	assert.False(t, ok)
	assert.Equal(t, 1, w.Len())
}
