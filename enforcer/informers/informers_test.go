package informers_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/nodeguard/nodeguard/enforcer/informers"
	"github.com/nodeguard/nodeguard/enforcer/inventory"
	"github.com/nodeguard/nodeguard/enforcer/linkmodel"
	"github.com/nodeguard/nodeguard/internal/testcluster"
)

var (
	machineGVK = schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "Machine"}
	dockerGVK  = schema.GroupVersionKind{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Kind: "DockerMachine"}
	poolGVK    = schema.GroupVersionKind{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Kind: "DockerMachinePool"}
	fooOld     = schema.GroupVersionKind{Group: "infrastructure.example.com", Version: "v1alpha1", Kind: "FooMachine"}
	fooGVK     = schema.GroupVersionKind{Group: "infrastructure.example.com", Version: "v1beta1", Kind: "FooMachine"}
	crdGVK     = schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"}
)

var object = testcluster.Object

func machine(name, infraGroup, infraKind string) *unstructured.Unstructured {
	return object(machineGVK, "default", name, map[string]any{
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
		{GVK: machineGVK, Resource: "machines"},
		{GVK: dockerGVK, Resource: "dockermachines"},
		{GVK: poolGVK, Resource: "dockermachinepools"},
		{GVK: fooOld, Resource: "foomachines"},
		{GVK: fooGVK, Resource: "foomachines"},
		{GVK: crdGVK, Resource: "customresourcedefinitions", Cluster: true},
	}, objs...)
}

func TestSyncerFindsKindsAndBecomesReady(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client, mapper := setup(t,
		machine("m1", "infrastructure.cluster.x-k8s.io", "DockerMachine"),
		object(dockerGVK, "default", "m1", map[string]any{"spec": map[string]any{"providerID": "docker:////m1"}}),
		crd("dockermachines.infrastructure.cluster.x-k8s.io", map[string]string{"cluster.x-k8s.io/v1beta2": "v1beta2"}),
		crd("foomachines.infrastructure.example.com", map[string]string{"cluster.x-k8s.io/v1beta1": "v1alpha1_v1beta1"}),
	)
	inv := inventory.New(linkmodel.MustEmbedded())
	s := informers.New(inv, informers.Options{
		Client: client, Mapper: mapper, RetryInterval: 50 * time.Millisecond,
		InfraKinds: []schema.GroupKind{{Group: "infrastructure.cluster.x-k8s.io", Kind: "AWSMachine"}}, // not served
		PoolKinds:  []schema.GroupKind{poolGVK.GroupKind()},
	})
	require.Error(t, s.Ready(), "not ready before start")
	require.NoError(t, s.Start(ctx))
	require.Eventually(t, func() bool { return s.Ready() == nil }, 5*time.Second, 10*time.Millisecond)

	infra, pools := s.SyncedKinds()
	assert.Equal(t, []schema.GroupVersionKind{dockerGVK}, infra, "found from the Machine's reference; AWSMachine is not served")
	assert.Equal(t, []schema.GroupVersionKind{poolGVK}, pools)

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
	_, err := client.Resource(machineGVK.GroupVersion().WithResource("machines")).Namespace("default").
		Create(ctx, machine("m2", "infrastructure.example.com", "FooMachine"), metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		infra, _ := s.SyncedKinds()
		return len(infra) == 2 && s.Ready() == nil
	}, 5*time.Second, 10*time.Millisecond)
	infra, _ = s.SyncedKinds()
	assert.Equal(t, []schema.GroupVersionKind{dockerGVK, fooGVK}, infra)

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
	client, mapper := setup(t, machine("m1", "infrastructure.unknown.io", "GhostMachine"))
	s := informers.New(inventory.New(linkmodel.MustEmbedded()), informers.Options{Client: client, Mapper: mapper, RetryInterval: 50 * time.Millisecond})
	require.NoError(t, s.Start(ctx))
	require.Eventually(t, func() bool { return s.Ready() == nil }, 5*time.Second, 10*time.Millisecond)
	failed := s.Failed()
	require.Contains(t, failed, schema.GroupKind{Group: "infrastructure.unknown.io", Kind: "GhostMachine"})
	infra, _ := s.SyncedKinds()
	assert.Empty(t, infra, "the rule then denies the Machine's Node as unverified")
}

func TestStartFailsWithoutMachines(t *testing.T) {
	client := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme())
	s := informers.New(inventory.New(linkmodel.MustEmbedded()), informers.Options{Client: client, Mapper: meta.NewDefaultRESTMapper(nil)})
	assert.ErrorContains(t, s.Start(context.Background()), "served version of Cluster API Machines")
}
