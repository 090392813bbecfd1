//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodeguard/nodeguard/enforcer/admissionpolicy"
	"github.com/nodeguard/nodeguard/enforcer/fleet"
	"github.com/nodeguard/nodeguard/enforcer/kubeclient"
	"github.com/nodeguard/nodeguard/enforcer/owned"
	"github.com/nodeguard/nodeguard/enforcer/serve"
	"github.com/nodeguard/nodeguard/enforcer/webhookconfig"
	"github.com/nodeguard/nodeguard/internal/constraints"
	"github.com/nodeguard/nodeguard/internal/testpki"
)

// put applies obj as nodeguard does (server-side apply, its field manager).
func put(t *testing.T, dyn dynamic.Interface, gvr schema.GroupVersionResource, obj runtime.Object) {
	t.Helper()
	o, err := owned.From(gvr, obj)
	require.NoError(t, err)
	_, err = owned.Apply(context.Background(), dyn, o)
	require.NoError(t, err)
}

// warnings collects the admission warnings of each request.
type warnings struct {
	mu   sync.Mutex
	seen []string
}

func (w *warnings) HandleWarningHeaderWithContext(_ context.Context, _ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = append(w.seen, text)
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.seen
	w.seen = nil
	return out
}

// The generated ValidatingAdmissionPolicy of mode admission-policy, as
// committed in constraints/admission-policy/, on a real kube-apiserver: it
// decides Node deletes from the released Nodes alone, with no webhook.
func TestAdmissionPolicyDecidesFromTheReleasedNodes(t *testing.T) {
	cfg := apiServer(t)
	ctx := context.Background()
	kube, dyn := clientsFor(t, cfg)

	policy, binding, err := constraints.AdmissionPolicyManifests(filepath.Join("..", "..", "constraints"))
	require.NoError(t, err)
	put(t, dyn, admissionpolicy.PolicyGVR, policy)
	put(t, dyn, admissionpolicy.BindingGVR, binding)
	// As the fleet builds them (the committed files leave out empty
	// selectors): stored exactly as built, with nothing the API server
	// defaults left unset.
	built, builtBinding, err := admissionpolicy.Build(mustInfo(t), admissionpolicy.Options{})
	require.NoError(t, err)
	for gvr, obj := range map[schema.GroupVersionResource]runtime.Object{admissionpolicy.PolicyGVR: built, admissionpolicy.BindingGVR: builtBinding} {
		put(t, dyn, gvr, obj)
		want, err := owned.From(gvr, obj)
		require.NoError(t, err)
		have, err := dyn.Resource(gvr).Get(ctx, want.Object.GetName(), metav1.GetOptions{})
		require.NoError(t, err)
		assert.True(t, owned.Holds(have, want.Object, "spec"), "%s stored as built, else the fleet writes it at every reconcile: %v",
			gvr.Resource, have.Object["spec"])
	}
	_, err = kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: admissionpolicy.ParamsNamespace}}, metav1.CreateOptions{})
	require.NoError(t, err)
	node := func(name string) *corev1.Node {
		n, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		require.NoError(t, err)
		return n
	}
	running, teardown, gone := node("running"), node("teardown"), node("gone")
	publish := func(verdicts ...admissionpolicy.Verdict) {
		cm, omitted, err := admissionpolicy.Params(verdicts, admissionpolicy.MaxParamsBytes)
		require.NoError(t, err)
		require.Zero(t, omitted)
		put(t, dyn, admissionpolicy.ParamsGVR, cm)
	}
	denied := func(t require.TestingT, err error, want string) {
		require.Error(t, err)
		assert.True(t, apierrors.IsForbidden(err), "403 Forbidden, as nodeguard's webhook answers: %v", err)
		assert.Contains(t, err.Error(), want)
	}

	t.Run("without the released Nodes every delete is denied", func(t *testing.T) {
		// The policy takes a moment to load: until it denies, it is not there.
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			err := dryRunDelete(ctx, kube, running.Name)
			require.Error(c, err)
			// The API server's own words and status (422 Invalid: the
			// validation's reason applies only to its expression's denials).
			assert.True(c, apierrors.IsInvalid(err), "%s: %v", apierrors.ReasonForError(err), err)
			assert.Contains(c, err.Error(), "no params found for policy binding")
		}, 30*time.Second, 100*time.Millisecond, "parameterNotFoundAction: Deny")
	})

	publish(admissionpolicy.Verdict{Node: running.Name},
		admissionpolicy.Verdict{Node: teardown.Name, Blocker: "Node \"teardown\" cannot be deleted: DockerMachine default/teardown is being deleted but still exists."},
		admissionpolicy.Verdict{Node: gone.Name, UID: string(gone.UID), Released: true})

	t.Run("a blocked Node is denied, a released one allowed", func(t *testing.T) {
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.NoError(c, dryRunDelete(ctx, kube, gone.Name))
		}, 30*time.Second, 100*time.Millisecond, "the released Nodes are read")
		denied(t, dryRunDelete(ctx, kube, running.Name), "nodeguard has not released it")
		denied(t, dryRunDelete(ctx, kube, teardown.Name), "DockerMachine default/teardown is being deleted but still exists")
		require.NoError(t, kube.CoreV1().Nodes().Delete(ctx, gone.Name, metav1.DeleteOptions{}))
	})

	t.Run("a Node re-created under a released name is not released", func(t *testing.T) {
		again := node(gone.Name)
		require.NotEqual(t, gone.UID, again.UID)
		denied(t, dryRunDelete(ctx, kube, again.Name), "re-created under its name")
	})

	t.Run("exempt users and groups are not judged", func(t *testing.T) {
		p, b, err := admissionpolicy.Build(mustInfo(t), admissionpolicy.Options{ExemptUsers: []string{"alice"}, ExemptGroups: []string{"nodeguard:break-glass"}})
		require.NoError(t, err)
		put(t, dyn, admissionpolicy.PolicyGVR, p)
		put(t, dyn, admissionpolicy.BindingGVR, b)
		as := func(user string, groups ...string) kubernetes.Interface {
			c := rest.CopyConfig(cfg)
			c.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: append(groups, "system:masters")}
			k, err := kubernetes.NewForConfig(c)
			require.NoError(t, err)
			return k
		}
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.NoError(c, dryRunDelete(ctx, as("alice"), running.Name))
			assert.NoError(c, dryRunDelete(ctx, as("bob", "nodeguard:break-glass"), running.Name))
		}, 30*time.Second, 100*time.Millisecond)
		denied(t, dryRunDelete(ctx, as("bob"), running.Name), "nodeguard has not released it")
	})

	t.Run("warn allows with the denial as a warning", func(t *testing.T) {
		p, b, err := admissionpolicy.Build(mustInfo(t), admissionpolicy.Options{Action: admissionpolicy.Warn})
		require.NoError(t, err)
		put(t, dyn, admissionpolicy.PolicyGVR, p)
		put(t, dyn, admissionpolicy.BindingGVR, b)
		seen := &warnings{}
		c := rest.CopyConfig(cfg)
		c.WarningHandlerWithContext = seen
		warned, err := kubernetes.NewForConfig(c)
		require.NoError(t, err)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.NoError(c, dryRunDelete(ctx, warned, running.Name))
		}, 30*time.Second, 100*time.Millisecond)
		assert.Contains(t, strings.Join(seen.take(), "\n"), "nodeguard has not released it")
	})
}

func mustInfo(t *testing.T) admissionpolicy.Info {
	t.Helper()
	info, err := admissionpolicy.LoadInfo()
	require.NoError(t, err, fmt.Sprintf("METADATA of policies/%s", admissionpolicy.Entry))
	return info
}

// Mode admission-policy end to end: a management and a workload
// kube-apiserver, `nodeguard serve --fleet --fleet-admission-policy`, a
// Cluster annotated for the mode. The workload API server decides Node
// deletes itself, from the Nodes nodeguard released, and goes on doing so
// with nodeguard stopped.
func TestFleetAdmissionPolicyModeNeedsNoPathToNodeguard(t *testing.T) {
	mgmt := apiServer(t)
	w, wEnv := apiServerEnv(t)
	mgmtKube, dyn := clientsFor(t, mgmt)
	kube, _ := clientsFor(t, w)
	ctx := context.Background()
	ca := testpki.New(t)
	clients, err := kubeclient.FromConfig(mgmt)
	require.NoError(t, err)
	t.Setenv("POD_NAMESPACE", "default")
	// The URL is never reached in this mode: nothing listens for the
	// workload API server.
	opts := serve.Options{Fleet: serve.FleetOptions{Enabled: true, AdmissionPolicy: true, URL: "https://127.0.0.1:" + strconv.Itoa(freePort(t)),
		CAFiles: []string{ca.CAFile(t)}, ProofInterval: fleetProof}}
	opts.Orphans.Interval, opts.Orphans.KubeconfigRecheck = serve.DefaultOrphanScanInterval, 2*time.Second
	_, stop := serveWith(t, clients, ca, opts)

	workloadMachine(t, dyn, mgmtKube, kube, "md-0-a")
	workloadMachine(t, dyn, mgmtKube, kube, "md-0-b")
	_, err = kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "free"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	apply(t, dyn, clustersGVR, map[string]any{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
		"metadata": map[string]any{"namespace": "default", "name": "dev", "annotations": map[string]any{fleet.ModeAnnotation: fleet.ModeAdmissionPolicy}},
		"spec":     map[string]any{"paused": true}})
	secretAt := time.Now()
	workloadAdmin(t, ctx, wEnv, mgmtKube, "default", "dev")
	state := func(c require.TestingT) fleet.State {
		list, err := fleet.List(ctx, clients, "default")
		require.NoError(c, err)
		for _, s := range list {
			if s.Cluster == "default/dev" {
				return s
			}
		}
		return fleet.State{}
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		s := state(c)
		assert.True(c, s.Guarded, "%+v", s)
		assert.Equal(c, fleet.ModeAdmissionPolicy, s.Mode)
	}, 60*time.Second, 200*time.Millisecond, "guarded and proven by the policy's denial")
	t.Logf("guarded and proven %s after the kubeconfig Secret appeared", time.Since(secretAt).Round(100*time.Millisecond))
	_, err = kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, webhookconfig.Name, metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "no webhook in this mode: %v", err)

	policyDenies := func(c require.TestingT, node string) {
		err := dryRunDelete(ctx, kube, node)
		require.Error(c, err)
		assert.True(c, apierrors.IsForbidden(err), "%v", err)
		assert.Contains(c, err.Error(), "ValidatingAdmissionPolicy 'nodeguard'")
	}
	t.Run("a linked Node's delete is denied in the API server", func(t *testing.T) {
		policyDenies(t, "md-0-a")
	})
	t.Run("an unlinked Node is released", func(t *testing.T) {
		require.EventuallyWithT(t, func(c *assert.CollectT) { assert.NoError(c, dryRunDelete(ctx, kube, "free")) },
			10*time.Second, 50*time.Millisecond)
	})
	t.Run("deleted released Nodes are published again", func(t *testing.T) {
		require.NoError(t, kube.CoreV1().ConfigMaps(admissionpolicy.ParamsNamespace).Delete(ctx, admissionpolicy.ParamsName, metav1.DeleteOptions{}))
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			cm, err := kube.CoreV1().ConfigMaps(admissionpolicy.ParamsNamespace).Get(ctx, admissionpolicy.ParamsName, metav1.GetOptions{})
			require.NoError(c, err)
			assert.Contains(c, cm.Data, "free")
		}, 10*time.Second, 50*time.Millisecond)
		require.NoError(t, dryRunDelete(ctx, kube, "free"))
	})
	t.Run("the InfraMachine gone releases its Node", func(t *testing.T) {
		dockers := schema.GroupVersionResource{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Resource: "dockermachines"}
		gone := time.Now()
		require.NoError(t, dyn.Resource(dockers).Namespace("default").Delete(ctx, "md-0-a", metav1.DeleteOptions{}))
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.NoError(c, kube.CoreV1().Nodes().Delete(ctx, "md-0-a", metav1.DeleteOptions{}))
		}, 10*time.Second, 10*time.Millisecond)
		t.Logf("DockerMachine gone to Node deleted: %s (loopback)", time.Since(gone).Round(10*time.Millisecond))
	})
	t.Run("with nodeguard stopped, what was released stays deletable and nothing else is", func(t *testing.T) {
		stop()
		require.NoError(t, dryRunDelete(ctx, kube, "free"))
		policyDenies(t, "md-0-b")
	})
}
