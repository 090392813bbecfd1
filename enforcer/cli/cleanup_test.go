package cli

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/internal/testcluster"
)

// scales records the replicas each scale update asks for (the fake
// clientset keeps no scale subresource of its own).
func scales(kube *fake.Clientset) *[]int32 {
	var asked []int32
	kube.PrependReactor("update", "deployments", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "scale" {
			return false, nil, nil
		}
		s := a.(clienttesting.UpdateAction).GetObject().(*autoscalingv1.Scale)
		asked = append(asked, s.Spec.Replicas)
		return true, s, nil
	})
	return &asked
}

func deployment() *appsv1.Deployment {
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "nodeguard-system", Name: "nodeguard"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "nodeguard"}}}}
}

func clients(dyn *dynamicfake.FakeDynamicClient) kube.Clients {
	return kube.Clients{Dynamic: dyn, Mapper: meta.NewDefaultRESTMapper(nil)}
}

// Nothing to keep it from cleaning: nodeguard is scaled to 0 (the fleet
// would restore what is removed) and stays there for helm to delete.
func TestCleanupStopsNodeguardFirst(t *testing.T) {
	kube := fake.NewClientset(deployment())
	asked := scales(kube)
	var out bytes.Buffer
	code, err := run(context.Background(), clients(dynamicfake.NewSimpleDynamicClient(runtime.NewScheme())), kube,
		CleanupOptions{Namespace: "nodeguard-system", Deployment: "nodeguard", Timeout: 5 * time.Second}, &out)
	require.NoError(t, err)
	assert.Equal(t, 0, code, out.String())
	assert.Equal(t, []int32{0}, *asked)
	assert.Contains(t, out.String(), "Deployment nodeguard-system/nodeguard scaled from 2 to 0")
}

// What cannot be removed keeps nodeguard guarding: scaled back, exit 1.
func TestCleanupScalesBackWhenSomethingStays(t *testing.T) {
	kube := fake.NewClientset(deployment())
	asked := scales(kube)
	dyn := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme())
	dyn.PrependReactor("get", "providers", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("the API server said no")
	})
	var out bytes.Buffer
	code, err := run(context.Background(), clients(dyn), kube, CleanupOptions{Namespace: "nodeguard-system", Deployment: "nodeguard", Timeout: 5 * time.Second}, &out)
	require.NoError(t, err)
	assert.Equal(t, 1, code)
	assert.Equal(t, []int32{0, 2}, *asked)
	assert.Contains(t, out.String(), "Gatekeeper Provider nodeguard: get providers nodeguard: the API server said no")
	assert.Contains(t, out.String(), "scaled back to 2: nodeguard guards as before")
}

// A shard's cleanup (--watch-filter) looks only at its own Clusters and
// leaves Gatekeeper's Provider, which a shard never writes, alone.
func TestCleanupOfAShardKeepsToItsClusters(t *testing.T) {
	clusterGVK := schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "Cluster"}
	labelled := func(name, shard string) runtime.Object {
		u := testcluster.Object(clusterGVK, "default", name, nil)
		u.SetLabels(map[string]string{"cluster.x-k8s.io/watch-filter": shard})
		return u
	}
	dyn, mapper := testcluster.Serve([]testcluster.Kind{{GVK: clusterGVK, Resource: "clusters"}}, labelled("dev", "a"), labelled("two", "b"))
	var out bytes.Buffer
	code, err := run(context.Background(), kube.Clients{Dynamic: dyn, Mapper: mapper}, fake.NewClientset(),
		CleanupOptions{Namespace: "nodeguard-system", WatchFilter: "a"}, &out)
	require.NoError(t, err)
	assert.Equal(t, 0, code, out.String())
	assert.Contains(t, out.String(), "Cluster default/dev skipped", "its own Cluster is looked at (no kubeconfig here)")
	assert.NotContains(t, out.String(), "default/two", "another shard's is not")
	for _, a := range dyn.Actions() {
		assert.NotEqual(t, "providers", a.GetResource().Resource, "Gatekeeper's Provider is no shard's")
	}
}
