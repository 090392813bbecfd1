package check

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/nodeguard/nodeguard/enforcer/live"
	"github.com/nodeguard/nodeguard/enforcer/manifest"
)

// fakeCluster serves the CAPD example (Node, Machine, DockerMachine) and the
// DockerMachine CRD with its contract label.
func fakeCluster(t *testing.T) (*dynamicfake.FakeDynamicClient, meta.RESTMapper) {
	t.Helper()
	objs, err := manifest.Load("../../examples/capd-v1beta2")
	require.NoError(t, err)
	crd := &unstructured.Unstructured{}
	crd.SetAPIVersion("apiextensions.k8s.io/v1")
	crd.SetKind("CustomResourceDefinition")
	crd.SetName("dockermachines.infrastructure.cluster.x-k8s.io")
	crd.SetLabels(map[string]string{"cluster.x-k8s.io/v1beta2": "v1beta1_v1beta2"})
	runtimeObjs := []runtime.Object{crd}
	for _, o := range objs {
		runtimeObjs = append(runtimeObjs, o)
	}
	gvks := map[schema.GroupVersionKind]string{
		{Version: "v1", Kind: "Node"}:                                                         "nodes",
		{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "Machine"}:                      "machines",
		{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Kind: "DockerMachine"}: "dockermachines",
		{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"}:      "customresourcedefinitions",
	}
	var gvs []schema.GroupVersion
	listKinds := map[schema.GroupVersionResource]string{}
	for gvk, resource := range gvks {
		gvs = append(gvs, gvk.GroupVersion())
		listKinds[gvk.GroupVersion().WithResource(resource)] = gvk.Kind + "List"
	}
	mapper := meta.NewDefaultRESTMapper(gvs)
	for gvk := range gvks {
		scope := meta.RESTScopeNamespace
		if gvk.Kind == "Node" || gvk.Kind == "CustomResourceDefinition" {
			scope = meta.RESTScopeRoot
		}
		mapper.Add(gvk, scope)
	}
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), listKinds, runtimeObjs...), mapper
}

func TestLiveCheckAgainstAnAPIServer(t *testing.T) {
	ctx := context.Background()
	client, mapper := fakeCluster(t)
	opts := Options{Node: "dev-md-0-x7k2p-abcde", Output: "text"}

	c := live.Clients{Dynamic: client, Mapper: mapper}
	d, err := judgeWith(ctx, c, opts, nil)
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	require.Len(t, d.Blockers, 1)
	assert.Equal(t, "DockerMachine", d.Blockers[0].Kind)

	// CAPI deletes the DockerMachine: the Node may go.
	gvr := schema.GroupVersionResource{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Resource: "dockermachines"}
	require.NoError(t, client.Resource(gvr).Namespace("default").Delete(ctx, "dev-md-0-x7k2p-abcde", metav1.DeleteOptions{}))
	d, err = judgeWith(ctx, c, opts, nil)
	require.NoError(t, err)
	assert.True(t, d.Allowed, "%v", d.Messages)

	_, err = judgeWith(ctx, c, Options{Node: "missing"}, nil)
	assert.ErrorContains(t, err, `get node "missing"`)
}

func TestLiveCheckWithABadKubeconfig(t *testing.T) {
	_, err := judgeLive(context.Background(), Options{Node: "n", Kubeconfig: "/nonexistent/kubeconfig"}, nil)
	assert.ErrorContains(t, err, "load kubeconfig")
}
