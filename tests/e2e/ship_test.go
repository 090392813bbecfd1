//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	ngkube "github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/enforcer/serve"
	"github.com/nodeguard/nodeguard/internal/localcluster"
	"github.com/nodeguard/nodeguard/internal/testbundle"
	"github.com/nodeguard/nodeguard/internal/testcluster"
	"github.com/nodeguard/nodeguard/internal/testpki"
)

// The Helm chart, rendered by the pinned helm, is validated object by object
// by the real API server (server-side dry-run): schema, defaulting and
// admission, nothing stored: its defaults (cert-manager's Issuer and
// Certificate), an existing Secret with a Constraint, a policy bundle and the
// orphan reaper, and the monitoring values (ServiceMonitor, PrometheusRule,
// dashboard ConfigMap) against the Prometheus Operator's CRDs; and the
// clusterctl add-on provider's components as clusterctl renders them.
// The cert-manager release whose CRDs the chart's default rendering (a
// self-signed Issuer and a Certificate) is validated against.
const certManagerModule = "github.com/cert-manager/cert-manager@v1.16.1"

// The Prometheus Operator release whose CRDs (its example/prometheus-operator-crd)
// the chart's ServiceMonitor and PrometheusRule are validated against.
const prometheusOperatorModule = "github.com/prometheus-operator/prometheus-operator@v0.90.1"

func TestChartPassesServerSideDryRun(t *testing.T) {
	cfg, env := apiServerEnv(t)
	ctx := context.Background()
	kube, dyn := clientsFor(t, cfg)
	// cert-manager's CRD files are its Helm chart's templates: the templating
	// sits in comments, except label values, which installCRDs drops.
	installCRDs(t, env, certManagerModule, "deploy/crds/crd-issuers.yaml", "deploy/crds/crd-certificates.yaml")
	installCRDs(t, env, prometheusOperatorModule, "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml",
		"example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml")
	clients, err := ngkube.FromConfig(cfg)
	require.NoError(t, err)
	_, err = kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nodeguard-system",
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}}}, metav1.CreateOptions{})
	require.NoError(t, err)

	key := testbundle.NewKey(t)
	for name, tc := range map[string]struct {
		args  []string
		kinds []string
	}{
		"defaults: cert-manager": {
			kinds: []string{"Deployment", "Service", "PodDisruptionBudget", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
				"ValidatingWebhookConfiguration", "NetworkPolicy", "Issuer", "Certificate"},
		},
		"own Secret, Constraint, bundle, orphan reaper": {
			args: []string{"--set", "tls.certManager.enabled=false",
				"--set-file", "tls.caBundle=" + testpki.New(t).CAFile(t),
				"--set", "constraint.parameters.exemptGroups[0]=nodeguard:break-glass",
				"--set", "policyBundle.configMapName=nodeguard-bundle",
				"--set-file", "policyBundle.verificationKey=" + key.PublicKeyFile,
				"--set", "orphanReaper.enabled=true", "--set", "orphanReaper.workloadClusters=true",
				"--set", "externalData.enabled=true", "--set-file", "externalData.gatekeeperCA=" + testpki.New(t).CAFile(t)},
			kinds: []string{"Deployment", "Service", "PodDisruptionBudget", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
				"ValidatingWebhookConfiguration", "ConfigMap", "NetworkPolicy", "Role", "RoleBinding"},
		},
		"a fleet shard (fleet.watchFilter)": {
			args: []string{"--set", "fleet.enabled=true", "--set", "fleet.url=https://nodeguard-a.example.com", "--set", "fleet.allowUnauthenticatedReviews=true",
				"--set", "fleet.watchFilter=a", "--set", "webhook.enabled=false", "--set", "fleet.secretNamespaces={default}"},
			kinds: []string{"Deployment", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "CustomResourceDefinition", "Job"},
		},
		"monitoring, denial Events in workload clusters": {
			args: []string{"--set", "monitoring.serviceMonitor.enabled=true", "--set", "monitoring.prometheusRule.enabled=true",
				"--set", "monitoring.dashboard.enabled=true", "--set", "denialEvents.workloadClusters=true"},
			kinds: []string{"ServiceMonitor", "PrometheusRule", "ConfigMap", "Service", "ClusterRole", "Deployment"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command("go", append([]string{"tool", "-modfile=tools/helm/go.mod", "helm", "template", "nodeguard", "charts/nodeguard",
				"--namespace", "nodeguard-system"}, tc.args...)...)
			cmd.Dir = "../.."
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			rendered, err := cmd.Output()
			require.NoError(t, err, stderr.String())

			kinds := dryRunCreate(t, clients, dyn, testcluster.Objects(t, rendered))
			t.Logf("validated by the API server: %v", kinds)
			for _, k := range tc.kinds {
				assert.Positive(t, kinds[k], "%s rendered and validated", k)
			}
		})
	}
	t.Run("NOTES", func(t *testing.T) {
		cmd := exec.Command("go", "tool", "-modfile=tools/helm/go.mod", "helm", "install", "--dry-run=client", "nodeguard", "charts/nodeguard",
			"--namespace", "nodeguard-system", "--kubeconfig", adminKubeconfig(t, env), "--set", "enforcementAction=warn")
		cmd.Dir = "../.."
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		notes := string(out[bytes.Index(out, []byte("NOTES:")):])
		assert.Contains(t, notes, "kubectl -n nodeguard-system get pods")
		assert.Contains(t, notes, "enforcement action warn (they are admitted")
		t.Logf("%s", notes)
	})
	t.Run("clusterctl add-on", func(t *testing.T) { testClusterctlRendersTheAddon(t, kube, clients, dyn) })
	// Nothing was stored.
	_, err = kube.AppsV1().Deployments("nodeguard-system").Get(ctx, "nodeguard", metav1.GetOptions{})
	assert.True(t, err != nil, "dry-run stores nothing")
}

// installCRDs installs the CRDs in files (paths in module, a pinned Go
// module). Labels are dropped: cert-manager's templated files leave template
// expressions in their values.
func installCRDs(t *testing.T, env *envtest.Environment, module string, files ...string) {
	t.Helper()
	dir := moduleDir(t, module)
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(dir, f))
		require.NoError(t, err)
		crd := &apiextensionsv1.CustomResourceDefinition{}
		require.NoError(t, yaml.Unmarshal(data, crd), f)
		crd.Labels = nil
		crds = append(crds, crd)
	}
	_, err := envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{CRDs: crds})
	require.NoError(t, err)
}

// dryRunCreate has the API server validate each object as a create
// (server-side dry-run, strict field validation: schema, defaulting and
// admission, nothing stored) and counts them by kind.
func dryRunCreate(t *testing.T, clients ngkube.Clients, dyn dynamic.Interface, objs []*unstructured.Unstructured) map[string]int {
	t.Helper()
	ctx := context.Background()
	kinds := map[string]int{}
	for _, u := range objs {
		gvk := u.GroupVersionKind()
		m, err := clients.Mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		require.NoError(t, err, gvk.String())
		var r dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == "namespace" {
			r = dyn.Resource(m.Resource).Namespace(u.GetNamespace())
		}
		created, err := r.Create(ctx, u, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"})
		if apierrors.IsAlreadyExists(err) {
			// What the test's API server holds already (nodeguard's CRD,
			// installed with Cluster API's): validated as an apply.
			created, err = r.Apply(ctx, u.GetName(), u, metav1.ApplyOptions{DryRun: []string{metav1.DryRunAll}, FieldManager: "e2e", Force: true})
		}
		require.NoError(t, err, "%s %s", gvk.Kind, u.GetName())
		assert.NotEmpty(t, created.GetUID(), "the API server ran the create")
		kinds[gvk.Kind]++
	}
	return kinds
}

// `nodeguard serve --bundle` with nodeguard's own signed bundle decides like
// the embedded rule through the real API server; a customized bundle swapped
// in while it runs takes over.
func TestServeWithASignedBundle(t *testing.T) {
	cfg := apiServer(t)
	ctx := context.Background()
	kube, dyn := clientsFor(t, cfg)
	key := testbundle.NewKey(t)
	path := testbundle.WriteFile(t, t.TempDir(), "bundle.tar.gz", testbundle.Nodeguard(t, "e2e-1", key.Private))
	bundleServe(t, cfg, kube, rule.BundleOptions{Path: path, VerificationKeyFile: key.PublicKeyFile})

	name := "dev-md-0-x7k2p-abcde"
	capdMachine(t, dyn, name, false)
	deleteNode := func() error { return dryRunDelete(ctx, kube, name) }
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		err := deleteNode()
		require.Error(c, err)
		assert.Contains(c, err.Error(), "DockerMachine default/"+name)
	}, 30*time.Second, 200*time.Millisecond, "the bundle's rule denies the wrong order")

	custom := testbundle.Sources(t)
	custom["nodeguard/decision.rego"] = testbundle.AllowAll
	tmp := path + ".new"
	require.NoError(t, os.WriteFile(tmp, testbundle.Signed(t, custom, "e2e-2", key.Private), 0o600))
	require.NoError(t, os.Rename(tmp, path))
	require.Eventually(t, func() bool { return deleteNode() == nil }, 10*time.Second, 100*time.Millisecond,
		"the reloaded (allow-all) bundle decides")

	require.NoError(t, os.WriteFile(tmp, testbundle.Nodeguard(t, "e2e-3", key.Private), 0o600))
	require.NoError(t, os.Rename(tmp, path))
	require.Eventually(t, func() bool { return deleteNode() != nil }, 10*time.Second, 100*time.Millisecond,
		"nodeguard's rule again")

	require.NoError(t, dyn.Resource(dockerMachine).Namespace("default").Delete(ctx, name, metav1.DeleteOptions{}))
	require.NoError(t, deleteNode(), "the DockerMachine is gone: allowed")
}

// bundleServe runs `nodeguard serve --bundle` against cfg and points the API
// server's Node deletes at it.
func bundleServe(t *testing.T, cfg *rest.Config, kube kubernetes.Interface, bundle rule.BundleOptions) {
	t.Helper()
	clients, err := ngkube.FromConfig(cfg)
	require.NoError(t, err)
	ca := testpki.New(t)
	cert, keyFile := ca.ServerFiles(t, "nodeguard")
	url, stop, err := localcluster.Serve(context.Background(), clients,
		serve.Options{Listen: "127.0.0.1:0", CertFile: cert, KeyFile: keyFile, Bundle: bundle}, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	require.NoError(t, err)
	t.Cleanup(stop)
	caPEM, err := os.ReadFile(ca.CAFile(t))
	require.NoError(t, err)
	vwc, err := admission.BuildWebhookConfig(admission.WebhookConfigOptions{URL: url, CABundle: caPEM})
	require.NoError(t, err)
	require.NoError(t, admission.ApplyWebhookConfig(context.Background(), dynamic.NewForConfigOrDie(cfg), vwc))
}
