package facts_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/record"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/internal/testnodes"
)

func shape(t testing.TB) *record.Shape {
	t.Helper()
	eval, err := rule.NewEngine(context.Background())
	require.NoError(t, err)
	s, err := facts.NodeShapeOf(eval)
	require.NoError(t, err)
	return s
}

func asUnstructured(t testing.TB, n *corev1.Node) *unstructured.Unstructured {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(n)
	require.NoError(t, err)
	return &unstructured.Unstructured{Object: m}
}

// The cache keeps what the policy declares (the link model's Node fields,
// the criteria's and their Ready condition) and the uid and resourceVersion
// for delete preconditions; enforcer/record's tests show that a shape keeps
// exactly its fields from every form of a Node.
func TestTheShapeIsThePolicys(t *testing.T) {
	s := shape(t)
	var scalars []string
	for _, p := range s.Scalars() {
		scalars = append(scalars, p.String())
	}
	assert.ElementsMatch(t, []string{"metadata.uid", "metadata.resourceVersion", "metadata.creationTimestamp", "spec.providerID",
		"metadata.annotations.cluster.x-k8s.io/cluster-name", "metadata.annotations.cluster.x-k8s.io/cluster-namespace",
		"metadata.annotations.cluster.x-k8s.io/machine"}, scalars)
	assert.Empty(t, s.Lists())
	r, err := s.Reduce(testnodes.Real(7))
	require.NoError(t, err)
	conditions, _, _ := unstructured.NestedSlice(r.Object(), "status", "conditions")
	assert.Equal(t, []any{map[string]any{"type": "Ready", "status": "False", "lastTransitionTime": "2026-11-30T11:00:00Z"}}, conditions)
}

func TestOnlyAChangeTheCriteriaReadIsAChange(t *testing.T) {
	s := shape(t)
	var changed []string
	nodes := facts.NewNodes(s, nil, func(name string) { changed = append(changed, name) })
	n := testnodes.Real(3)
	add := func(n *corev1.Node) {
		r, err := s.Reduce(n)
		require.NoError(t, err)
		require.NoError(t, nodes.Add(r))
	}
	add(n)
	assert.Equal(t, []string{n.Name}, changed)
	// A kubelet's status report: heartbeat, images, resourceVersion.
	n.ResourceVersion = "123456790"
	n.Status.Conditions[2].LastHeartbeatTime = metav1.NewTime(testnodes.Created.Add(time.Minute))
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
	var infraProviderID rule.Link
	for _, l := range rule.MustEmbeddedModel().Links {
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
	model := rule.MustEmbeddedModel()
	nodes := facts.NewNodes(s, nil, nil)
	for i := range 3 {
		r, err := s.Reduce(testnodes.Real(i))
		require.NoError(t, err)
		require.NoError(t, nodes.Add(r))
	}
	link := func(typ string) rule.Link {
		for _, l := range model.Links {
			if l.Type == typ {
				return l
			}
		}
		t.Fatalf("no link %s", typ)
		return rule.Link{}
	}
	n1 := testnodes.Real(1)
	assert.Equal(t, []string{n1.Name}, nodes.Linked(link("machineNodeRef"), [][]string{{n1.Name}}))
	assert.Empty(t, nodes.Linked(link("machineNodeRef"), [][]string{{"not-a-node"}}))
	assert.Equal(t, []string{n1.Name}, nodes.Linked(link("machineProviderID"), [][]string{{n1.Spec.ProviderID}}))
	assert.Equal(t, []string{n1.Name}, nodes.Linked(link("infraProviderID"), [][]string{{n1.Spec.ProviderID}}))
	assert.Equal(t, []string{n1.Name}, nodes.Linked(link("nodeAnnotation"), [][]string{{"fleet", "prod-1-md-0-abcde-00001"}}))
	assert.Empty(t, nodes.Linked(link("nodeAnnotation"), [][]string{{"elsewhere", "prod-1-md-0-abcde-00001"}}))
	assert.ElementsMatch(t, []string{testnodes.Real(0).Name, testnodes.Real(2).Name},
		nodes.Linked(link("poolProviderIDList"), [][]string{{testnodes.Real(0).Spec.ProviderID}, {testnodes.Real(2).Spec.ProviderID}, {"aws:///nowhere"}}))

	// Two Nodes with one providerID (a Node re-registered under a new name):
	// both are found, and each is forgotten on its own.
	dup := testnodes.Real(1)
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
	client := fake.NewClientset(testnodes.Real(0), testnodes.Real(1))
	var mu sync.Mutex
	changed := map[string]int{}
	w, err := facts.NewNodeWatch(facts.NodeWatchOptions{Shape: s, Kube: client, OnChange: func(name string) {
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
	n0 := testnodes.Real(0)
	assert.Eventually(t, func() bool { return count(n0.Name) == 1 && count(testnodes.Real(1).Name) == 1 }, 5*time.Second, 10*time.Millisecond)

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

// A change of nodeguard's verdicts on a Node and of nothing else goes to
// OnVerdict, not OnChange: nothing judged reads them. With anything judged
// changed beside it, it is a change.
func TestAVerdictAloneIsNoChange(t *testing.T) {
	eval, err := rule.NewEngine(context.Background())
	require.NoError(t, err)
	verdicts := []rule.Path{{"metadata", "annotations", "nodeguard.io/released"}}
	s, err := facts.NodeShapeOf(eval, verdicts...)
	require.NoError(t, err)
	client := fake.NewClientset(testnodes.Real(0))
	var mu sync.Mutex
	changed, verdict := 0, 0
	w, err := facts.NewNodeWatch(facts.NodeWatchOptions{Shape: s, Kube: client, Verdicts: verdicts,
		OnChange:  func(string) { mu.Lock(); changed++; mu.Unlock() },
		OnVerdict: func(string) { mu.Lock(); verdict++; mu.Unlock() }})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	counts := func() [2]int { mu.Lock(); defer mu.Unlock(); return [2]int{changed, verdict} }
	require.Eventually(t, func() bool { return counts() == [2]int{1, 0} }, 5*time.Second, 10*time.Millisecond)

	n := testnodes.Real(0)
	if n.Annotations == nil {
		n.Annotations = map[string]string{}
	}
	n.Annotations["nodeguard.io/released"] = string(n.UID)
	_, err = client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return counts() == [2]int{1, 1} }, 5*time.Second, 10*time.Millisecond, "the verdict alone")

	delete(n.Annotations, "nodeguard.io/released")
	n.Spec.ProviderID = "aws:///us-east-1a/i-moved"
	_, err = client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return counts() == [2]int{2, 1} }, 5*time.Second, 10*time.Millisecond, "a verdict and a providerID: a change")
}
