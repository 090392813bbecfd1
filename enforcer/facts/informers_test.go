package facts_test

import (
	"context"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/internal/testcluster"
)

var (
	fooOld = schema.GroupVersionKind{Group: "infrastructure.example.com", Version: "v1alpha1", Kind: "FooMachine"}
	fooGVK = schema.GroupVersionKind{Group: "infrastructure.example.com", Version: "v1beta1", Kind: "FooMachine"}
	crdGVK = schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"}
)

var object = testcluster.Object

func informerMachine(name, infraGroup, infraKind string) *unstructured.Unstructured {
	return object(testcluster.MachineGVK, "default", name, map[string]any{
		"spec":   map[string]any{"infrastructureRef": map[string]any{"apiGroup": infraGroup, "kind": infraKind, "name": name}},
		"status": map[string]any{"nodeRef": map[string]any{"name": name}},
	})
}

func crd(name string, labels map[string]string) *unstructured.Unstructured {
	u := object(crdGVK, "", name, nil)
	u.SetLabels(labels)
	return u
}

func setup(t *testing.T, objs ...runtime.Object) (*dynamicfake.FakeDynamicClient, meta.RESTMapper) {
	t.Helper()
	// Listed in preference order: FooMachine's preferred version is v1alpha1,
	// so only the contract label leads to v1beta1.
	return testcluster.Serve([]testcluster.Kind{
		{GVK: testcluster.MachineGVK, Resource: "machines"},
		{GVK: testcluster.DockerMachineGVK, Resource: "dockermachines"},
		{GVK: testcluster.DockerMachinePoolGVK, Resource: "dockermachinepools"},
		{GVK: fooOld, Resource: "foomachines"},
		{GVK: fooGVK, Resource: "foomachines"},
		{GVK: crdGVK, Resource: "customresourcedefinitions", Cluster: true},
	}, objs...)
}

// dockerM1 is Machine m1, its DockerMachine, and the DockerMachine CRD with
// its contract label.
func dockerM1() []runtime.Object {
	return []runtime.Object{
		informerMachine("m1", "infrastructure.cluster.x-k8s.io", "DockerMachine"),
		object(testcluster.DockerMachineGVK, "default", "m1", map[string]any{"spec": map[string]any{"providerID": "docker:////m1"}}),
		crd("dockermachines.infrastructure.cluster.x-k8s.io", map[string]string{"cluster.x-k8s.io/v1beta2": "v1beta2"}),
	}
}

func TestSyncerFindsKindsAndBecomesReady(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client, mapper := setup(t, append(dockerM1(),
		crd("foomachines.infrastructure.example.com", map[string]string{"cluster.x-k8s.io/v1beta1": "v1alpha1_v1beta1"}))...)
	inv := facts.NewInventory(rule.MustEmbeddedModel())
	s := facts.NewSyncer(inv, facts.SyncerOptions{
		Client: client, Mapper: mapper, RetryInterval: 50 * time.Millisecond,
		InfraKinds: []schema.GroupKind{{Group: "infrastructure.cluster.x-k8s.io", Kind: "AWSMachine"}}, // not served
		PoolKinds:  []schema.GroupKind{testcluster.DockerMachinePoolGVK.GroupKind()},
	})
	require.Error(t, s.Ready(), "not ready before start")
	require.NoError(t, s.Start(ctx))
	require.Eventually(t, func() bool { return s.Ready() == nil }, 5*time.Second, 10*time.Millisecond)

	infra, pools := s.SyncedKinds()
	assert.Equal(t, []schema.GroupVersionKind{testcluster.DockerMachineGVK}, infra, "found from the Machine's reference; AWSMachine is not served")
	assert.Equal(t, []schema.GroupVersionKind{testcluster.DockerMachinePoolGVK}, pools)

	node := object(schema.GroupVersionKind{Version: "v1", Kind: "Node"}, "", "m1", nil)
	objs, _ := inv.Candidates(node)
	require.Len(t, objs, 2)
	// Cached objects went through the transform.
	for _, o := range objs {
		_, hasStatus := o.Object["status"]
		if o.GetKind() == "DockerMachine" {
			assert.False(t, hasStatus, "fields the rule does not read are dropped")
		}
	}

	// A Machine referencing a new kind: its informer starts at the CRD's
	// contract version (the last one listed).
	_, err := client.Resource(testcluster.MachineGVK.GroupVersion().WithResource("machines")).Namespace("default").
		Create(ctx, informerMachine("m2", "infrastructure.example.com", "FooMachine"), metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		infra, _ := s.SyncedKinds()
		return len(infra) == 2 && s.Ready() == nil
	}, 5*time.Second, 10*time.Millisecond)
	infra, _ = s.SyncedKinds()
	assert.Equal(t, []schema.GroupVersionKind{testcluster.DockerMachineGVK, fooGVK}, infra)

	// An update reaches the cache and its indexes.
	_, err = client.Resource(fooGVK.GroupVersion().WithResource("foomachines")).Namespace("default").
		Create(ctx, object(fooGVK, "default", "m2", map[string]any{"spec": map[string]any{"providerID": "foo://m2"}}), metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		objs, _ := inv.Candidates(object(schema.GroupVersionKind{Version: "v1", Kind: "Node"}, "", "x", map[string]any{"spec": map[string]any{"providerID": "foo://m2"}}))
		return len(objs) == 1
	}, 5*time.Second, 10*time.Millisecond)
}

func TestUnresolvableKindDoesNotBlockReadiness(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client, mapper := setup(t, informerMachine("m1", "infrastructure.unknown.io", "GhostMachine"))
	s := facts.NewSyncer(facts.NewInventory(rule.MustEmbeddedModel()), facts.SyncerOptions{Client: client, Mapper: mapper, RetryInterval: 50 * time.Millisecond})
	require.NoError(t, s.Start(ctx))
	require.Eventually(t, func() bool { return s.Ready() == nil }, 5*time.Second, 10*time.Millisecond)
	failed := s.Failed()
	require.Contains(t, failed, schema.GroupKind{Group: "infrastructure.unknown.io", Kind: "GhostMachine"})
	infra, _ := s.SyncedKinds()
	assert.Empty(t, infra, "the rule then denies the Machine's Node as unverified")
}

func TestStartFailsWithoutMachines(t *testing.T) {
	client := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme())
	s := facts.NewSyncer(facts.NewInventory(rule.MustEmbeddedModel()), facts.SyncerOptions{Client: client, Mapper: meta.NewDefaultRESTMapper(nil)})
	assert.ErrorContains(t, s.Start(context.Background()), "served version of Cluster API Machines")
}

// A cache whose watch broke (the API server away) may miss objects made
// meanwhile: it is not trusted to prove an absence until a LIST made after
// the watch is back is found in it. The fake API server does not replay
// what a resumed watch missed, so the check finds the cache behind, makes
// the informer relist, and then trusts it again.
func TestACacheWhoseWatchBrokeIsNotTrustedUntilItCaughtUp(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client, mapper := setup(t, dockerM1()...)
	dockers := testcluster.DockerMachineGVK.GroupVersion().WithResource("dockermachines")
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
	var down atomic.Bool
	var mu sync.Mutex
	var current watch.Interface
	client.PrependWatchReactor("dockermachines", func(a clienttesting.Action) (bool, watch.Interface, error) {
		if down.Load() {
			return true, nil, refused
		}
		w, err := client.Tracker().Watch(dockers, a.GetNamespace())
		mu.Lock()
		current = w
		mu.Unlock()
		return true, w, err
	})
	client.PrependReactor("list", "dockermachines", func(clienttesting.Action) (bool, runtime.Object, error) {
		if down.Load() {
			return true, nil, refused
		}
		return false, nil, nil
	})
	inv := facts.NewInventory(rule.MustEmbeddedModel())
	s := facts.NewSyncer(inv, facts.SyncerOptions{Client: client, Mapper: mapper, RetryInterval: 50 * time.Millisecond})
	require.NoError(t, s.Start(ctx))
	require.Eventually(t, func() bool { return s.Ready() == nil }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, s.Recovering())
	linkedTo := func(pid string) int {
		objs, _ := inv.Candidates(object(schema.GroupVersionKind{Version: "v1", Kind: "Node"}, "", "n", map[string]any{"spec": map[string]any{"providerID": pid}}))
		return len(objs)
	}
	require.Equal(t, 1, linkedTo("docker:////m1"))

	// The watch ends, after an event (a watch ending in its first second with
	// no event makes the reflector relist, as an error does), and the API
	// server is away: the reflector will resume watching, not relist.
	require.NoError(t, client.Tracker().Create(dockers,
		object(testcluster.DockerMachineGVK, "default", "m0", map[string]any{"spec": map[string]any{"providerID": "docker:////m0"}}), "default"))
	require.Eventually(t, func() bool { return linkedTo("docker:////m0") == 1 }, 5*time.Second, 10*time.Millisecond,
		"the watch delivered an event")
	down.Store(true)
	mu.Lock()
	current.Stop()
	mu.Unlock()
	require.Eventually(t, func() bool { return s.Recovering() != nil }, 10*time.Second, 10*time.Millisecond)
	assert.ErrorContains(t, s.Recovering(), "DockerMachine")
	assert.NoError(t, s.Ready(), "ready: the cache still shows what exists")

	// Made meanwhile (the tracker stands for etcd): the cache lacks it.
	require.NoError(t, client.Tracker().Create(dockers,
		object(testcluster.DockerMachineGVK, "default", "m2", map[string]any{"spec": map[string]any{"providerID": "docker:////m2"}}), "default"))
	assert.Never(t, func() bool { return linkedTo("docker:////m2") != 0 }, 200*time.Millisecond, 10*time.Millisecond,
		"the cache cannot have it while the API server is away")
	assert.Error(t, s.Recovering(), "not trusted while it cannot have caught up")

	down.Store(false)
	require.Eventually(t, func() bool { return s.Recovering() == nil }, 30*time.Second, 20*time.Millisecond, "trusted again once caught up")
	assert.Equal(t, 1, linkedTo("docker:////m2"), "trusted only once it holds what was made meanwhile")
}

// A kind a live Constraint edit adds is watched from then on: its objects
// are found, and it is reported with its source.
func TestAddParameterKindsWatchesANewKind(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool := object(testcluster.DockerMachinePoolGVK, "default", "p1", map[string]any{"spec": map[string]any{"providerIDList": []any{"docker:////p1-0"}}})
	client, mapper := setup(t, pool)
	inv := facts.NewInventory(rule.MustEmbeddedModel())
	s := facts.NewSyncer(inv, facts.SyncerOptions{Client: client, Mapper: mapper})
	require.NoError(t, s.Start(ctx))
	require.Eventually(t, func() bool { return s.Ready() == nil }, 5*time.Second, 10*time.Millisecond)
	_, pools := s.SyncedKinds()
	require.Empty(t, pools, "no parameter lists a pool kind yet")

	s.AddParameterKinds(nil, []schema.GroupKind{testcluster.DockerMachinePoolGVK.GroupKind()})
	require.Eventually(t, func() bool {
		_, pools := s.SyncedKinds()
		return len(pools) == 1 && s.Ready() == nil
	}, 5*time.Second, 10*time.Millisecond)
	node := object(schema.GroupVersionKind{Version: "v1", Kind: "Node"}, "", "p1-0", map[string]any{"spec": map[string]any{"providerID": "docker:////p1-0"}})
	objs, _ := inv.Candidates(node)
	require.Len(t, objs, 1, "the pool listing the Node is a candidate")
	var sources []string
	for _, w := range s.Watched() {
		if w.GVK.Kind == "DockerMachinePool" {
			sources = w.Sources
		}
	}
	assert.Equal(t, []string{facts.SourceParameter}, sources)
}
