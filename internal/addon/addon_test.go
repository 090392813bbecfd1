package addon_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/nodeguard/nodeguard/internal/addon"
	"github.com/nodeguard/nodeguard/internal/policydoc"
	"github.com/nodeguard/nodeguard/internal/testcluster"
)

const root = "../.."

// substitute does what clusterctl does with ${NAME} and ${NAME:=default}
// (tests/e2e runs the real clusterctl on the same file).
func substitute(t *testing.T, in []byte, values map[string]string) []byte {
	t.Helper()
	re := regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(:=([^}]*))?\}`)
	return re.ReplaceAllFunc(in, func(m []byte) []byte {
		sub := re.FindSubmatch(m)
		if v, ok := values[string(sub[1])]; ok {
			return []byte(v)
		}
		require.NotEmpty(t, sub[2], "variable %s has no value and no default", sub[1])
		return sub[3]
	})
}

func objects(t *testing.T, stream []byte) map[string]*unstructured.Unstructured {
	t.Helper()
	out := map[string]*unstructured.Unstructured{}
	for _, u := range testcluster.Objects(t, stream) {
		out[u.GetKind()+" "+u.GetNamespace()+"/"+u.GetName()] = u
	}
	return out
}

// kustomizeWith renders enforcer/deploy with the components named, as an
// operator using kustomize would.
func kustomizeWith(t *testing.T, components ...string) map[string]*unstructured.Unstructured {
	t.Helper()
	dir := t.TempDir()
	abs, err := filepath.Abs(filepath.Join(root, "enforcer/deploy"))
	require.NoError(t, err)
	abs, err = filepath.Rel(dir, abs) // kustomize takes no absolute roots
	require.NoError(t, err)
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: nodeguard-system\nresources: [" + abs + "]\ncomponents: ["
	for i, c := range components {
		if i > 0 {
			k += ", "
		}
		k += abs + "/components/" + c
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k+"]\n"), 0o600))
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	require.NoError(t, err)
	out, err := m.AsYaml()
	require.NoError(t, err)
	return objects(t, out)
}

// The add-on's components are the kustomize deployment with its cert-manager
// and fleet components (which the chart is checked against in charts/), the
// provider label on every object, and the operator's values where the fleet
// component has placeholders.
func TestComponentsAreTheKustomizeDeployment(t *testing.T) {
	raw, err := addon.Components(root)
	require.NoError(t, err)
	got := objects(t, substitute(t, raw, map[string]string{"NODEGUARD_FLEET_HOST": "nodeguard.fleet.example"}))
	want := kustomizeWith(t, "cert-manager", "fleet")
	require.ElementsMatch(t, keys(want), keys(got))
	for key, w := range want {
		g := got[key]
		assert.Equal(t, addon.Label, g.GetLabels()["cluster.x-k8s.io/provider"], key)
		labels := g.GetLabels()
		delete(labels, "cluster.x-k8s.io/provider")
		if len(labels) == 0 {
			labels = nil
		}
		g.SetLabels(labels)
		switch key {
		case "Deployment nodeguard-system/nodeguard":
			wantArgs := args(t, w)
			for i, a := range wantArgs {
				if strings.HasPrefix(a, "--fleet-url=") {
					wantArgs[i] = "--fleet-url=https://nodeguard.fleet.example:443"
				}
			}
			wantArgs = append(wantArgs, "--fleet-admission-policy=true", "--fleet-default-mode=admission-policy")
			assert.Equal(t, wantArgs, args(t, g))
			setArgs(t, g, args(t, w))
		case "Certificate nodeguard-system/nodeguard":
			names, _, _ := unstructured.NestedStringSlice(w.Object, "spec", "dnsNames")
			gotNames, _, _ := unstructured.NestedStringSlice(g.Object, "spec", "dnsNames")
			assert.Equal(t, append(names, "nodeguard.fleet.example"), gotNames)
			require.NoError(t, unstructured.SetNestedStringSlice(g.Object, names, "spec", "dnsNames"))
		}
		assert.Equal(t, w.Object, g.Object, key)
	}
}

func keys(m map[string]*unstructured.Unstructured) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func args(t *testing.T, d *unstructured.Unstructured) []string {
	t.Helper()
	containers, _, err := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	require.NoError(t, err)
	a, _, err := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
	require.NoError(t, err)
	return a
}

func setArgs(t *testing.T, d *unstructured.Unstructured, a []string) {
	t.Helper()
	containers, _, err := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	require.NoError(t, err)
	require.NoError(t, unstructured.SetNestedStringSlice(containers[0].(map[string]any), a, "args"))
	require.NoError(t, unstructured.SetNestedSlice(d.Object, containers, "spec", "template", "spec", "containers"))
}

func TestTheFleetHostIsTheOnlyRequiredVariable(t *testing.T) {
	raw, err := addon.Components(root)
	require.NoError(t, err)
	var required []string
	for _, v := range addon.Variables(raw) {
		if !v.HasDefault {
			required = append(required, v.Name)
		}
	}
	assert.Equal(t, []string{"NODEGUARD_FLEET_HOST"}, required)
}

// Every variable is documented where operators read how to set it.
func TestTheVariablesAreDocumented(t *testing.T) {
	raw, err := addon.Components(root)
	require.NoError(t, err)
	doc, err := os.ReadFile(filepath.Join(root, "docs/install.md"))
	require.NoError(t, err)
	vars := addon.Variables(raw)
	require.NotEmpty(t, vars)
	for _, v := range vars {
		assert.True(t, strings.Contains(string(doc), "`"+v.Name+"`"), "docs/install.md names %s", v.Name)
	}
}

func TestMetadataHasASeriesPerMinor(t *testing.T) {
	md, err := addon.Metadata(policydoc.Ledger{{Version: "0.1.0"}, {Version: "0.1.5"}, {Version: "1.0.0"}, {Version: "1.1.0"}, {Version: "1.1.2"}})
	require.NoError(t, err)
	assert.Contains(t, string(md), "apiVersion: clusterctl.cluster.x-k8s.io/v1alpha3\nkind: Metadata\nreleaseSeries:\n"+
		"- contract: v1beta2\n  major: 1\n  minor: 1\n"+
		"- contract: v1beta2\n  major: 1\n  minor: 0\n"+
		"- contract: v1beta2\n  major: 0\n  minor: 1\n")
	_, err = addon.Metadata(policydoc.Ledger{{Version: "1.1"}})
	assert.ErrorContains(t, err, `version "1.1" of the ledger`)
}
