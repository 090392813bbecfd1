//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/nodeguard/nodeguard/enforcer/events"
	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/enforcer/serve"
)

// `serve --enforcement-action warn` on a real API server: `kubectl delete
// node` of a blocked Node succeeds, kubectl prints the denial as a warning,
// and a NodeDeleteWouldBeDenied Event is left on the Node.
func TestEnforcementActionWarnAdmitsWithTheDenialAsAWarning(t *testing.T) {
	cfg, env := apiServerEnv(t)
	nodeguardWith(t, cfg, serve.Options{EnforcementAction: rule.ActionWarn})
	kube, dyn := clientsFor(t, cfg)
	ctx := context.Background()
	capdMachine(t, dyn, "md-0-warn", false)
	capdMachine(t, dyn, "md-0-warn-dry", false)
	// Until nodeguard is ready its denial (not-ready) is admitted with a
	// warning too: wait for the rule's.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		out, err := kubectl(t, env, "delete", "node", "md-0-warn-dry", "--dry-run=server")
		require.NoError(c, err, out)
		assert.Contains(c, out, "Warning: nodeguard (enforcement action warn, blocked): this delete would be denied:")
	}, 30*time.Second, 200*time.Millisecond)
	out, err := kubectl(t, env, "delete", "node", "md-0-warn")
	require.NoError(t, err, "warn admits: %s", out)
	assert.Contains(t, out, "DockerMachine default/md-0-warn")
	t.Logf("kubectl delete node md-0-warn under warn:\n%s", out)
	_, err = kube.CoreV1().Nodes().Get(ctx, "md-0-warn", metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "the Node is deleted: %v", err)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		list, err := kube.EventsV1().Events("").List(ctx, metav1.ListOptions{})
		require.NoError(c, err)
		found := false
		for _, e := range list.Items {
			if e.Reason == events.ReasonWouldBeDenied && e.Regarding.Name == "md-0-warn" {
				found = true
				assert.Contains(c, e.Note, "admitted under enforcement action warn, would be denied (blocked)")
			}
		}
		assert.True(c, found, "a NodeDeleteWouldBeDenied Event on the Node")
	}, 15*time.Second, 200*time.Millisecond)
}

// The K8sNodeGuard Constraint edited while nodeguard serves: its
// exemptUsers and spec.enforcementAction reach the next decisions without a
// restart, an action nodeguard does not take is refused (the one before stays
// in force), and deleting the Constraint puts the rule's defaults back.
// The CRD is the resource Gatekeeper serves for the template
// (k8snodeguard.constraints.gatekeeper.sh, cluster-scoped), without the
// schema Gatekeeper would generate: nodeguard reads only the object.
func TestServeFollowsTheConstraintWithoutARestart(t *testing.T) {
	cfg := apiServer(t)
	kube, dyn := clientsFor(t, cfg)
	installConstraintCRD(t, cfg)
	nodeguardWith(t, cfg, serve.Options{ConstraintName: facts.DefaultConstraintName})
	capdMachine(t, dyn, "md-0-live", false)
	ctx := context.Background()
	// attempt is one dry-run delete of the Node, as alice or the admin, with
	// the warnings it got back.
	attempt := func(asAlice bool) (string, error) {
		seen := &warnings{}
		c := rest.CopyConfig(cfg)
		c.WarningHandlerWithContext = seen
		if asAlice {
			c.Impersonate = rest.ImpersonationConfig{UserName: "alice", Groups: []string{"system:masters"}}
		}
		client, err := kubernetes.NewForConfig(c)
		require.NoError(t, err)
		err = dryRunDelete(ctx, client, "md-0-live")
		return strings.Join(seen.take(), "\n"), err
	}
	deniedToAlice := func(_ string, err error) bool {
		return err != nil && strings.Contains(err.Error(), "DockerMachine default/md-0-live")
	}
	require.Eventually(t, func() bool { return deniedToAlice(attempt(true)) }, 30*time.Second, 200*time.Millisecond,
		"no Constraint: the rule's defaults deny alice")

	set := func(action string, exempt ...any) { setConstraint(t, dyn, action, exempt...) }
	// until waits for the answer to meet ok and says how long after the edit
	// it first did: the time to apply, plus at most one 10 ms poll.
	until := func(what string, asAlice bool, ok func(warnings string, err error) bool) {
		t.Helper()
		start := time.Now()
		require.Eventually(t, func() bool { return ok(attempt(asAlice)) }, 30*time.Second, 10*time.Millisecond, what)
		t.Logf("%s: in force %s after the edit", what, time.Since(start).Round(time.Millisecond))
	}
	set("deny", "alice")
	until("exemptUsers [alice]", true, func(w string, err error) bool { return err == nil && strings.Contains(w, `user "alice" is exempt`) })

	set("warn", "alice")
	warned := func(w string, err error) bool {
		return err == nil && strings.Contains(w, "nodeguard (enforcement action warn, blocked)")
	}
	until("enforcementAction warn", false, warned)

	// Gatekeeper's "scoped" is not an action nodeguard takes: refused, warn
	// stays in force.
	set("scoped", "alice")
	require.Never(t, func() bool { return !warned(attempt(false)) }, 2*time.Second, 100*time.Millisecond, "a refused edit changes nothing")

	require.NoError(t, dyn.Resource(constraintGVR).Delete(ctx, facts.DefaultConstraintName, metav1.DeleteOptions{}))
	until("Constraint deleted: the defaults", true, deniedToAlice)
	_, err := kube.CoreV1().Nodes().Get(ctx, "md-0-live", metav1.GetOptions{})
	require.NoError(t, err, "every delete above was a dry run")
}

// installConstraintCRD serves the resource Gatekeeper serves for the
// K8sNodeGuard template (k8snodeguard.constraints.gatekeeper.sh,
// cluster-scoped), without the schema Gatekeeper would generate: nodeguard
// reads only the object.
func installConstraintCRD(t *testing.T, cfg *rest.Config) {
	t.Helper()
	preserve := true
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "k8snodeguard.constraints.gatekeeper.sh"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "constraints.gatekeeper.sh", Scope: apiextensionsv1.ClusterScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "k8snodeguard", Singular: "k8snodeguard", Kind: "K8sNodeGuard", ListKind: "K8sNodeGuardList"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1beta1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{"spec": {Type: "object", XPreserveUnknownFields: &preserve}}}}}},
		},
	}
	_, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{CRDs: []*apiextensionsv1.CustomResourceDefinition{crd}})
	require.NoError(t, err)
}

// setConstraint applies the Constraint node-deletion-guard with exemptUsers
// and, unless "", spec.enforcementAction.
func setConstraint(t *testing.T, dyn dynamic.Interface, action string, exempt ...any) {
	t.Helper()
	spec := map[string]any{"parameters": map[string]any{"exemptUsers": exempt}}
	if action != "" {
		spec["enforcementAction"] = action
	}
	obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "constraints.gatekeeper.sh/v1beta1", "kind": "K8sNodeGuard",
		"metadata": map[string]any{"name": facts.DefaultConstraintName}, "spec": spec}}
	data, err := obj.MarshalJSON()
	require.NoError(t, err)
	_, err = dyn.Resource(constraintGVR).Patch(context.Background(), facts.DefaultConstraintName, types.ApplyPatchType, data,
		metav1.PatchOptions{FieldManager: "e2e", Force: ptr.To(true)})
	require.NoError(t, err)
}
