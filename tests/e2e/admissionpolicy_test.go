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
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/fleet"
	ngkube "github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/enforcer/serve"
	"github.com/nodeguard/nodeguard/internal/constraints"
	"github.com/nodeguard/nodeguard/internal/localcluster"
	"github.com/nodeguard/nodeguard/internal/testpki"
)

// put applies obj as nodeguard does (server-side apply, its field manager).
func put(t *testing.T, dyn dynamic.Interface, gvr schema.GroupVersionResource, obj runtime.Object) {
	t.Helper()
	o, err := ngkube.OwnedFrom(gvr, obj)
	require.NoError(t, err)
	_, err = ngkube.ApplyOwned(context.Background(), dyn, o)
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
	put(t, dyn, admission.PolicyGVR, policy)
	put(t, dyn, admission.BindingGVR, binding)
	// As the fleet builds them (the committed files leave out empty
	// selectors): stored exactly as built, with nothing the API server
	// defaults left unset.
	built, builtBinding, err := admission.BuildPolicy(mustInfo(t), admission.PolicyOptions{})
	require.NoError(t, err)
	for gvr, obj := range map[schema.GroupVersionResource]runtime.Object{admission.PolicyGVR: built, admission.BindingGVR: builtBinding} {
		put(t, dyn, gvr, obj)
		want, err := ngkube.OwnedFrom(gvr, obj)
		require.NoError(t, err)
		have, err := dyn.Resource(gvr).Get(ctx, want.Object.GetName(), metav1.GetOptions{})
		require.NoError(t, err)
		assert.True(t, ngkube.Holds(have, want.Object, "spec"), "%s stored as built, else the fleet writes it at every reconcile: %v",
			gvr.Resource, have.Object["spec"])
	}
	_, err = kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: admission.ParamsNamespace}}, metav1.CreateOptions{})
	require.NoError(t, err)
	node := func(name string) *corev1.Node {
		n, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		require.NoError(t, err)
		return n
	}
	running, teardown, gone := node("running"), node("teardown"), node("gone")
	publish := func(verdicts ...admission.ReleaseVerdict) {
		cm, omitted, err := admission.PolicyParams(verdicts, admission.MaxParamsBytes)
		require.NoError(t, err)
		require.Zero(t, omitted)
		put(t, dyn, admission.ParamsGVR, cm)
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

	publish(admission.ReleaseVerdict{Node: running.Name},
		admission.ReleaseVerdict{Node: teardown.Name, Blocker: "Node \"teardown\" cannot be deleted: DockerMachine default/teardown is being deleted but still exists."},
		admission.ReleaseVerdict{Node: gone.Name, UID: string(gone.UID), Released: true})

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
		p, b, err := admission.BuildPolicy(mustInfo(t), admission.PolicyOptions{ExemptUsers: []string{"alice"}, ExemptGroups: []string{"nodeguard:break-glass"}})
		require.NoError(t, err)
		put(t, dyn, admission.PolicyGVR, p)
		put(t, dyn, admission.BindingGVR, b)
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
		p, b, err := admission.BuildPolicy(mustInfo(t), admission.PolicyOptions{Action: rule.ActionWarn})
		require.NoError(t, err)
		put(t, dyn, admission.PolicyGVR, p)
		put(t, dyn, admission.BindingGVR, b)
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

func mustInfo(t *testing.T) admission.PolicyInfo {
	t.Helper()
	info, err := admission.LoadPolicyInfo()
	require.NoError(t, err, fmt.Sprintf("METADATA of policies/%s", admission.PolicyEntry))
	return info
}

// policyDenials is how many requests the workload API server's
// ValidatingAdmissionPolicy nodeguard denied so far (its own metric), which
// counts the Node deletes it refused, whoever made them.
func policyDenials(t require.TestingT, ctx context.Context, kube kubernetes.Interface) int {
	raw, err := kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	require.NoError(t, err)
	n := 0
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "apiserver_validating_admission_policy_check_total{") &&
			strings.Contains(line, `enforcement_action="deny"`) && strings.Contains(line, `policy="nodeguard"`) {
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			require.NoError(t, err, line)
			n += int(v)
		}
	}
	return n
}

// Mode admission-policy end to end with the real Cluster API manager:
// Machines on the management API server, Nodes on the workload one, which
// decides Node deletes itself from the Nodes nodeguard released. The URL
// nodeguard is given is never reached: nothing listens for the workload
// API server. CAPI's order holds, a third party's delete is denied, and
// with nodeguard stopped what was released stays deletable and nothing
// else is.
func TestCAPIAdmissionPolicyMode(t *testing.T) {
	_, mgmtEnv := apiServerEnv(t)
	_, workloadEnv := apiServerEnv(t)
	c := startCAPI(t, mgmtEnv, workloadEnv)
	ctx := context.Background()
	kube := c.nodes
	_, err := c.dyn.Resource(clustersGVR).Namespace("default").Patch(ctx, "dev", types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"`+fleet.ModeAnnotation+`":"`+fleet.ModeAdmissionPolicy+`"}}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	clients, err := ngkube.FromConfig(localcluster.Config(mgmtEnv))
	require.NoError(t, err)
	installConstraintCRD(t, clients.Config)
	ca := testpki.New(t)
	t.Setenv("POD_NAMESPACE", "default")
	// An hour between proofs: the policy's denials counted below are then
	// the test's and CAPI's alone.
	opts := serve.Options{ConstraintName: facts.DefaultConstraintName, Fleet: serve.FleetOptions{Enabled: true, AdmissionPolicy: true,
		URL: "https://127.0.0.1:" + strconv.Itoa(freePort(t)), CAFiles: []string{ca.CAFile(t)}, ProofInterval: time.Hour}}
	opts.Orphans.Interval, opts.Orphans.KubeconfigRecheck, opts.Orphans.Ghosts = serve.DefaultOrphanScanInterval, 2*time.Second, detecting()
	started := time.Now()
	_, stop := serveWith(t, clients, ca, opts)
	require.EventuallyWithT(t, func(col *assert.CollectT) {
		states, err := fleet.List(ctx, clients, "default")
		require.NoError(col, err)
		require.Len(col, states, 1)
		assert.True(col, states[0].Guarded, "%+v", states[0])
		assert.Equal(col, fleet.ModeAdmissionPolicy, states[0].Mode)
	}, 60*time.Second, 200*time.Millisecond, "guarded and proven by the policy's denial")
	t.Logf("guarded and proven %s after nodeguard started", time.Since(started).Round(100*time.Millisecond))
	_, err = kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, admission.Name, metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "no webhook in this mode: %v", err)

	policyDenies := func(c require.TestingT, node, want string) {
		err := dryRunDelete(ctx, kube, node)
		require.Error(c, err)
		assert.Contains(c, err.Error(), "ValidatingAdmissionPolicy 'nodeguard'")
		assert.Contains(c, err.Error(), want)
	}
	released := func(c require.TestingT, node string) {
		cm, err := kube.CoreV1().ConfigMaps(admission.ParamsNamespace).Get(ctx, admission.ParamsName, metav1.GetOptions{})
		require.NoError(c, err)
		n, err := kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		require.NoError(c, err)
		assert.Equal(c, string(n.UID), cm.Data[node], "Node %s released with its UID", node)
	}
	_, err = kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "free"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Run("an unlinked Node is released, a linked one is not", func(t *testing.T) {
		require.EventuallyWithT(t, func(c *assert.CollectT) { assert.NoError(c, dryRunDelete(ctx, kube, "free")) },
			10*time.Second, 50*time.Millisecond)
		policyDenies(t, "dev-cp-0", `Node "dev-cp-0" cannot be deleted: nodeguard has not released it`)
	})
	t.Run("the released Nodes deleted are published again", func(t *testing.T) {
		require.NoError(t, kube.CoreV1().ConfigMaps(admission.ParamsNamespace).Delete(ctx, admission.ParamsName, metav1.DeleteOptions{}))
		require.EventuallyWithT(t, func(c *assert.CollectT) { released(c, "free") }, 10*time.Second, 50*time.Millisecond)
	})

	t.Run("CAPI deletes a Machine in order; a third party's Node delete is denied", func(t *testing.T) {
		const name = "dev-md-0-abcde"
		c.machine(t, name, localcluster.MachineOptions{})
		policyDenies(t, name, "nodeguard has not released it")
		// When the release became visible to a client of the workload API
		// server, polled every 10 ms from here on.
		visible := make(chan time.Time, 1)
		pollCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			_ = wait.PollUntilContextCancel(pollCtx, 10*time.Millisecond, true, func(ctx context.Context) (bool, error) {
				cm, err := kube.CoreV1().ConfigMaps(admission.ParamsNamespace).Get(ctx, admission.ParamsName, metav1.GetOptions{})
				if err == nil && cm.Data[name] != "" {
					visible <- time.Now()
					return true, nil
				}
				return false, nil
			})
		}()
		before := policyDenials(t, ctx, kube)
		c.deletesInOrder(t, name, "ValidatingAdmissionPolicy 'nodeguard'", capiWindow)
		d, _ := c.capd.Deleted(name)
		select {
		case at := <-visible:
			t.Logf("release visible %s after the DockerMachine was gone", at.Sub(d.At).Round(time.Millisecond))
		default:
			t.Error("the Node was deleted before its release was seen")
		}
		// The third party's delete is one denial; every other one is an
		// attempt of CAPI's, which tries every 2 s.
		denied := policyDenials(t, ctx, kube) - before
		require.GreaterOrEqual(t, denied, 1, "the metric counts the third party's denied delete")
		t.Logf("CAPI's Node delete denied %d time(s) before it was admitted", denied-1)
		assert.LessOrEqual(t, denied-1, 1, "CAPI's Node delete admitted within its first two tries")
	})

	t.Run("a Constraint edit reaches the workload cluster's policy", func(t *testing.T) {
		as := rest.CopyConfig(localcluster.Config(workloadEnv))
		as.Impersonate = rest.ImpersonationConfig{UserName: "alice", Groups: []string{"system:masters"}}
		alice, err := kubernetes.NewForConfig(as)
		require.NoError(t, err)
		policyDenies(t, "dev-cp-0", "nodeguard has not released it")
		edited := time.Now()
		setConstraint(t, c.dyn, "", "alice")
		require.EventuallyWithT(t, func(c *assert.CollectT) { assert.NoError(c, dryRunDelete(ctx, alice, "dev-cp-0")) },
			30*time.Second, 20*time.Millisecond, "alice exempt in the workload cluster's policy")
		t.Logf("exemptUsers [alice] in force in the workload cluster %s after the edit", time.Since(edited).Round(time.Millisecond))
		require.NoError(t, c.dyn.Resource(constraintGVR).Delete(ctx, facts.DefaultConstraintName, metav1.DeleteOptions{}))
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			err := dryRunDelete(ctx, alice, "dev-cp-0")
			require.Error(c, err)
			assert.Contains(c, err.Error(), "nodeguard has not released it")
		}, 30*time.Second, 20*time.Millisecond, "the Constraint deleted: no exemptions")
	})

	t.Run("with nodeguard stopped, what was released stays deletable and nothing else is", func(t *testing.T) {
		stop()
		require.NoError(t, dryRunDelete(ctx, kube, "free"))
		policyDenies(t, "dev-cp-0", "nodeguard has not released it")
		old, err := kube.CoreV1().Nodes().Get(ctx, "free", metav1.GetOptions{})
		require.NoError(t, err)
		require.NoError(t, kube.CoreV1().Nodes().Delete(ctx, "free", metav1.DeleteOptions{}))
		again, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "free"}}, metav1.CreateOptions{})
		require.NoError(t, err)
		require.NotEqual(t, old.UID, again.UID)
		policyDenies(t, "free", "re-created under its name")

		require.NoError(t, kube.CoreV1().ConfigMaps(admission.ParamsNamespace).Delete(ctx, admission.ParamsName, metav1.DeleteOptions{}))
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			policyDenies(c, "dev-cp-0", "no params found for policy binding")
		}, 10*time.Second, 50*time.Millisecond, "without the released Nodes every delete is denied")
	})

	parent := t // nodeguard started again runs to the test's end, not the subtest's
	t.Run("nodeguard back publishes the released Nodes again", func(t *testing.T) {
		back := time.Now()
		serveWith(parent, clients, ca, opts)
		require.EventuallyWithT(t, func(c *assert.CollectT) { released(c, "free") }, 30*time.Second, 50*time.Millisecond)
		require.EventuallyWithT(t, func(c *assert.CollectT) { assert.NoError(c, dryRunDelete(ctx, kube, "free")) },
			10*time.Second, 50*time.Millisecond)
		t.Logf("the re-created Node released %s after nodeguard restarted", time.Since(back).Round(100*time.Millisecond))
		policyDenies(t, "dev-cp-0", "nodeguard has not released it")
	})

	t.Run("the Cluster's enforcement action sets its binding's", func(t *testing.T) {
		_, err := c.dyn.Resource(clustersGVR).Namespace("default").Patch(ctx, "dev", types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"`+rule.ActionAnnotation+`":"warn"}}}`), metav1.PatchOptions{})
		require.NoError(t, err)
		seen := &warnings{}
		cfg := rest.CopyConfig(localcluster.Config(workloadEnv))
		cfg.WarningHandlerWithContext = seen
		warned, err := kubernetes.NewForConfig(cfg)
		require.NoError(t, err)
		require.EventuallyWithT(t, func(col *assert.CollectT) {
			assert.NoError(col, dryRunDelete(ctx, warned, "dev-cp-0"), "warn admits")
		}, 30*time.Second, 100*time.Millisecond)
		assert.Contains(t, strings.Join(seen.take(), "\n"), "nodeguard has not released it")
		b, err := kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, "nodeguard", metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Warn}, b.Spec.ValidationActions)
	})
}
