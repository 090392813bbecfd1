//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/nodeguard/nodeguard/internal/testpki"
)

// The Gatekeeper the e2e tools build (tests/e2e/tools/gatekeeper/go.mod).
const gatekeeperModule = "github.com/open-policy-agent/gatekeeper/v3@v3.23.1"

var constraintGVR = schema.GroupVersionResource{Group: "constraints.gatekeeper.sh", Version: "v1beta1", Resource: "k8snodeguard"} // Gatekeeper names the plural after the kind, lowercased

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// gatekeeper runs Gatekeeper's manager out of cluster against the API server
// of env, as FIELD-NOTES.md describes, with Gatekeeper's own validating
// webhook configuration patched by constraints/webhook (DELETE, fail closed)
// and pointed at it. Its log is printed if the test fails.
func gatekeeper(t *testing.T, env *envtest.Environment, kube kubernetes.Interface) {
	t.Helper()
	gk := moduleDir(t, gatekeeperModule)
	ctx := context.Background()
	_, err := envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{Paths: []string{filepath.Join(gk, "charts/gatekeeper/crds")}})
	require.NoError(t, err)
	_, err = kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "gatekeeper-system"}}, metav1.CreateOptions{})
	require.NoError(t, err)

	ca := testpki.New(t)
	cert, _ := ca.ServerFiles(t, "tls") // tls.crt and tls.key, the names Gatekeeper reads
	port := freePort(t)
	cmd := exec.Command(filepath.Join(*binDir, "gatekeeper"),
		"--kubeconfig", adminKubeconfig(t, env),
		"--debug-use-fake-pod", "--disable-cert-rotation", "--cert-dir", filepath.Dir(cert),
		"--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--health-addr", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--metrics-addr", "0",
		"--operation=webhook", "--operation=audit", "--operation=status", "--operation=generate",
		"--audit-interval=2", "--api-cache-dir", t.TempDir(), "--shutdown-delay=0", "--log-level=INFO")
	cmd.Env = append(os.Environ(), "POD_NAMESPACE=gatekeeper-system")
	keepLog(t, "gatekeeper", &cmd.Stdout, &cmd.Stderr) // registered first, so it runs after the stop below
	start := time.Now()
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})

	caPEM, err := os.ReadFile(ca.CAFile(t))
	require.NoError(t, err)
	vwc := gatekeeperWebhookConfig(t, gk)
	for i := range vwc.Webhooks {
		path := *vwc.Webhooks[i].ClientConfig.Service.Path
		url := fmt.Sprintf("https://127.0.0.1:%d%s", port, path)
		vwc.Webhooks[i].ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caPEM}
	}
	_, err = kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, vwc, metav1.CreateOptions{})
	require.NoError(t, err)

	// `kubectl apply -k constraints/`, again until the Constraint's kind
	// exists, as the kustomization's comment tells a user.
	var out string
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		out, err = kubectl(t, env, "apply", "-k", "../../constraints")
		assert.NoError(c, err, out)
	}, 90*time.Second, time.Second, "kubectl apply -k constraints/")
	t.Logf("Gatekeeper started; constraints applied %s later:\n%s", time.Since(start).Round(time.Millisecond), out)
}

// gatekeeperWebhookConfig is the ValidatingWebhookConfiguration of
// Gatekeeper's deploy/gatekeeper.yaml with constraints/webhook applied.
func gatekeeperWebhookConfig(t *testing.T, gk string) *admissionregistrationv1.ValidatingWebhookConfiguration {
	t.Helper()
	all, err := os.ReadFile(filepath.Join(gk, "deploy/gatekeeper.yaml"))
	require.NoError(t, err)
	var vwc string
	for _, doc := range strings.Split(string(all), "\n---\n") {
		if strings.Contains(doc, "\nkind: ValidatingWebhookConfiguration\n") {
			vwc = doc
		}
	}
	require.NotEmpty(t, vwc, "deploy/gatekeeper.yaml has no ValidatingWebhookConfiguration")
	component, err := os.ReadFile("../../constraints/webhook/kustomization.yaml")
	require.NoError(t, err)
	fs := filesys.MakeFsInMemory()
	require.NoError(t, fs.WriteFile("/app/vwc.yaml", []byte(vwc)))
	require.NoError(t, fs.WriteFile("/app/webhook/kustomization.yaml", component))
	require.NoError(t, fs.WriteFile("/app/kustomization.yaml", []byte("resources: [vwc.yaml]\ncomponents: [webhook]\n")))
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fs, "/app")
	require.NoError(t, err)
	require.Len(t, m.Resources(), 1)
	raw, err := m.Resources()[0].AsYAML()
	require.NoError(t, err)
	out := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	require.NoError(t, yaml.UnmarshalStrict(raw, out))
	require.Contains(t, out.Webhooks[0].Rules[0].Operations, admissionregistrationv1.Delete)
	return out
}

// Scenario 8: scenarios 1, 2 and 4 through real Gatekeeper with the
// generated template, and its audit finds no violation in existing Nodes.
func TestGatekeeper(t *testing.T) {
	cfg, env := apiServerEnv(t)
	kube, dyn := clientsFor(t, cfg)
	ctx := context.Background()
	gatekeeper(t, env, kube)

	capdMachine(t, dyn, "dev-md-0-abcde", true)
	capdMachine(t, dyn, "linked-b", false)
	deleteNode := func(name string) error { return kube.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}) }
	dryRun := func(name string) error { return dryRunDelete(ctx, kube, name) }

	// Scenario 1: denied while the DockerMachine exists (once Gatekeeper has
	// synced it).
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		err := dryRun("dev-md-0-abcde")
		require.Error(c, err)
		assert.Contains(c, err.Error(), `admission webhook "validation.gatekeeper.sh" denied the request: [node-deletion-guard]`)
		assert.Contains(c, err.Error(), "DockerMachine default/dev-md-0-abcde")
	}, 60*time.Second, 250*time.Millisecond, "Gatekeeper must deny once it has synced the DockerMachine")
	t.Logf("Gatekeeper: %v", dryRun("dev-md-0-abcde"))

	// Being deleted, held by its finalizer: Gatekeeper's sync controller
	// drops an object from data.inventory as soon as it carries a
	// deletionTimestamp, so the rule never sees it and Gatekeeper allows
	// (README, Limits). nodeguard serve denies here (TestNodeDeleteWaitsForTheInfraMachine).
	require.NoError(t, dyn.Resource(dockerMachine).Namespace("default").Delete(ctx, "dev-md-0-abcde", metav1.DeleteOptions{}))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.NoError(c, dryRun("dev-md-0-abcde"))
	}, 30*time.Second, 250*time.Millisecond, "Gatekeeper v3.23 forgets an InfraMachine once it is being deleted")
	dm, err := dyn.Resource(dockerMachine).Namespace("default").Get(ctx, "dev-md-0-abcde", metav1.GetOptions{})
	require.NoError(t, err)
	require.NotNil(t, dm.GetDeletionTimestamp(), "the DockerMachine still exists, held by its finalizer")
	t.Logf("Gatekeeper allows the Node delete while DockerMachine default/dev-md-0-abcde is being deleted (finalizers %v)", dm.GetFinalizers())

	// Gone: allowed.
	dm.SetFinalizers(nil)
	_, err = dyn.Resource(dockerMachine).Namespace("default").Update(ctx, dm, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.NoError(t, deleteNode("dev-md-0-abcde"))

	// Scenario 2: the wrong order through kubectl.
	out, err := kubectl(t, env, "delete", "node", "linked-b")
	require.Error(t, err, out)
	assert.Contains(t, out, `admission webhook "validation.gatekeeper.sh" denied the request`)
	assert.Contains(t, out, "DockerMachine default/linked-b")
	t.Logf("kubectl delete node linked-b:\n%s", out)

	// Audit: the existing linked Node is no violation (only a DELETE is).
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		con, err := dyn.Resource(constraintGVR).Get(ctx, "node-deletion-guard", metav1.GetOptions{})
		require.NoError(c, err)
		ts, _, _ := unstructured.NestedString(con.Object, "status", "auditTimestamp")
		require.NotEmpty(c, ts, "no audit yet: status %v", con.Object["status"])
		total, found, err := unstructured.NestedInt64(con.Object, "status", "totalViolations")
		require.NoError(c, err)
		require.True(c, found, "status %v", con.Object["status"])
		assert.Zero(c, total, "audit must report no violation for existing Nodes: status %v", con.Object["status"])
	}, 60*time.Second, time.Second, "Gatekeeper's audit")
	t.Log("Gatekeeper's audit: 0 violations with linked Nodes present")

	// Scenario 4: swap in the break-glass Constraint; the exempt group
	// deletes (Gatekeeper allows silently: a deny constraint has no warnings),
	// everyone else is still denied.
	out, err = kubectl(t, env, "apply", "-f", "../../constraints/tests/constraint-exempt.yaml")
	require.NoError(t, err, out)
	out, err = kubectl(t, env, "delete", "k8snodeguard", "node-deletion-guard")
	require.NoError(t, err, out)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		err := dryRun("linked-b")
		require.Error(c, err)
		assert.Contains(c, err.Error(), "[node-deletion-guard-break-glass]")
		assert.NotContains(c, err.Error(), "[node-deletion-guard]")
	}, 30*time.Second, 250*time.Millisecond, "the break-glass Constraint alone must guard")
	out, err = kubectl(t, env, "delete", "node", "linked-b", "--as", "oncall", "--as-group", "nodeguard:break-glass", "--as-group", "system:masters")
	require.NoError(t, err, out)
	assert.Contains(t, out, `node "linked-b" deleted`)
	t.Logf("kubectl delete node linked-b as break-glass:\n%s", out)
}
