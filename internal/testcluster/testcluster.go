// Package testcluster is the API server of unit tests of the live paths
// (informers, fresh reads, the guard, the webhook): objects built in a line,
// served with a REST mapper through client-go's fake dynamic client, alone or
// with the manifests of an example.
package testcluster

import (
	"context"
	"maps"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// The CAPI kinds most tests serve.
var (
	MachineGVK           = schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "Machine"}
	ClusterGVK           = schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "Cluster"}
	DockerMachineGVK     = schema.GroupVersionKind{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Kind: "DockerMachine"}
	DockerMachinePoolGVK = schema.GroupVersionKind{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Kind: "DockerMachinePool"}
)

// Object is an object of gvk in namespace ("" for a cluster-scoped one)
// with the given top-level fields (spec, status, ...).
func Object(gvk schema.GroupVersionKind, namespace, name string, fields map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	maps.Copy(u.Object, fields)
	u.SetGroupVersionKind(gvk)
	u.SetNamespace(namespace)
	u.SetName(name)
	return u
}

// Kind is one kind the fake serves.
type Kind struct {
	GVK      schema.GroupVersionKind
	Resource string // plural, lower case
	Cluster  bool   // cluster-scoped
}

// Serve serves objs for kinds through client-go's fake dynamic client, with
// a mapper that prefers the versions listed first.
func Serve(kinds []Kind, objs ...runtime.Object) (*dynamicfake.FakeDynamicClient, meta.RESTMapper) {
	var gvs []schema.GroupVersion
	listKinds := map[schema.GroupVersionResource]string{}
	for _, k := range kinds {
		gvs = append(gvs, k.GVK.GroupVersion())
		listKinds[k.GVK.GroupVersion().WithResource(k.Resource)] = k.GVK.Kind + "List"
	}
	mapper := meta.NewDefaultRESTMapper(gvs)
	for _, k := range kinds {
		scope := meta.RESTScopeNamespace
		if k.Cluster {
			scope = meta.RESTScopeRoot
		}
		mapper.Add(k.GVK, scope)
	}
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), listKinds, objs...), mapper
}

var crdGVK = schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"}

// capd are the kinds CAPD serves.
var capd = []Kind{
	{GVK: schema.GroupVersionKind{Version: "v1", Kind: "Node"}, Resource: "nodes", Cluster: true},
	{GVK: MachineGVK, Resource: "machines"},
	{GVK: ClusterGVK, Resource: "clusters"},
	{GVK: DockerMachineGVK, Resource: "dockermachines"},
	{GVK: crdGVK, Resource: "customresourcedefinitions", Cluster: true},
}

// CAPD serves the manifests under dir (the CAPD example), the Clusters named
// (namespace/name pairs), and the DockerMachine CRD with its contract label.
func CAPD(t testing.TB, dir string, clusters ...[2]string) (*dynamicfake.FakeDynamicClient, meta.RESTMapper) {
	t.Helper()
	objs, err := facts.LoadManifests(dir)
	require.NoError(t, err)
	crd := Object(crdGVK, "", "dockermachines.infrastructure.cluster.x-k8s.io", nil)
	crd.SetLabels(map[string]string{"cluster.x-k8s.io/v1beta2": "v1beta1_v1beta2"})
	served := []runtime.Object{crd}
	for _, o := range objs {
		served = append(served, o)
	}
	for _, c := range clusters {
		served = append(served, Object(ClusterGVK, c[0], c[1], nil))
	}
	return Serve(capd, served...)
}

// ExampleGuard is a Guard with opts over the manifests under dir (the CAPD
// example) as its whole inventory, DockerMachines synced; it returns the
// inventory too, and the example's Nodes by name.
func ExampleGuard(t testing.TB, dir string, opts guard.Options) (*guard.Guard, *facts.Inventory, map[string]*unstructured.Unstructured) {
	t.Helper()
	objs, err := facts.LoadManifests(dir)
	require.NoError(t, err)
	nodes := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		if o.GetKind() == "Node" {
			nodes[o.GetName()] = o
		}
	}
	inv, err := facts.FromObjects(rule.MustEmbeddedModel(), objs, []schema.GroupKind{DockerMachineGVK.GroupKind()}, nil)
	require.NoError(t, err)
	if opts.Engine == nil {
		opts.Engine = Engine(t)
	}
	g, err := guard.New(context.Background(), inv, opts)
	require.NoError(t, err)
	return g, inv, nodes
}

// Engine is the embedded policy, compiled once per test binary: what a
// caller with no bundle passes to guard.New and guard.StartEnforcer.
func Engine(t testing.TB) *rule.Engine {
	t.Helper()
	e, err := embedded()
	require.NoError(t, err)
	return e
}

var embedded = sync.OnceValues(func() (*rule.Engine, error) { return rule.NewEngine(context.Background()) })
