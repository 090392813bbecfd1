package constraints_test

import (
	"context"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/nodeguard/nodeguard/internal/constraints"
	"github.com/nodeguard/nodeguard/policies"
)

const constraintsDir = "../../constraints"

func TestCommittedManifestsAreGenerated(t *testing.T) {
	files, err := constraints.Render(context.Background())
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"template.yaml", "constraint.yaml", "syncset.yaml", "config.yaml",
		"external-data/template.yaml", "external-data/constraint.yaml", "admission-policy/guard-policy.yaml", "admission-policy/guard-binding.yaml",
		"admission-policy/policy.yaml", "admission-policy/binding.yaml",
		"admission-policy/static/guard-policy.yaml", "admission-policy/static/guard-binding.yaml",
		"admission-policy/static/policy.yaml", "admission-policy/static/binding.yaml"}, slices.Collect(maps.Keys(files)))
	for name, want := range files {
		have, err := os.ReadFile(filepath.Join(constraintsDir, name))
		require.NoError(t, err)
		assert.Equal(t, string(want), string(have), "constraints/%s is stale: run `make generate`", name)
	}
}

func TestDefaultsComeFromTheRego(t *testing.T) {
	d, err := constraints.LoadDefaults(context.Background())
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
	lib, err := policies.Library()
	require.NoError(t, err)
	require.Len(t, libs, len(lib), "one lib per file of policies/lib")
	for _, l := range libs {
		assert.Contains(t, l, "package lib.nodeguard")
	}
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

// The external data template needs no sync config, asks the Provider the
// Rego names, and leaves the parameters nodeguard's answer sets out of the
// Constraint (the rule takes them from the answer).
func TestExternalDataTemplateAsksTheProviderAndSyncsNothing(t *testing.T) {
	dir := filepath.Join(constraintsDir, "external-data")
	resmap, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	require.NoError(t, err)
	var got []string
	for _, r := range resmap.Resources() {
		got = append(got, r.GetKind()+"/"+r.GetName())
	}
	assert.ElementsMatch(t, []string{"ConstraintTemplate/k8snodeguardexternal", "K8sNodeGuardExternal/node-deletion-guard"}, got)

	tmpl := readYAML(t, filepath.Join(dir, "template.yaml"))
	assert.NotContains(t, tmpl.GetAnnotations(), "metadata.gatekeeper.sh/requires-sync-data")
	assert.Regexp(t, `^\d+\.\d+\.\d+$`, tmpl.GetAnnotations()["metadata.gatekeeper.sh/version"])
	targets, _, _ := unstructured.NestedSlice(tmpl.Object, "spec", "targets")
	src := targets[0].(map[string]any)["code"].([]any)[0].(map[string]any)["source"].(map[string]any)
	assert.Contains(t, src["rego"], "package k8snodeguardexternal")
	assert.Contains(t, src["rego"], "external_data(")
	assert.Equal(t, "v1", src["version"])

	ctx := context.Background()
	c, err := policies.Compile()
	require.NoError(t, err)
	provided, err := policies.ProvidedParameters(ctx, c)
	require.NoError(t, err)
	require.NotEmpty(t, provided)
	props, _, _ := unstructured.NestedMap(tmpl.Object, "spec", "crd", "spec", "validation", "openAPIV3Schema", "properties")
	cons := readYAML(t, filepath.Join(dir, "constraint.yaml"))
	params, _, _ := unstructured.NestedMap(cons.Object, "spec", "parameters")
	declared, err := policies.DeclaredParameters(ctx, c)
	require.NoError(t, err)
	for name := range declared {
		if slices.Contains(provided, name) {
			assert.NotContains(t, props, name, "nodeguard's answer sets %s", name)
			assert.NotContains(t, params, name)
		} else {
			assert.Contains(t, props, name)
			assert.Contains(t, params, name)
		}
	}
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

// Gatekeeper builds the Constraint CRD from the template's schema and
// rejects one that is not structural; the API server's own check says so first.
func TestParameterSchemaIsStructuralAndDescribesEveryDeclaredParameter(t *testing.T) {
	ctx := context.Background()
	c, err := policies.Compile()
	require.NoError(t, err)
	declared, err := policies.DeclaredParameters(ctx, c)
	require.NoError(t, err)
	schema, err := constraints.ParameterSchema(declared)
	require.NoError(t, err)
	_, err = constraints.Structural(schema)
	require.NoError(t, err)
	require.Len(t, schema.Properties, len(declared))
	for name, p := range declared {
		prop, ok := schema.Properties[name]
		require.True(t, ok, name)
		assert.Equal(t, p.Description, prop.Description, name)
		assert.NotEmpty(t, prop.Type, name)
	}
}

func TestStructuralRejectsASchemaWithoutTypes(t *testing.T) {
	schema, err := constraints.ParameterSchema(map[string]policies.Parameter{
		"untyped": {Schema: map[string]any{"items": map[string]any{"type": "string"}}, Description: "no type"},
	})
	require.NoError(t, err)
	_, err = constraints.Structural(schema)
	assert.ErrorContains(t, err, "not structural")
}

// The Constraint spells out every declared parameter's default, pruned to
// the schema as the API server would store it.
func TestConstraintSpellsOutEveryDeclaredDefault(t *testing.T) {
	ctx := context.Background()
	c, err := policies.Compile()
	require.NoError(t, err)
	declared, err := policies.DeclaredParameters(ctx, c)
	require.NoError(t, err)
	cons := readYAML(t, filepath.Join(constraintsDir, "constraint.yaml"))
	params, found, err := unstructured.NestedMap(cons.Object, "spec", "parameters")
	require.NoError(t, err)
	require.True(t, found)
	require.Len(t, params, len(declared))
	for name := range declared {
		assert.Contains(t, params, name)
	}
	kinds := params["infraMachineKinds"].([]any)
	require.NotEmpty(t, kinds)
	assert.Equal(t, []string{"group", "kind"}, slices.Sorted(maps.Keys(kinds[0].(map[string]any))), "version is not a parameter field")
}

// kube-apiserver's static manifests loader (k8s.io/apiserver v0.37.2,
// admission/plugin/manifest) takes only names ending .static.k8s.io,
// bindings of policies in the same directory, and no params.
func TestStaticManifestsAreWhatTheLoaderTakes(t *testing.T) {
	p, err := constraints.AdmissionPolicyManifests(constraintsDir, true)
	require.NoError(t, err)
	policies := map[string]bool{}
	for _, pol := range []*admissionregistrationv1.ValidatingAdmissionPolicy{p.Delete, p.Guard} {
		assert.True(t, strings.HasSuffix(pol.Name, ".static.k8s.io"), pol.Name)
		assert.Nil(t, pol.Spec.ParamKind)
		policies[pol.Name] = true
	}
	for _, b := range []*admissionregistrationv1.ValidatingAdmissionPolicyBinding{p.DeleteBinding, p.GuardBinding} {
		assert.True(t, strings.HasSuffix(b.Name, ".static.k8s.io"), b.Name)
		assert.True(t, policies[b.Spec.PolicyName], "binding %s of a policy in the directory: %s", b.Name, b.Spec.PolicyName)
		assert.Nil(t, b.Spec.ParamRef)
	}
	api, err := constraints.AdmissionPolicyManifests(constraintsDir)
	require.NoError(t, err)
	assert.Equal(t, api.Delete.Spec, p.Delete.Spec, "the same policy, named otherwise")
	assert.Equal(t, api.Guard.Spec, p.Guard.Spec)
}
