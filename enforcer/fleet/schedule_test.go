package fleet

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/kube"
)

func scheduler() *Reconciler {
	return &Reconciler{opts: Options{ProofInterval: 5 * time.Minute, SettleWindow: DefaultSettleWindow, SettleRetry: DefaultSettleRetry}}
}

// A proven cluster is proven again ProofInterval after its last proof,
// however often it is reconciled in between (a restore, an event): the
// schedule counts from the proof, not from the last reconcile.
func TestTheNextProofIsDueFromTheLastProof(t *testing.T) {
	r := scheduler()
	tr := &tracked{expect: "webhook/", proven: "webhook/", lastProof: time.Now().Add(-4 * time.Minute), state: State{Guarded: true}}
	tr.changed = tr.lastProof.Add(-time.Second)
	for range 3 { // reconciles in between change nothing
		assert.False(t, r.proofDue(tr))
		assert.InDelta(t, time.Minute, r.next(tr, tr.state), float64(time.Second))
	}
	tr.lastProof = time.Now().Add(-5 * time.Minute)
	assert.True(t, r.proofDue(tr), "its interval passed")
}

// What a proof should find changing (a mode, an action, a write) has the
// cluster proven at once, and a proof that does not find it within the
// settle window is tried again soon, unreported; after the window it is
// reported.
func TestAChangeIsProvenAtOnceAndSettles(t *testing.T) {
	r := scheduler()
	tr := &tracked{expect: "webhook/", proven: "webhook/", lastProof: time.Now().Add(-time.Minute), state: State{Guarded: true}}
	tr.changed = tr.lastProof
	require.False(t, r.proofDue(tr))
	tr.expecting("webhook/dryrun")
	assert.True(t, r.proofDue(tr), "a new expectation is proven at once")
	st := State{Reason: ReasonReviewNotReceived}
	o := r.settle(tr, st, proof{lag: true})
	assert.True(t, o.settling, "within the settle window: the API server may not have applied it yet")
	assert.Equal(t, DefaultSettleRetry, o.after)
	o = r.settle(tr, st, proof{})
	assert.False(t, o.settling, "a failure that is not lag is reported at once")
	tr.changed = time.Now().Add(-DefaultSettleWindow)
	o = r.settle(tr, st, proof{lag: true})
	assert.False(t, o.settling, "past the window it is reported")
	assert.Equal(t, retryUnguarded, o.after)
}

// A cluster guarded, but not as written (the API server still applies the
// binding before), is proven again at the unguarded pace, not in a loop.
func TestAProofThatNeverMatchedIsRetriedAtTheUnguardedPace(t *testing.T) {
	r := scheduler()
	tr := &tracked{expect: "admission-policy/dryrun", proven: "", state: State{Guarded: true}}
	assert.Equal(t, retryUnguarded, r.next(tr, State{Guarded: true}))
	tr.proven, tr.lastProof = tr.expect, time.Now()
	assert.Equal(t, retryUnguarded, r.next(tr, State{Reason: ReasonReviewNotReceived}))
	assert.InDelta(t, 5*time.Minute, r.next(tr, State{Reason: ReasonDryRun}), float64(time.Second), "dryrun as written is proven on schedule")
}

// What nodeguard's identity may not remove (an admission policy left by an
// install with --fleet-admission-policy, now without it) is looked for and
// removed with the kubeconfig's credentials, binding first, once a
// connection, and never retried with the identity.
func TestLeftoversNodeguardMayNotRemoveAreRemovedWithTheKubeconfig(t *testing.T) {
	info, err := admission.LoadPolicyInfo()
	require.NoError(t, err)
	gvrs := map[schema.GroupVersionResource]string{admission.PolicyGVR: "ValidatingAdmissionPolicyList",
		admission.BindingGVR: "ValidatingAdmissionPolicyBindingList", admission.ParamsGVR: "ConfigMapList"}
	identity := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), gvrs)
	forbidden := 0
	identity.PrependReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		forbidden++
		return true, nil, apierrors.NewForbidden(a.GetResource().GroupResource(), "", errors.New("RBAC"))
	})
	mine := func(gvk schema.GroupVersionKind, ns, name string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(gvk)
		u.SetNamespace(ns)
		u.SetName(name)
		u.SetLabels(map[string]string{kube.ManagedByLabel: kube.Owner})
		return u
	}
	binding := admission.BindingGVR.GroupVersion().WithKind("ValidatingAdmissionPolicyBinding")
	policy := admission.PolicyGVR.GroupVersion().WithKind("ValidatingAdmissionPolicy")
	// Today's policies, and nodeguard 0.3's with its ConfigMap.
	admin := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), gvrs,
		mine(binding, "", info.Name), mine(policy, "", info.Name), mine(binding, "", info.Guard), mine(policy, "", info.Guard),
		mine(binding, "", admission.LegacyPolicyName), mine(policy, "", admission.LegacyPolicyName),
		mine(schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}, admission.LegacyParamsNamespace, admission.LegacyParamsName))
	r := &Reconciler{policyInfo: info, opts: scheduler().opts}
	r.opts.Log = slog.New(slog.DiscardHandler)
	// A workload cluster with no Node: nothing to observe the binding's
	// removal on.
	kc := k8sfake.NewClientset()
	s := &session{c: &kube.Cluster{Key: "fleet/a", Dynamic: identity, Admin: admin}, core: kc.CoreV1(), auth: kc.AuthenticationV1(), disco: kc.Discovery()}
	tr := &tracked{}
	ctx := context.Background()
	require.True(t, r.policyLeft(ctx, s), "found with the kubeconfig's credentials")
	assert.False(t, r.removePolicy(ctx, "fleet/a", s, tr), "the bindings go first")
	for _, name := range []string{info.Name, info.Guard, admission.LegacyPolicyName} {
		_, err = admin.Resource(admission.BindingGVR).Get(ctx, name, metav1.GetOptions{})
		assert.True(t, apierrors.IsNotFound(err), "binding %s removed: %v", name, err)
		_, err = admin.Resource(admission.PolicyGVR).Get(ctx, name, metav1.GetOptions{})
		assert.NoError(t, err, "policy %s waits for the API server to stop applying its binding", name)
	}
	assert.False(t, r.removePolicy(ctx, "fleet/a", s, tr), "not before the API server can have applied the removal")
	// No Node to observe it on: taken as applied bindingApplyTime after
	// the delete.
	tr.removing = time.Now().Add(-bindingApplyTime)
	assert.True(t, r.removePolicy(ctx, "fleet/a", s, tr))
	for _, name := range []string{info.Name, info.Guard, admission.LegacyPolicyName} {
		_, err = admin.Resource(admission.PolicyGVR).Get(ctx, name, metav1.GetOptions{})
		assert.True(t, apierrors.IsNotFound(err), "policy %s removed: %v", name, err)
	}
	_, err = admin.Resource(admission.ParamsGVR).Namespace(admission.LegacyParamsNamespace).Get(ctx, admission.LegacyParamsName, metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "nodeguard 0.3's ConfigMap removed: %v", err)
	assert.True(t, s.leftoversChecked)
	calls := forbidden
	assert.False(t, r.policyLeft(ctx, s), "not looked for again in this connection")
	assert.Equal(t, calls, forbidden, "nothing more asked of the identity")
}

// A Cluster proven at once is still looked at again when what nodeguard 0.3
// left waits for the delete binding to apply: "when something changes"
// (after 0) would leave it there until the next proof.
func TestWithinBoundsWhenAClusterIsLookedAtAgain(t *testing.T) {
	assert.Equal(t, 2*time.Second, outcome{}.within(2*time.Second).after, "0 is no bound")
	assert.Equal(t, 2*time.Second, outcome{after: time.Hour}.within(2*time.Second).after)
	assert.Equal(t, time.Second, outcome{after: time.Second}.within(2*time.Second).after)
	assert.Equal(t, time.Hour, outcome{after: time.Hour}.within(0).after, "nothing waits")
}

// A Cluster whose annotation names no mode gets the fleet's default; mode
// admission-policy only where its API server serves the policies (an
// older one stays in mode webhook), asked once a connection.
func TestTheDefaultModeFollowsWhatTheAPIServerServes(t *testing.T) {
	policies := &metav1.APIResourceList{GroupVersion: admission.PolicyGVR.GroupVersion().String(),
		APIResources: []metav1.APIResource{{Name: admission.PolicyGVR.Resource}, {Name: admission.BindingGVR.Resource}}}
	older := &metav1.APIResourceList{GroupVersion: admission.PolicyGVR.GroupVersion().String(),
		APIResources: []metav1.APIResource{{Name: "validatingwebhookconfigurations"}}}
	connect := func(served ...*metav1.APIResourceList) (*session, *k8stesting.Fake) {
		kc := k8sfake.NewClientset()
		kc.Resources = served
		return &session{core: kc.CoreV1(), auth: kc.AuthenticationV1(), disco: kc.Discovery()}, &kc.Fake
	}
	annotated := func(mode string) kube.ClusterMeta {
		return kube.ClusterMeta{Annotations: map[string]string{ModeAnnotation: mode}}
	}
	discoveries := func(f *k8stesting.Fake) int {
		n := 0
		for _, a := range f.Actions() {
			if a.GetResource().Resource == "resource" {
				n++
			}
		}
		return n
	}
	byDefault := &Reconciler{opts: Options{DefaultMode: ModeAdmissionPolicy}}
	for _, c := range []struct {
		name string
		r    *Reconciler
		meta kube.ClusterMeta
		s    []*metav1.APIResourceList
		want string
	}{
		{"served", byDefault, kube.ClusterMeta{}, []*metav1.APIResourceList{policies}, ModeAdmissionPolicy},
		{"older group version", byDefault, kube.ClusterMeta{}, []*metav1.APIResourceList{older}, ModeWebhook},
		{"no group version", byDefault, kube.ClusterMeta{}, nil, ModeWebhook},
		{"annotated webhook", byDefault, annotated(ModeWebhook), []*metav1.APIResourceList{policies}, ModeWebhook},
		{"annotated, not served", byDefault, annotated(ModeAdmissionPolicy), nil, ModeAdmissionPolicy},
		{"default webhook", &Reconciler{opts: Options{DefaultMode: ModeWebhook}}, kube.ClusterMeta{}, []*metav1.APIResourceList{policies}, ModeWebhook},
	} {
		s, fake := connect(c.s...)
		for range 2 {
			mode, err := c.r.modeOf(c.meta, s)
			require.NoError(t, err, c.name)
			assert.Equal(t, c.want, mode, c.name)
		}
		assert.LessOrEqual(t, discoveries(fake), 1, "%s: asked once a connection", c.name)
	}
	mode, err := byDefault.modeOf(kube.ClusterMeta{}, nil)
	require.NoError(t, err)
	assert.Empty(t, mode, "not known before a connection")

	s, fake := connect(policies)
	fake.PrependReactor("get", "resource", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	_, err = byDefault.modeOf(kube.ClusterMeta{}, s)
	require.Error(t, err, "not guessed when discovery fails")
	assert.Nil(t, s.served, "asked again next time")
}
