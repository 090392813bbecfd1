//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/fleet"
	ngkube "github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/internal/constraints"
	"github.com/nodeguard/nodeguard/internal/testpki"
)

// staticAPIServer is a kube-apiserver 1.37 that loads the policies of
// constraints/admission-policy/static/ from its static manifests directory,
// as install.md has a KubeadmControlPlane place them.
func staticAPIServer(t *testing.T) *envtest.Environment {
	t.Helper()
	bin := apiServer137(t)
	_, env := apiServerWith(t, current, func(env *envtest.Environment) {
		api := env.ControlPlane.GetAPIServer()
		api.Path = bin
		dir := t.TempDir()
		manifests := filepath.Join(dir, "nodeguard")
		require.NoError(t, os.Mkdir(manifests, 0o755))
		src := filepath.Join("..", "..", "constraints", constraints.AdmissionPolicyStaticDir)
		files, err := os.ReadDir(src)
		require.NoError(t, err)
		for _, f := range files {
			b, err := os.ReadFile(filepath.Join(src, f.Name()))
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(manifests, f.Name()), b, 0o600))
		}
		config := filepath.Join(dir, "admission-config.yaml")
		require.NoError(t, os.WriteFile(config, []byte(`apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
  - name: ValidatingAdmissionPolicy
    configuration:
      apiVersion: apiserver.config.k8s.io/v1
      kind: ValidatingAdmissionPolicyConfiguration
      staticManifestsDir: `+manifests+`
`), 0o600))
		api.Configure().Set("admission-control-config-file", config)
	})
	return env
}

// apiServer137 is the path of kube-apiserver v1.37.2.
func apiServer137(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(*binDir, "kube-apiserver-1.37")
	_, err := os.Stat(bin)
	require.NoError(t, err, "tests/e2e/tools/build.sh builds kube-apiserver 1.37 beside 1.36")
	return bin
}

// On kube-apiserver 1.37 the static policies decide as the API-written ones
// do, and no cluster-admin can delete them through the API.
func TestStaticPoliciesOnKubernetes137(t *testing.T) {
	env := staticAPIServer(t)
	cfg := env.Config
	ctx := context.Background()
	kube, _ := clientsFor(t, cfg)
	info := mustInfo(t)
	static := info.Static()
	v, err := kube.Discovery().ServerVersion()
	require.NoError(t, err)
	require.Equal(t, "v1.37.2", v.GitVersion)

	running, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "running"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	gone, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gone"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	deniedBy := func(t require.TestingT, err error, policy, want string) {
		require.Error(t, err)
		assert.True(t, apierrors.IsForbidden(err), "%v", err)
		assert.Contains(t, err.Error(), "ValidatingAdmissionPolicy '"+policy+"'")
		assert.Contains(t, err.Error(), want)
	}
	deniedBy(t, dryRunDelete(ctx, kube, running.Name), static.Name, "nodeguard has not released it")

	nodeguard := impersonating(t, cfg, ngkube.Username, "system:serviceaccounts")
	require.NoError(t, writeVerdict(ctx, nodeguard, info, gone.Name, admission.Verdict(string(gone.UID), true, "")))
	assert.NoError(t, dryRunDelete(ctx, kube, gone.Name), "released by the verdict on it")

	kubelet := impersonating(t, cfg, "system:node:"+running.Name, "system:nodes")
	_, err = kubelet.CoreV1().Nodes().Patch(ctx, running.Name, types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"`+info.Released+`":"`+string(running.UID)+`"}}}`), metav1.PatchOptions{}, "status")
	deniedBy(t, err, static.Guard, "only nodeguard")

	// Not visible through the API, so not deletable through it.
	for _, name := range []string{static.Name, static.Guard} {
		err := kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{})
		assert.True(t, apierrors.IsNotFound(err), "delete binding %s: %v", name, err)
		err = kube.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{})
		assert.True(t, apierrors.IsNotFound(err), "delete policy %s: %v", name, err)
	}
	policies, err := constraints.AdmissionPolicyManifests(filepath.Join("..", "..", "constraints"), true)
	require.NoError(t, err)
	_, err = kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, policies.DeleteBinding, metav1.CreateOptions{})
	assert.True(t, apierrors.IsInvalid(err), "a static name is reserved: %v", err)
	time.Sleep(time.Second)
	deniedBy(t, dryRunDelete(ctx, kube, running.Name), static.Name, "nodeguard has not released it")
}

// The fleet on a workload API server whose policies are static: it finds
// them by a dry run, writes only the verdicts (no policy through the API),
// and proves the cluster guarded by the static delete policy.
func TestTheFleetWritesOnlyVerdictsWhereThePoliciesAreStatic(t *testing.T) {
	mgmt, mgmtEnv := apiServerEnv(t)
	mgmtKube, dyn := clientsFor(t, mgmt)
	clients, err := ngkube.FromConfig(mgmt)
	require.NoError(t, err)
	ctx := context.Background()
	info := mustInfo(t)
	serving := testpki.New(t)
	cert, key := serving.ServerFiles(t, "nodeguard")
	listen := "127.0.0.1:" + strconv.Itoa(freePort(t))
	startReplica(t, "a", adminKubeconfig(t, mgmtEnv), "--listen-address", listen, "--tls-cert-file", cert, "--tls-private-key-file", key,
		"--fleet", "--fleet-url", "https://"+listen, "--fleet-ca-file", serving.CAFile(t), "--fleet-namespace", "default", "--fleet-admission-policy")
	writeCluster(t, dyn, "edge", map[string]any{fleet.ModeAnnotation: fleet.ModeAdmissionPolicy})
	wEnv := staticAPIServer(t)
	workload, _ := clientsFor(t, wEnv.Config)
	_, err = workload.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "free"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	clusterMachine(t, dyn, workload, "edge", "edge-md-0")
	workloadAdmin(t, ctx, wEnv, mgmtKube, "default", "edge")

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		s := fleetStates(c, clients)["default/edge"]
		assert.True(c, s.Guarded, "%+v", s)
	}, 60*time.Second, 100*time.Millisecond, "proven by the static policy's denial")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		n, err := workload.CoreV1().Nodes().Get(ctx, "free", metav1.GetOptions{})
		require.NoError(c, err)
		assert.Equal(c, string(n.UID), n.Annotations[info.Released])
		assert.NoError(c, dryRunDelete(ctx, workload, "free"))
	}, 30*time.Second, 100*time.Millisecond, "the unlinked Node released by its verdict")
	err = dryRunDelete(ctx, workload, "edge-md-0")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ValidatingAdmissionPolicy '"+info.Static().Name+"'")
	list, err := workload.AdmissionregistrationV1().ValidatingAdmissionPolicies().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	assert.Empty(t, list.Items, "no policy written through the API")
}
