//go:build e2e

package e2e

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/nodeguard/nodeguard/internal/localcluster"
)

var constraintGVR = schema.GroupVersionResource{Group: "constraints.gatekeeper.sh", Version: "v1beta1", Resource: "k8snodeguard"} // Gatekeeper names the plural after the kind, lowercased

// gatekeeper runs Gatekeeper's manager against the API server of env with
// its webhook patched by constraints/webhook, and applies the kustomization
// constraints (constraints or constraints/external-data) as a user would
// (localcluster.StartGatekeeper). Its log is printed if the test fails.
func gatekeeper(t *testing.T, env *envtest.Environment, kube kubernetes.Interface, constraints string) *localcluster.Gatekeeper {
	t.Helper()
	var log io.Writer
	keepLog(t, "gatekeeper", &log, &log) // registered first, so it runs after the stop below
	start := time.Now()
	gk, err := localcluster.StartGatekeeper(context.Background(), env, *binDir, "../..", constraints, t.TempDir(), log)
	require.NoError(t, err)
	t.Cleanup(gk.Stop)
	vwc, err := kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(context.Background(),
		"gatekeeper-validating-webhook-configuration", metav1.GetOptions{})
	require.NoError(t, err)
	require.Contains(t, vwc.Webhooks[0].Rules[0].Operations, admissionregistrationv1.Delete, "constraints/webhook enables DELETE")
	t.Logf("Gatekeeper started; kubectl apply -k %s %s later:\n%s", constraints, time.Since(start).Round(time.Millisecond), gk.Applied)
	return gk
}

// auditFindsNothing waits for Gatekeeper's audit to report, in the status of
// the Constraint node-deletion-guard of gvr, no violation: only a DELETE is
// one, so existing Nodes, linked or not, are not.
func auditFindsNothing(t *testing.T, dyn dynamic.Interface, gvr schema.GroupVersionResource) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		con, err := dyn.Resource(gvr).Get(context.Background(), "node-deletion-guard", metav1.GetOptions{})
		require.NoError(c, err)
		ts, _, _ := unstructured.NestedString(con.Object, "status", "auditTimestamp")
		require.NotEmpty(c, ts, "no audit yet: status %v", con.Object["status"])
		total, found, err := unstructured.NestedInt64(con.Object, "status", "totalViolations")
		require.NoError(c, err)
		require.True(c, found, "status %v", con.Object["status"])
		assert.Zero(c, total, "audit must report no violation for existing Nodes: status %v", con.Object["status"])
	}, 60*time.Second, time.Second, "Gatekeeper's audit")
	t.Logf("Gatekeeper's audit of %s: 0 violations with linked Nodes present", gvr.Resource)
}

// Scenario 8: scenarios 1, 2 and 4 through real Gatekeeper with the
// generated template, and its audit finds no violation in existing Nodes.
func TestGatekeeper(t *testing.T) {
	cfg, env := apiServerEnv(t)
	kube, dyn := clientsFor(t, cfg)
	ctx := context.Background()
	gatekeeper(t, env, kube, "constraints")

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
	// (docs/limits.md). nodeguard serve denies here (TestNodeDeleteWaitsForTheInfraMachine).
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
	auditFindsNothing(t, dyn, constraintGVR)

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
