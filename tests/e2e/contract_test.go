//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/nodeguard/nodeguard/enforcer/serve"
)

// providerCRDs renders a provider's CRDs as a cluster really has them: its
// config/crd kustomization adds the contract labels the bases lack. The
// conversion webhook it names does not run here, so it is dropped (every
// object below is written at the storage version).
func providerCRDs(t *testing.T, module, dir string) []*apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	out, err := exec.Command(filepath.Join(*binDir, "kubectl"), "kustomize", filepath.Join(moduleDir(t, module), dir)).Output()
	require.NoError(t, err, "kubectl kustomize %s %s", module, dir)
	var crds []*apiextensionsv1.CustomResourceDefinition
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(out)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		crd := &apiextensionsv1.CustomResourceDefinition{}
		require.NoError(t, yaml.Unmarshal(doc, crd))
		if crd.Kind != "CustomResourceDefinition" {
			continue
		}
		crd.Spec.Conversion = nil
		crds = append(crds, crd)
	}
	require.NotEmpty(t, crds)
	return crds
}

// watchedKinds scrapes nodeguard_watched_kinds: "role kind source" for each
// synced series.
func watchedKinds(t require.TestingT, metrics string) map[string]bool {
	resp, err := http.Get("http://" + metrics + "/metrics")
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	out := map[string]bool{}
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "nodeguard_watched_kinds{") || !strings.HasSuffix(line, " 1") {
			continue
		}
		labels := map[string]string{}
		for _, kv := range strings.Split(strings.TrimSuffix(strings.TrimPrefix(line, "nodeguard_watched_kinds{"), "} 1"), ",") {
			k, v, _ := strings.Cut(kv, "=")
			labels[k] = strings.Trim(v, `"`)
		}
		out[labels["role"]+" "+labels["kind"]+" "+labels["source"]] = true
	}
	return out
}

// CAPA's, CAPG's and CAPZ's real CRDs, installed after nodeguard started, with no
// kind in the parameters: every InfraMachine and pool kind they define is
// watched by the contract alone, an EKS managed pool (MachinePool +
// AWSManagedMachinePool, no Machine) blocks its Node while either lists it,
// and an orphaned GCPMachine carrying the Node's providerID blocks it too.
func TestProviderKindsAreFoundByTheContract(t *testing.T) {
	cfg, env := apiServerEnv(t)
	constraint := filepath.Join(t.TempDir(), "constraint.yaml")
	require.NoError(t, os.WriteFile(constraint, []byte(`apiVersion: constraints.gatekeeper.sh/v1beta1
kind: K8sNodeGuard
metadata: {name: nodeguard}
spec:
  parameters: {infraMachineKinds: [], infraMachinePoolKinds: []}
`), 0o600))
	side := make(chan net.Addr, 2)
	nodeguardWith(t, cfg, serve.Options{Constraint: constraint, MetricsBindAddress: "127.0.0.1:0",
		SideListening: func(name string, a net.Addr) {
			if name == "metrics" {
				side <- a
			}
		}})
	metrics := (<-side).String()
	ctx := context.Background()
	kube, dyn := clientsFor(t, cfg)

	crds := append(providerCRDs(t, "sigs.k8s.io/cluster-api-provider-aws/v2@v2.13.0", "config/crd"),
		providerCRDs(t, "sigs.k8s.io/cluster-api-provider-gcp@v1.13.1", "config/crd")...)
	crds = append(crds, providerCRDs(t, "sigs.k8s.io/cluster-api-provider-azure@v1.21.0", "config/crd")...)
	want := []string{
		"InfraMachine AWSMachine contract", "InfraMachinePool AWSMachinePool contract",
		"InfraMachinePool AWSManagedMachinePool contract", "InfraMachinePool ROSAMachinePool contract",
		"InfraMachine GCPMachine contract", "InfraMachinePool GCPMachinePool contract",
		"InfraMachinePool GCPManagedMachinePool contract",
		"InfraMachine AzureMachine contract", "InfraMachine AzureMachinePoolMachine contract",
		"InfraMachinePool AzureMachinePool contract", "InfraMachinePool AzureManagedMachinePool contract",
		"InfraMachinePool AzureASOManagedMachinePool contract",
		"MachinePool MachinePool referrer", "Machine Machine referrer",
	}
	installed := time.Now()
	_, err := envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{CRDs: crds})
	require.NoError(t, err)
	established := time.Since(installed)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		got := watchedKinds(c, metrics)
		for _, w := range want {
			assert.True(c, got[w], "watched and synced: %s", w)
		}
	}, 30*time.Second, 50*time.Millisecond)
	t.Logf("%d CRDs of CAPA, CAPG and CAPZ established in %s; every InfraMachine and pool kind watched and synced %s after the install began",
		len(crds), established.Round(time.Millisecond), time.Since(installed).Round(time.Millisecond))
	got := watchedKinds(t, metrics)
	for k := range got {
		assert.NotContains(t, k, "Template", "a ...Template kind nests providerID under spec.template: no InfraMachine")
	}

	pid := "aws:///us-west-2a/i-0a1b2c3d4e5f60001"
	name := "ip-10-0-1-17.us-west-2.compute.internal"
	apply(t, dyn, nodes, map[string]any{"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": name, "annotations": map[string]any{
			"cluster.x-k8s.io/cluster-name": "prod", "cluster.x-k8s.io/cluster-namespace": "default",
			"cluster.x-k8s.io/owner-kind": "MachinePool", "cluster.x-k8s.io/owner-name": "prod-mp-0"}},
		"spec": map[string]any{"providerID": pid}})
	listed := []any{"aws:///us-west-2a/i-0a1b2c3d4e5f60000", pid}
	machinePools := current.GVR("cluster.x-k8s.io", "machinepools")
	apply(t, dyn, machinePools, map[string]any{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachinePool",
		"metadata": map[string]any{"namespace": "default", "name": "prod-mp-0", "labels": map[string]any{"cluster.x-k8s.io/cluster-name": "prod"}},
		"spec": map[string]any{"clusterName": "prod", "providerIDList": listed, "template": map[string]any{"spec": map[string]any{
			"clusterName": "prod", "bootstrap": map[string]any{"dataSecretName": ""},
			"infrastructureRef": map[string]any{"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "AWSManagedMachinePool", "name": "prod-mp-0"}}}}})
	managed := schema.GroupVersionResource{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Resource: "awsmanagedmachinepools"}
	apply(t, dyn, managed, map[string]any{"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "AWSManagedMachinePool",
		"metadata": map[string]any{"namespace": "default", "name": "prod-mp-0", "labels": map[string]any{"cluster.x-k8s.io/cluster-name": "prod"}},
		"spec":     map[string]any{"providerIDList": listed}})

	deny := func(what string, contains string) {
		t.Helper()
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			err := dryRunDelete(ctx, kube, name)
			require.Error(c, err, what)
			assert.Contains(c, err.Error(), contains)
		}, 15*time.Second, 100*time.Millisecond, what)
	}
	unlist := func(gvr schema.GroupVersionResource, objName string) {
		t.Helper()
		obj, err := dyn.Resource(gvr).Namespace("default").Get(ctx, objName, metav1.GetOptions{})
		require.NoError(t, err)
		obj.Object["spec"].(map[string]any)["providerIDList"] = listed[:1]
		_, err = dyn.Resource(gvr).Namespace("default").Update(ctx, obj, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
	deny("both list the Node", "AWSManagedMachinePool default/prod-mp-0 (infrastructure.cluster.x-k8s.io) still exists, linked by MachinePool default/prod-mp-0 (spec.providerIDList) and its spec.providerIDList")
	unlist(managed, "prod-mp-0")
	deny("the MachinePool still lists it", "linked by MachinePool default/prod-mp-0 (spec.providerIDList);")
	unlist(machinePools, "prod-mp-0")
	require.NoError(t, dryRunDelete(ctx, kube, name), "listed by neither: allowed at once (fresh reads)")

	// A GCPMachine whose Machine is gone, of a kind no parameter lists.
	gcp := schema.GroupVersionResource{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta1", Resource: "gcpmachines"}
	apply(t, dyn, gcp, map[string]any{"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "GCPMachine",
		"metadata": map[string]any{"namespace": "default", "name": "leftover"},
		"spec":     map[string]any{"instanceType": "n2-standard-2", "providerID": pid}})
	deny("an orphaned GCPMachine carries the providerID", "GCPMachine default/leftover (infrastructure.cluster.x-k8s.io) still exists, linked by its own spec.providerID")
}
