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
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/fleet"
	ngkube "github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/enforcer/serve"
	"github.com/nodeguard/nodeguard/internal/constraints"
	"github.com/nodeguard/nodeguard/internal/legacypolicy"
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

// impersonating is a client that the API server sees as user in groups
// (and system:masters, so RBAC lets it: only the policies decide).
func impersonating(t *testing.T, cfg *rest.Config, user string, groups ...string) kubernetes.Interface {
	t.Helper()
	c := rest.CopyConfig(cfg)
	c.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: append(groups, "system:masters")}
	k, err := kubernetes.NewForConfig(c)
	require.NoError(t, err)
	return k
}

// writeVerdict writes v on a Node as nodeguard does (its identity, a merge
// patch).
func writeVerdict(ctx context.Context, kube kubernetes.Interface, info admission.PolicyInfo, node string, v admission.ReleaseVerdict) error {
	patch, err := admission.VerdictPatch(info, v)
	if err != nil {
		return err
	}
	_, err = kube.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// The generated ValidatingAdmissionPolicies of mode admission-policy, as
// committed in constraints/admission-policy/, on a real kube-apiserver: the
// delete policy decides Node deletes from the verdict on the Node alone,
// with no webhook and no params; the guard policy lets no one but
// nodeguard's identity write that verdict, a kubelet included.
func TestAdmissionPolicyDecidesFromTheVerdictOnTheNode(t *testing.T) {
	cfg := apiServer(t)
	ctx := context.Background()
	kube, dyn := clientsFor(t, cfg)
	info := mustInfo(t)

	committed, err := constraints.AdmissionPolicyManifests(filepath.Join("..", "..", "constraints"))
	require.NoError(t, err)
	gvrOf := func(o any) schema.GroupVersionResource {
		if _, ok := o.(*admissionregistrationv1.ValidatingAdmissionPolicy); ok {
			return admission.PolicyGVR
		}
		return admission.BindingGVR
	}
	for _, o := range committed.Objects() {
		put(t, dyn, gvrOf(o), o.(runtime.Object))
	}
	// As the fleet builds them (the committed files leave out empty
	// selectors): stored exactly as built, with nothing the API server
	// defaults left unset.
	built, err := admission.BuildPolicies(info, admission.PolicyOptions{})
	require.NoError(t, err)
	for _, o := range built.Objects() {
		obj := o.(runtime.Object)
		put(t, dyn, gvrOf(o), obj)
		want, err := ngkube.OwnedFrom(gvrOf(o), obj)
		require.NoError(t, err)
		have, err := dyn.Resource(gvrOf(o)).Get(ctx, want.Object.GetName(), metav1.GetOptions{})
		require.NoError(t, err)
		assert.True(t, ngkube.Holds(have, want.Object, "spec"), "%s stored as built, else the fleet writes it at every reconcile: %v",
			want.Object.GetName(), have.Object["spec"])
	}
	node := func(name string) *corev1.Node {
		n, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		require.NoError(t, err)
		return n
	}
	nodeguard := impersonating(t, cfg, ngkube.Username, "system:serviceaccounts")
	running, teardown, gone := node("running"), node("teardown"), node("gone")
	denied := func(t require.TestingT, err error, want string) {
		require.Error(t, err)
		assert.True(t, apierrors.IsForbidden(err), "403 Forbidden, as nodeguard's webhook answers: %v", err)
		assert.Contains(t, err.Error(), want)
	}

	t.Run("without a verdict every delete is denied", func(t *testing.T) {
		// The policy takes a moment to load: until it denies, it is not there.
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			denied(c, dryRunDelete(ctx, kube, running.Name), `Node "running" cannot be deleted: nodeguard has not released it`)
		}, 30*time.Second, 100*time.Millisecond)
	})

	blocker := `Node "teardown" cannot be deleted: DockerMachine default/teardown is being deleted but still exists.`
	require.NoError(t, writeVerdict(ctx, nodeguard, info, teardown.Name, admission.Verdict(string(teardown.UID), false, blocker)))
	require.NoError(t, writeVerdict(ctx, nodeguard, info, gone.Name, admission.Verdict(string(gone.UID), true, "")))

	t.Run("a blocked Node is denied, a released one allowed", func(t *testing.T) {
		assert.NoError(t, dryRunDelete(ctx, kube, gone.Name))
		denied(t, dryRunDelete(ctx, kube, running.Name), "nodeguard has not released it")
		denied(t, dryRunDelete(ctx, kube, teardown.Name), "nodeguard: "+blocker)
		require.NoError(t, kube.CoreV1().Nodes().Delete(ctx, gone.Name, metav1.DeleteOptions{}))
	})

	t.Run("a Node re-created under a released name is not released, its verdict copied or not", func(t *testing.T) {
		// nodeguard's identity alone may create a Node carrying a verdict.
		again, err := nodeguard.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: gone.Name,
			Annotations: map[string]string{info.Released: string(gone.UID)}}}, metav1.CreateOptions{})
		require.NoError(t, err)
		require.NotEqual(t, gone.UID, again.UID)
		denied(t, dryRunDelete(ctx, kube, again.Name), "or this Node was re-created under its name")
	})

	t.Run("a kubelet cannot write the verdict on its Node", func(t *testing.T) {
		forged := string(running.UID)
		kubelet := impersonating(t, cfg, "system:node:"+running.Name, "system:nodes")
		guarded := func(t *testing.T, err error) {
			t.Helper()
			denied(t, err, "only nodeguard ("+ngkube.Username+") may set, change or remove the annotations")
			assert.Contains(t, err.Error(), "ValidatingAdmissionPolicy '"+info.Guard+"'")
		}
		patch := func(subresource ...string) error {
			_, err := kubelet.CoreV1().Nodes().Patch(ctx, running.Name, types.MergePatchType,
				[]byte(`{"metadata":{"annotations":{"`+info.Released+`":"`+forged+`"}}}`), metav1.PatchOptions{}, subresource...)
			return err
		}
		guarded(t, patch())
		guarded(t, patch("status"))
		// Nor change or remove the one nodeguard wrote.
		for _, body := range []string{`{"metadata":{"annotations":{"` + info.Blocker + `":"free to go"}}}`, `{"metadata":{"annotations":{"` + info.Blocker + `":null}}}`} {
			for _, sub := range [][]string{nil, {"status"}} {
				_, err := impersonating(t, cfg, "system:node:"+teardown.Name, "system:nodes").CoreV1().Nodes().Patch(ctx, teardown.Name,
					types.MergePatchType, []byte(body), metav1.PatchOptions{}, sub...)
				guarded(t, err)
			}
		}
		// Nor register a Node that carries one.
		_, err := impersonating(t, cfg, "system:node:forged", "system:nodes").CoreV1().Nodes().Create(ctx,
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "forged", Annotations: map[string]string{info.Released: "x"}}}, metav1.CreateOptions{})
		guarded(t, err)
		// A status update that leaves the verdict alone is the kubelet's to make.
		_, err = kubelet.CoreV1().Nodes().Patch(ctx, running.Name, types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"example.com/other":"x"}},"status":{"capacity":{"pods":"110"}}}`), metav1.PatchOptions{}, "status")
		require.NoError(t, err)
		denied(t, dryRunDelete(ctx, kube, running.Name), "nodeguard has not released it")
	})

	t.Run("exempt users and groups are not judged", func(t *testing.T) {
		p, err := admission.BuildPolicies(info, admission.PolicyOptions{ExemptUsers: []string{"alice"}, ExemptGroups: []string{"nodeguard:break-glass"}})
		require.NoError(t, err)
		put(t, dyn, admission.PolicyGVR, p.Delete)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.NoError(c, dryRunDelete(ctx, impersonating(t, cfg, "alice"), running.Name))
			assert.NoError(c, dryRunDelete(ctx, impersonating(t, cfg, "bob", "nodeguard:break-glass"), running.Name))
		}, 30*time.Second, 100*time.Millisecond)
		denied(t, dryRunDelete(ctx, impersonating(t, cfg, "bob"), running.Name), "nodeguard has not released it")
	})

	t.Run("warn allows with the denial as a warning", func(t *testing.T) {
		p, err := admission.BuildPolicies(info, admission.PolicyOptions{Action: rule.ActionWarn})
		require.NoError(t, err)
		put(t, dyn, admission.BindingGVR, p.DeleteBinding)
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
func policyDenials(t require.TestingT, ctx context.Context, kube kubernetes.Interface, policy string) int {
	raw, err := kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	require.NoError(t, err)
	n := 0
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "apiserver_validating_admission_policy_check_total{") &&
			strings.Contains(line, `enforcement_action="deny"`) && strings.Contains(line, `policy="`+policy+`"`) {
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
	_, workloadEnv := apiServerEnv(t)
	capiAdmissionPolicyMode(t, workloadEnv)
}

// The same with the workload API server on Kubernetes 1.37 (the policies
// written through the API, as on 1.36).
func TestCAPIAdmissionPolicyModeOnKubernetes137(t *testing.T) {
	_, workloadEnv := apiServerWith(t, current, func(env *envtest.Environment) {
		env.ControlPlane.GetAPIServer().Path = apiServer137(t)
	})
	capiAdmissionPolicyMode(t, workloadEnv)
}

func capiAdmissionPolicyMode(t *testing.T, workloadEnv *envtest.Environment) {
	_, mgmtEnv := apiServerEnv(t)
	c := startCAPI(t, mgmtEnv, workloadEnv)
	ctx := context.Background()
	kube := c.nodes
	_, err := c.dyn.Resource(clustersGVR).Namespace("default").Patch(ctx, "dev", types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"`+fleet.ModeAnnotation+`":"`+fleet.ModeAdmissionPolicy+`"}}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	clients, err := ngkube.FromConfig(localcluster.Config(mgmtEnv))
	require.NoError(t, err)
	installConstraintCRD(t, clients.Config)
	info := mustInfo(t)
	mark := "ValidatingAdmissionPolicy '" + info.Name + "'"
	ca := testpki.New(t)
	t.Setenv("POD_NAMESPACE", "default")
	// An hour between proofs: the policy's denials counted below are then
	// the test's and CAPI's alone.
	opts := serve.Options{ConstraintName: facts.DefaultConstraintName, Fleet: serve.FleetOptions{Enabled: true, AdmissionPolicy: true,
		URL: "https://127.0.0.1:" + strconv.Itoa(freePort(t)), CAFiles: []string{ca.CAFile(t)}, ProofInterval: time.Hour}}
	opts.Orphans.Interval, opts.Orphans.KubeconfigRecheck, opts.Orphans.Ghosts = serve.DefaultOrphanScanInterval, 2*time.Second, detecting()
	// nodeguard 0.3 guarded it with a policy reading a ConfigMap that
	// releases Node free: upgraded, no delete of free is ever denied.
	free, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "free"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: admission.LegacyParamsNamespace}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, wdyn := clientsFor(t, localcluster.Config(workloadEnv))
	oldPolicy, oldBinding, oldReleased := legacypolicy.Objects(map[string]string{"free": string(free.UID)})
	put(t, wdyn, admission.ParamsGVR, oldReleased)
	put(t, wdyn, admission.PolicyGVR, oldPolicy)
	put(t, wdyn, admission.BindingGVR, oldBinding)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		err := dryRunDelete(ctx, kube, "dev-cp-0")
		require.Error(c, err)
		assert.Contains(c, err.Error(), "ValidatingAdmissionPolicy '"+admission.LegacyPolicyName+"'")
	}, 30*time.Second, 100*time.Millisecond, "0.3's policy in force")
	stream := streamDeletes(ctx, kube, "free", 20*time.Millisecond)
	started := time.Now()
	_, stop := serveWith(t, clients, ca, opts)
	require.EventuallyWithT(t, func(col *assert.CollectT) {
		states, err := fleet.List(ctx, clients)
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
		assert.Contains(c, err.Error(), mark)
		assert.Contains(c, err.Error(), want)
	}
	released := func(c require.TestingT, node string) {
		n, err := kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		require.NoError(c, err)
		assert.Equal(c, string(n.UID), n.Annotations[info.Released], "Node %s released with its UID", node)
	}
	t.Run("upgraded from nodeguard 0.3's ConfigMap: no released Node denied, its objects removed", func(t *testing.T) {
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			_, err := kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, admission.LegacyPolicyName, metav1.GetOptions{})
			assert.True(c, apierrors.IsNotFound(err), "0.3's binding removed: %v", err)
			_, err = kube.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, admission.LegacyPolicyName, metav1.GetOptions{})
			assert.True(c, apierrors.IsNotFound(err), "0.3's policy removed: %v", err)
			_, err = kube.CoreV1().ConfigMaps(admission.LegacyParamsNamespace).Get(ctx, admission.LegacyParamsName, metav1.GetOptions{})
			assert.True(c, apierrors.IsNotFound(err), "0.3's ConfigMap removed: %v", err)
		}, 60*time.Second, 100*time.Millisecond)
		tries, denials, first := stream.finish(t, 20) // some more on today's policy alone
		assert.Zero(t, denials, "dry-run deletes of the released Node denied across the upgrade (first: %s)", first)
		t.Logf("upgrade from 0.3: %d dry-run deletes of a released Node, %d denied", tries, denials)
	})
	t.Run("an unlinked Node is released, a linked one is not", func(t *testing.T) {
		require.EventuallyWithT(t, func(c *assert.CollectT) { assert.NoError(c, dryRunDelete(ctx, kube, "free")) },
			10*time.Second, 50*time.Millisecond)
		policyDenies(t, "dev-cp-0", `Node "dev-cp-0" cannot be deleted: nodeguard has not released it`)
	})
	t.Run("no one but nodeguard writes the verdict; a guard deleted is restored", func(t *testing.T) {
		forge := func() error {
			_, err := kube.CoreV1().Nodes().Patch(ctx, "dev-cp-0", types.MergePatchType,
				[]byte(`{"metadata":{"annotations":{"`+info.Released+`":"x"}}}`), metav1.PatchOptions{})
			return err
		}
		err := forge()
		require.Error(t, err, "a cluster-admin cannot release a Node")
		assert.Contains(t, err.Error(), "ValidatingAdmissionPolicy '"+info.Guard+"'")
		deleted := time.Now()
		require.NoError(t, kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, info.Guard, metav1.DeleteOptions{}))
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			_, err := kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, info.Guard, metav1.GetOptions{})
			assert.NoError(c, err)
		}, 10*time.Second, 10*time.Millisecond, "the guard's binding restored")
		t.Logf("the guard's binding restored %s after its delete", time.Since(deleted).Round(time.Millisecond))
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
				n, err := kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
				if err == nil && n.Annotations[info.Released] == string(n.UID) {
					visible <- time.Now()
					return true, nil
				}
				return false, nil
			})
		}()
		before := policyDenials(t, ctx, kube, info.Name)
		c.deletesInOrder(t, name, mark, capiWindow)
		d, _ := c.capd.Deleted(name)
		select {
		case at := <-visible:
			t.Logf("release visible %s after the DockerMachine was gone", at.Sub(d.At).Round(time.Millisecond))
		default:
			t.Error("the Node was deleted before its release was seen")
		}
		// The third party's delete is one denial; every other one is an
		// attempt of CAPI's, which tries every 2 s.
		denied := policyDenials(t, ctx, kube, info.Name) - before
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
	})

	parent := t // nodeguard started again runs to the test's end, not the subtest's
	t.Run("nodeguard back writes the verdict on the re-created Node", func(t *testing.T) {
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
		b, err := kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, info.Name, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Warn}, b.Spec.ValidationActions)
	})
}
