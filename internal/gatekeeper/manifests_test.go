package gatekeeper_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/nodeguard/nodeguard/internal/gatekeeper"
	"github.com/nodeguard/nodeguard/policies"
)

const constraintsDir = "../../constraints"

func TestCommittedManifestsAreGenerated(t *testing.T) {
	files, err := gatekeeper.Render(context.Background())
	require.NoError(t, err)
	require.Len(t, files, 4)
	for name, want := range files {
		have, err := os.ReadFile(filepath.Join(constraintsDir, name))
		require.NoError(t, err)
		assert.Equal(t, string(want), string(have), "constraints/%s is stale: run `make generate`", name)
	}
}

func TestDefaultsComeFromTheRego(t *testing.T) {
	d, err := gatekeeper.LoadDefaults(context.Background())
	require.NoError(t, err)
	kinds := map[string]bool{}
	for _, k := range d.InfraMachineKinds {
		require.NotEmpty(t, k.Version, "%s needs a version to sync", k.Kind)
		kinds[k.Group+"/"+k.Kind] = true
	}
	for _, want := range []string{
		"infrastructure.cluster.x-k8s.io/AWSMachine", "infrastructure.cluster.x-k8s.io/AzureMachine",
		"infrastructure.cluster.x-k8s.io/AzureMachinePoolMachine", "infrastructure.cluster.x-k8s.io/GCPMachine",
		"infrastructure.cluster.x-k8s.io/VSphereMachine", "vmware.infrastructure.cluster.x-k8s.io/VSphereMachine",
		"infrastructure.cluster.x-k8s.io/OpenStackMachine", "infrastructure.cluster.x-k8s.io/Metal3Machine",
		"infrastructure.cluster.x-k8s.io/IBMVPCMachine", "infrastructure.cluster.x-k8s.io/IBMPowerVSMachine",
		"infrastructure.cluster.x-k8s.io/HCloudMachine", "infrastructure.cluster.x-k8s.io/HetznerBareMetalMachine",
		"infrastructure.cluster.x-k8s.io/NutanixMachine", "infrastructure.cluster.x-k8s.io/KubevirtMachine",
		"infrastructure.cluster.x-k8s.io/DockerMachine", "infrastructure.cluster.x-k8s.io/DevMachine",
	} {
		assert.True(t, kinds[want], "default infraMachineKinds lacks %s", want)
	}
	pools := map[string]bool{}
	for _, k := range d.InfraMachinePoolKinds {
		pools[k.Kind] = true
	}
	assert.True(t, pools["DockerMachinePool"])
	assert.True(t, pools["AWSMachinePool"])
}

func TestTemplateMetadata(t *testing.T) {
	tmpl := readYAML(t, filepath.Join(constraintsDir, "template.yaml"))
	ann := tmpl.GetAnnotations()
	assert.Equal(t, "Node deletion guard", ann["metadata.gatekeeper.sh/title"])
	assert.Regexp(t, `^\d+\.\d+\.\d+$`, ann["metadata.gatekeeper.sh/version"])
	assert.NotEmpty(t, ann["description"])
	targets, _, _ := unstructured.NestedSlice(tmpl.Object, "spec", "targets")
	require.Len(t, targets, 1)
	tgt := targets[0].(map[string]any)
	assert.Equal(t, []any{"DELETE"}, tgt["operations"])
	code := tgt["code"].([]any)[0].(map[string]any)
	assert.Equal(t, "Rego", code["engine"])
	src := code["source"].(map[string]any)
	assert.Equal(t, "v1", src["version"])
	assert.Contains(t, src["rego"], "package k8snodeguard")
	libs := src["libs"].([]any)
	library, err := policies.Library()
	require.NoError(t, err)
	require.Len(t, libs, len(library), "one lib per library file")
	for _, lib := range libs {
		assert.Contains(t, lib, "package lib.nodeguard")
	}
}

// The generated template runs in Gatekeeper's own engine and judges a DELETE.
func TestTemplateRunsInGatekeepersEngine(t *testing.T) {
	ctx := context.Background()
	engine := newEngine(t, "constraint.yaml")
	node := nodeFrom(t, filepath.Join(constraintsDir, "tests/review-capd.yaml"))
	user := authenticationv1.UserInfo{Username: "kubernetes-admin", Groups: []string{"system:masters"}}

	violations, err := engine.ReviewDelete(ctx, node, user)
	require.NoError(t, err)
	assert.Empty(t, violations, "nothing synced, nothing linked")

	for _, obj := range readAll(t, filepath.Join(constraintsDir, "tests/capd-objects.yaml")) {
		require.NoError(t, engine.AddObject(ctx, obj))
	}
	violations, err = engine.ReviewDelete(ctx, node, user)
	require.NoError(t, err)
	require.Len(t, violations, 1)
	assert.Contains(t, violations[0].Msg, "DockerMachine default/dev-md-0-abcde")
	blocker := violations[0].Details["blocker"].(map[string]any)
	assert.Equal(t, "DockerMachine", blocker["kind"])
	assert.Equal(t, false, blocker["deleting"])
}

func TestKustomizationInstallsTemplateConstraintAndSync(t *testing.T) {
	resmap, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), constraintsDir)
	require.NoError(t, err)
	var got []string
	for _, r := range resmap.Resources() {
		got = append(got, r.GetKind()+"/"+r.GetName())
	}
	assert.ElementsMatch(t, []string{"ConstraintTemplate/k8snodeguard", "SyncSet/nodeguard", "K8sNodeGuard/node-deletion-guard"}, got)
}

// The webhook component, applied to Gatekeeper's own install manifest, adds
// DELETE and fails closed on the validating webhook, and leaves the rest alone.
func TestWebhookComponentEnablesDelete(t *testing.T) {
	gk := moduleDir(t, "github.com/open-policy-agent/gatekeeper/v3")
	dir := t.TempDir()
	manifest, err := os.ReadFile(filepath.Join(gk, "deploy/gatekeeper.yaml"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "gatekeeper.yaml"), manifest, 0o644))
	component, err := os.ReadFile(filepath.Join(constraintsDir, "webhook/kustomization.yaml"))
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "webhook"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "webhook/kustomization.yaml"), component, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kustomization.yaml"),
		[]byte("resources: [gatekeeper.yaml]\ncomponents: [webhook]\n"), 0o644))

	resmap, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	require.NoError(t, err)
	var webhooks []any
	for _, r := range resmap.Resources() {
		if r.GetKind() == "ValidatingWebhookConfiguration" && r.GetName() == "gatekeeper-validating-webhook-configuration" {
			m, err := r.Map()
			require.NoError(t, err)
			webhooks = m["webhooks"].([]any)
		}
	}
	require.Len(t, webhooks, 2)
	validation := webhooks[0].(map[string]any)
	assert.Equal(t, "validation.gatekeeper.sh", validation["name"])
	assert.Equal(t, "Fail", validation["failurePolicy"])
	ops := validation["rules"].([]any)[0].(map[string]any)["operations"]
	assert.Equal(t, []any{"CREATE", "UPDATE", "DELETE"}, ops)
	label := webhooks[1].(map[string]any)
	assert.Equal(t, []any{"CREATE", "UPDATE"}, label["rules"].([]any)[0].(map[string]any)["operations"])
}

// The Helm values name keys the pinned chart really has.
func TestHelmValuesExistInTheChart(t *testing.T) {
	chart, err := os.ReadFile(filepath.Join(moduleDir(t, "github.com/open-policy-agent/gatekeeper/v3"), "charts/gatekeeper/values.yaml"))
	require.NoError(t, err)
	var chartValues map[string]any
	require.NoError(t, yaml.Unmarshal(chart, &chartValues))
	ours, err := os.ReadFile(filepath.Join(constraintsDir, "helm-values.yaml"))
	require.NoError(t, err)
	var values map[string]any
	require.NoError(t, yaml.Unmarshal(ours, &values))
	require.Equal(t, map[string]any{"enableDeleteOperations": true, "validatingWebhookFailurePolicy": "Fail"}, values)
	for key := range values {
		assert.Contains(t, chartValues, key)
	}
}

func newEngine(t *testing.T, constraint string) *gatekeeper.Engine {
	t.Helper()
	tmpl, err := os.ReadFile(filepath.Join(constraintsDir, "template.yaml"))
	require.NoError(t, err)
	cons, err := os.ReadFile(filepath.Join(constraintsDir, constraint))
	require.NoError(t, err)
	engine, err := gatekeeper.NewEngine(context.Background(), tmpl, cons)
	require.NoError(t, err)
	return engine
}

func moduleDir(t *testing.T, module string) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", module).Output()
	require.NoError(t, err, "locate module %s", module)
	return strings.TrimSpace(string(out))
}

func readYAML(t *testing.T, path string) *unstructured.Unstructured {
	t.Helper()
	objs := readAll(t, path)
	require.Len(t, objs, 1)
	return objs[0]
}

func readAll(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var out []*unstructured.Unstructured
	for _, doc := range strings.Split(string(b), "\n---\n") {
		u := &unstructured.Unstructured{}
		require.NoError(t, yaml.Unmarshal([]byte(doc), &u.Object))
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
	return out
}

func nodeFrom(t *testing.T, reviewPath string) *unstructured.Unstructured {
	t.Helper()
	review := readYAML(t, reviewPath)
	old, found, err := unstructured.NestedMap(review.Object, "request", "oldObject")
	require.NoError(t, err)
	require.True(t, found)
	return &unstructured.Unstructured{Object: old}
}
