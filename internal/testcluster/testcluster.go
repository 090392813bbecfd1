// Package testcluster serves manifests through client-go's fake dynamic
// client, with a REST mapper for the kinds nodeguard reads: an API server for
// unit tests of the live paths (informers, fresh reads, the webhook).
package testcluster

import (
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/nodeguard/nodeguard/enforcer/manifest"
)

// kinds the fake serves, with their resources.
var kinds = map[schema.GroupVersionKind]string{
	{Version: "v1", Kind: "Node"}:                                                         "nodes",
	{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "Machine"}:                      "machines",
	{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "Cluster"}:                      "clusters",
	{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Kind: "DockerMachine"}: "dockermachines",
	{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"}:      "customresourcedefinitions",
}

// CAPD serves the manifests under dir (the CAPD example), the Clusters named
// (namespace/name pairs), and the DockerMachine CRD with its contract label.
func CAPD(t testing.TB, dir string, clusters ...[2]string) (*dynamicfake.FakeDynamicClient, meta.RESTMapper) {
	t.Helper()
	objs, err := manifest.Load(dir)
	require.NoError(t, err)
	crd := &unstructured.Unstructured{}
	crd.SetAPIVersion("apiextensions.k8s.io/v1")
	crd.SetKind("CustomResourceDefinition")
	crd.SetName("dockermachines.infrastructure.cluster.x-k8s.io")
	crd.SetLabels(map[string]string{"cluster.x-k8s.io/v1beta2": "v1beta1_v1beta2"})
	served := []runtime.Object{crd}
	for _, o := range objs {
		served = append(served, o)
	}
	for _, c := range clusters {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("cluster.x-k8s.io/v1beta2")
		u.SetKind("Cluster")
		u.SetNamespace(c[0])
		u.SetName(c[1])
		served = append(served, u)
	}
	var gvs []schema.GroupVersion
	listKinds := map[schema.GroupVersionResource]string{}
	for gvk, resource := range kinds {
		gvs = append(gvs, gvk.GroupVersion())
		listKinds[gvk.GroupVersion().WithResource(resource)] = gvk.Kind + "List"
	}
	mapper := meta.NewDefaultRESTMapper(gvs)
	for gvk := range kinds {
		scope := meta.RESTScopeNamespace
		if gvk.Kind == "Node" || gvk.Kind == "CustomResourceDefinition" {
			scope = meta.RESTScopeRoot
		}
		mapper.Add(gvk, scope)
	}
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), listKinds, served...), mapper
}
