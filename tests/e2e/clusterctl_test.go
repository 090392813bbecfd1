//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	ngkube "github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/internal/addon"
	"github.com/nodeguard/nodeguard/internal/constraints"
	"github.com/nodeguard/nodeguard/internal/testcluster"
)

// clusterctl, the pinned release, renders nodeguard's add-on provider from a
// local repository laid out as a release publishes it: it reads and
// validates metadata.yaml (the version's release series and its contract),
// substitutes the variables, moves everything into --target-namespace, and
// the API server takes every object it rendered (server-side dry-run, with
// cert-manager's CRDs). Run inside TestChartPassesServerSideDryRun, which
// brings that API server up.
func testClusterctlRendersTheAddon(t *testing.T, kube kubernetes.Interface, clients ngkube.Clients, dyn dynamic.Interface) {
	components, err := addon.Components("../..")
	require.NoError(t, err)
	metadata, err := os.ReadFile("../../" + addon.MetadataFile)
	require.NoError(t, err)
	info, err := constraints.LoadInfo()
	require.NoError(t, err)
	version := "v" + info.Version

	// {basepath}/{provider label}/{version}/, clusterctl's local repository.
	repo := t.TempDir()
	release := filepath.Join(repo, addon.Label, version)
	require.NoError(t, os.MkdirAll(release, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(release, addon.ComponentsFile), components, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(release, addon.MetadataFile), metadata, 0o600))
	config := filepath.Join(repo, "clusterctl.yaml")
	require.NoError(t, os.WriteFile(config, []byte("providers:\n  - name: nodeguard\n    type: AddonProvider\n    url: file://"+
		filepath.Join(release, addon.ComponentsFile)+"\n"), 0o600))

	generate := func(env ...string) ([]byte, string, error) {
		cmd := exec.Command(filepath.Join(*binDir, "clusterctl"), "generate", "provider", "--addon", "nodeguard:"+version,
			"--config", config, "--target-namespace", "addon-nodeguard-system")
		// No network: no version check; HOME keeps the user's overrides out.
		cmd.Env = append([]string{"HOME=" + repo, "PATH=" + os.Getenv("PATH"), "CLUSTERCTL_DISABLE_VERSIONCHECK=true"}, env...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		return out, stderr.String(), err
	}

	_, stderr, err := generate()
	require.Error(t, err, "the fleet's host has no default")
	assert.Contains(t, stderr, "NODEGUARD_FLEET_HOST")

	out, stderr, err := generate("NODEGUARD_FLEET_HOST=nodeguard.fleet.example", "NODEGUARD_FLEET_DEFAULT_MODE=webhook")
	require.NoError(t, err, stderr)
	assert.Contains(t, string(out), "--fleet-default-mode=webhook", "a default overridden")
	out, stderr, err = generate("NODEGUARD_FLEET_HOST=nodeguard.fleet.example")
	require.NoError(t, err, "every other variable has a default: %s", stderr)
	assert.NotContains(t, string(out), "${", "every variable substituted")
	objs := testcluster.Objects(t, out)
	var rest []*unstructured.Unstructured
	for _, u := range objs {
		assert.Equal(t, addon.Label, u.GetLabels()["cluster.x-k8s.io/provider"], "%s %s", u.GetKind(), u.GetName())
		switch u.GetKind() {
		case "Namespace":
			assert.Equal(t, "addon-nodeguard-system", u.GetName())
			ns := &corev1.Namespace{}
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, ns))
			_, err := kube.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{})
			require.NoError(t, err, "the namespaced objects are validated in it")
			continue
		case "Deployment":
			containers, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
			args, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
			assert.Contains(t, args, "--fleet-url=https://nodeguard.fleet.example:443")
			assert.Contains(t, args, "--fleet-default-mode=admission-policy", "a default")
			assert.Contains(t, args, "--fleet-proof-interval=5m", "a default")
		case "Certificate":
			if u.GetName() == "nodeguard" {
				names, _, _ := unstructured.NestedStringSlice(u.Object, "spec", "dnsNames")
				assert.Equal(t, []string{"nodeguard.addon-nodeguard-system.svc", "nodeguard.addon-nodeguard-system.svc.cluster.local",
					"nodeguard.fleet.example"}, names, "clusterctl moves the in-cluster names to the target namespace")
			}
		}
		if ns := u.GetNamespace(); ns != "" {
			assert.Equal(t, "addon-nodeguard-system", ns, "%s %s", u.GetKind(), u.GetName())
		}
		if subjects, ok, _ := unstructured.NestedSlice(u.Object, "subjects"); ok {
			assert.Equal(t, "addon-nodeguard-system", subjects[0].(map[string]any)["namespace"], "%s %s binds the moved ServiceAccount", u.GetKind(), u.GetName())
		}
		rest = append(rest, u)
	}
	kinds := dryRunCreate(t, clients, dyn, rest)
	t.Logf("clusterctl rendered %d objects; validated by the API server: %v", len(objs), kinds)
	for _, k := range []string{"Deployment", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
		"Issuer", "Certificate", "PodDisruptionBudget", "NetworkPolicy"} {
		assert.Positive(t, kinds[k], "%s rendered and validated", k)
	}
	assert.False(t, strings.Contains(stderr, "Error"), stderr)
}
