package facts_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/internal/testcluster"
)

// providerCRD is a provider CRD as its kustomization installs it: the
// contract label, one served version whose spec has fields, established.
func providerCRD(plural, group, kind, version string, labels map[string]string, specFields ...string) *unstructured.Unstructured {
	props := map[string]any{}
	for _, f := range specFields {
		props[f] = map[string]any{"type": "string"}
	}
	u := crd(plural+"."+group, labels)
	u.Object["spec"] = map[string]any{"group": group, "names": map[string]any{"kind": kind, "plural": plural},
		"versions": []any{map[string]any{"name": version, "served": true, "storage": true,
			"schema": map[string]any{"openAPIV3Schema": map[string]any{"properties": map[string]any{"spec": map[string]any{"properties": props}}}}}}}
	u.Object["status"] = map[string]any{"conditions": []any{map[string]any{"type": "Established", "status": "True"}}}
	return u
}

// A contract-labelled kind no parameter lists and no Machine references is
// watched once its CRD appears (a watch, no poll), and dropped with its CRD.
func TestKindsAreFoundByTheContract(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client, mapper := setup(t, dockerM1()...)
	inv := facts.NewInventory(rule.MustEmbeddedModel())
	s := facts.NewSyncer(inv, facts.SyncerOptions{Client: client, Mapper: mapper, RetryInterval: time.Hour, Contract: true})
	require.NoError(t, s.Start(ctx))
	require.Eventually(t, func() bool { return s.Ready() == nil }, 5*time.Second, 10*time.Millisecond)

	crds := client.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	foo := providerCRD("foomachines", fooGVK.Group, fooGVK.Kind, "v1beta1", map[string]string{"cluster.x-k8s.io/v1beta1": "v1alpha1_v1beta1"}, "providerID")
	_, err := crds.Create(ctx, foo, metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		infra, _ := s.SyncedKinds()
		return len(infra) == 2 && s.Ready() == nil
	}, 5*time.Second, 10*time.Millisecond)
	infra, _ := s.SyncedKinds()
	assert.Equal(t, []schema.GroupVersionKind{testcluster.DockerMachineGVK, fooGVK}, infra, "at the contract's highest version")
	var sources []string
	for _, w := range s.Watched() {
		if w.GVK == fooGVK {
			sources = w.Sources
			assert.True(t, w.Synced)
			assert.Equal(t, facts.InfraMachine, w.Role)
		}
	}
	assert.Equal(t, []string{facts.SourceContract}, sources)

	require.NoError(t, crds.Delete(ctx, foo.GetName(), metav1.DeleteOptions{}))
	require.Eventually(t, func() bool {
		infra, _ := s.SyncedKinds()
		return len(infra) == 1
	}, 5*time.Second, 10*time.Millisecond, "a CRD gone takes its kind with it")
	assert.NotContains(t, inv.Kinds(facts.InfraMachine), fooGVK)
}

func TestContractKindOf(t *testing.T) {
	contract := map[string]string{"cluster.x-k8s.io/v1beta1": "v1beta1_v1beta2"}
	for name, tc := range map[string]struct {
		crd  *unstructured.Unstructured
		role facts.Role
		ok   bool
	}{
		"InfraMachine": {providerCRD("awsmachines", "infrastructure.cluster.x-k8s.io", "AWSMachine", "v1beta2", contract, "providerID", "instanceType"), facts.InfraMachine, true},
		// AWSMachinePool, AzureMachinePool, DockerMachinePool have both.
		"self-managed pool": {providerCRD("awsmachinepools", "infrastructure.cluster.x-k8s.io", "AWSMachinePool", "v1beta2", contract, "providerID", "providerIDList"), facts.InfraMachinePool, true},
		"managed pool":      {providerCRD("awsmanagedmachinepools", "infrastructure.cluster.x-k8s.io", "AWSManagedMachinePool", "v1beta2", contract, "providerIDList"), facts.InfraMachinePool, true},
		"template":          {providerCRD("awsmachinetemplates", "infrastructure.cluster.x-k8s.io", "AWSMachineTemplate", "v1beta2", contract, "template"), "", false},
		"no contract label": {providerCRD("foomachines", "example.com", "FooMachine", "v1", nil, "providerID"), "", false},
		// The label names v1beta2; the CRD serves only v1beta1.
		"contract version not served": {providerCRD("barmachines", "example.com", "BarMachine", "v1beta1", contract, "providerID"), "", false},
	} {
		t.Run(name, func(t *testing.T) {
			k, ok := facts.ContractKindOf(tc.crd)
			require.Equal(t, tc.ok, ok)
			if ok {
				assert.Equal(t, tc.role, k.Role)
				assert.Equal(t, "v1beta2", k.GVK.Version)
				assert.Equal(t, tc.crd.Object["spec"].(map[string]any)["names"].(map[string]any)["plural"], k.Resource.Resource)
			}
		})
	}
	v, ok := facts.ContractVersion(map[string]string{"cluster.x-k8s.io/v1beta1": "v1beta1", "cluster.x-k8s.io/v1beta2": "v1alpha4_v1beta2_v1beta1"})
	assert.True(t, ok)
	assert.Equal(t, "v1beta2", v, "the newest contract's label, its highest version")
}
