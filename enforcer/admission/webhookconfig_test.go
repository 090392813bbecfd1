package admission_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	clienttesting "k8s.io/client-go/testing"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/internal/testcluster"
	"github.com/nodeguard/nodeguard/internal/testpki"
)

var caBundle = testpki.CAPEM

func TestBuildSendsOnlyNodeDeletesAndFailsClosed(t *testing.T) {
	ca := caBundle(t)
	cfg, err := admission.BuildWebhookConfig(admission.WebhookConfigOptions{URL: "https://nodeguard.example.com:8443/", CABundle: ca, Cluster: "fleet/prod-1"})
	require.NoError(t, err)
	require.Len(t, cfg.Webhooks, 1)
	w := cfg.Webhooks[0]
	assert.Equal(t, "https://nodeguard.example.com:8443/validate/clusters/fleet/prod-1", *w.ClientConfig.URL)
	assert.Equal(t, ca, w.ClientConfig.CABundle)
	require.Len(t, w.Rules, 1)
	assert.Equal(t, []admissionregistrationv1.OperationType{admissionregistrationv1.Delete}, w.Rules[0].Operations)
	assert.Equal(t, []string{""}, w.Rules[0].APIGroups)
	assert.Equal(t, []string{"nodes"}, w.Rules[0].Resources)
	assert.Equal(t, admissionregistrationv1.Fail, *w.FailurePolicy)
	assert.LessOrEqual(t, *w.TimeoutSeconds, int32(5))
	assert.Equal(t, admissionregistrationv1.SideEffectClassNoneOnDryRun, *w.SideEffects, "Events on denials, none on a dry run")
	assert.Equal(t, []string{"v1"}, w.AdmissionReviewVersions)
	assert.Equal(t, admissionregistrationv1.Equivalent, *w.MatchPolicy)

	out, err := admission.WebhookConfigYAML(cfg)
	require.NoError(t, err)
	assert.Contains(t, string(out), "kind: ValidatingWebhookConfiguration")
	assert.Contains(t, string(out), "failurePolicy: Fail")

	self, err := admission.BuildWebhookConfig(admission.WebhookConfigOptions{Service: "nodeguard-system/nodeguard", CABundle: ca})
	require.NoError(t, err)
	assert.Nil(t, self.Webhooks[0].ClientConfig.URL)
	assert.Equal(t, "/validate", *self.Webhooks[0].ClientConfig.Service.Path)
}

func TestBuildRejectsBadOptions(t *testing.T) {
	ca := caBundle(t)
	for want, opts := range map[string]admission.WebhookConfigOptions{
		"--ca-bundle-file is required": {URL: "https://x"},
		"no PEM certificate":           {URL: "https://x", CABundle: []byte("not pem")},
		"want https://":                {URL: "http://x", CABundle: ca},
		"want NAMESPACE/NAME":          {URL: "https://x", CABundle: ca, Cluster: "prod-1"},
		"--url (or --service)":         {CABundle: ca},
		"not both":                     {URL: "https://x", Service: "a/b", CABundle: ca},
	} {
		_, err := admission.BuildWebhookConfig(opts)
		assert.ErrorContains(t, err, want)
	}
	for _, key := range []string{"prod-1", "/prod-1", "fleet/", "fleet/prod/1"} {
		_, err := admission.BuildWebhookConfig(admission.WebhookConfigOptions{URL: "https://x", CABundle: ca, Cluster: key})
		assert.ErrorContains(t, err, fmt.Sprintf("--cluster %q: want NAMESPACE/NAME", key))
		_, err = admission.BuildWebhookConfig(admission.WebhookConfigOptions{Service: key, CABundle: ca})
		assert.ErrorContains(t, err, fmt.Sprintf("--service %q: want NAMESPACE/NAME", key))
	}
}

func TestInstallIntoAWorkloadClusterThroughItsKubeconfigSecret(t *testing.T) {
	ctx := context.Background()
	cfg, err := admission.BuildWebhookConfig(admission.WebhookConfigOptions{URL: "https://nodeguard.example.com", CABundle: caBundle(t), Cluster: "fleet/prod-1"})
	require.NoError(t, err)
	mgmt := fake.NewClientset(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "fleet", Name: "prod-1-kubeconfig"},
		Data:       map[string][]byte{"value": testcluster.Kubeconfig(t, "https://prod-1.example:6443")},
	})
	self := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme())
	workload := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme())
	// The fake tracker has no server-side apply: record what is applied.
	var applied []*admissionregistrationv1.ValidatingWebhookConfiguration
	workload.PrependReactor("patch", "validatingwebhookconfigurations", func(a clienttesting.Action) (bool, runtime.Object, error) {
		patch := a.(clienttesting.PatchAction)
		assert.Equal(t, types.ApplyPatchType, patch.GetPatchType())
		var u unstructured.Unstructured
		require.NoError(t, u.UnmarshalJSON(patch.GetPatch()))
		var vwc admissionregistrationv1.ValidatingWebhookConfiguration
		require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &vwc))
		applied = append(applied, &vwc)
		return true, &u, nil
	})
	var got string
	connect := func(cfg *rest.Config) (dynamic.Interface, error) { got = cfg.Host; return workload, nil }
	install := func(cluster string) (string, error) {
		client, where, err := admission.InstallTarget(ctx, mgmt, self, cluster, connect)
		if err != nil {
			return "", err
		}
		return where, admission.ApplyWebhookConfig(ctx, client, cfg)
	}

	where, err := install("fleet/prod-1")
	require.NoError(t, err)
	assert.Equal(t, "workload cluster fleet/prod-1", where)
	assert.Equal(t, "https://prod-1.example:6443", got, "connected as the Cluster's kubeconfig says")
	require.Len(t, applied, 1)
	assert.Equal(t, *cfg.Webhooks[0].ClientConfig.URL, *applied[0].Webhooks[0].ClientConfig.URL)
	assert.Equal(t, "fleet/prod-1", applied[0].Annotations[admission.ClusterAnnotation])
	assert.Empty(t, self.Actions(), "nothing is installed into the management cluster")

	// Applying again writes the renewed CA bundle.
	cfg.Webhooks[0].ClientConfig.CABundle = caBundle(t)
	_, err = install("fleet/prod-1")
	require.NoError(t, err)
	require.Len(t, applied, 2)
	assert.Equal(t, cfg.Webhooks[0].ClientConfig.CABundle, applied[1].Webhooks[0].ClientConfig.CABundle)

	_, err = install("fleet/missing")
	assert.ErrorContains(t, err, "read the kubeconfig of Cluster fleet/missing")
}

// The webhook's settings reach the configuration, defaults as the API
// server fills them; what it would refuse is refused here.
func TestWebhookSettings(t *testing.T) {
	ca := caBundle(t)
	cfg, err := admission.BuildWebhookConfig(admission.WebhookConfigOptions{URL: "https://ng", CABundle: ca})
	require.NoError(t, err)
	w := cfg.Webhooks[0]
	assert.Equal(t, admissionregistrationv1.Fail, *w.FailurePolicy)
	assert.EqualValues(t, admission.TimeoutSeconds, *w.TimeoutSeconds)
	assert.Equal(t, &metav1.LabelSelector{}, w.ObjectSelector)
	assert.Empty(t, w.MatchConditions)

	cond := admissionregistrationv1.MatchCondition{Name: "not-ops", Expression: "request.userInfo.username != 'ops'"}
	cfg, err = admission.BuildWebhookConfig(admission.WebhookConfigOptions{URL: "https://ng", CABundle: ca, Webhook: admission.WebhookSettings{
		FailurePolicy: admissionregistrationv1.Ignore, TimeoutSeconds: 2, ObjectSelector: "tier=worker,!control-plane", MatchConditions: []admissionregistrationv1.MatchCondition{cond}}})
	require.NoError(t, err)
	w = cfg.Webhooks[0]
	assert.Equal(t, admissionregistrationv1.Ignore, *w.FailurePolicy)
	assert.EqualValues(t, 2, *w.TimeoutSeconds)
	assert.Equal(t, map[string]string{"tier": "worker"}, w.ObjectSelector.MatchLabels)
	require.Len(t, w.ObjectSelector.MatchExpressions, 1)
	assert.Equal(t, []admissionregistrationv1.MatchCondition{cond}, w.MatchConditions)

	for want, s := range map[string]admission.WebhookSettings{
		"want Fail or Ignore":                   {FailurePolicy: "Never"},
		"the API server takes 1 to 30":          {TimeoutSeconds: 31},
		"object selector":                       {ObjectSelector: "a in (b"},
		"a name and an expression are required": {MatchConditions: []admissionregistrationv1.MatchCondition{{Name: "x"}}},
	} {
		_, err := admission.BuildWebhookConfig(admission.WebhookConfigOptions{URL: "https://ng", CABundle: ca, Webhook: s})
		assert.ErrorContains(t, err, want)
	}
}

// With Registrations, a second webhook sends Node CREATEs and the UPDATEs
// that set a providerID to the registration route, failing open, with a
// short timeout, never a kubelet's status report; the delete webhook is as
// before.
func TestRegistrationsHaveAWebhookOfTheirOwnThatFailsOpen(t *testing.T) {
	ca := caBundle(t)
	plain, err := admission.BuildWebhookConfig(admission.WebhookConfigOptions{URL: "https://ng.example.com", CABundle: ca, Cluster: "fleet/prod-1"})
	require.NoError(t, err)
	cfg, err := admission.BuildWebhookConfig(admission.WebhookConfigOptions{URL: "https://ng.example.com", CABundle: ca, Cluster: "fleet/prod-1", Registrations: true,
		Webhook: admission.WebhookSettings{ObjectSelector: "pool=a"}})
	require.NoError(t, err)
	require.Len(t, cfg.Webhooks, 2)
	assert.Equal(t, plain.Webhooks[0].Name, cfg.Webhooks[0].Name)
	w := cfg.Webhooks[1]
	assert.Equal(t, admission.RegistrationWebhookName, w.Name)
	assert.Equal(t, "https://ng.example.com/register/clusters/fleet/prod-1", *w.ClientConfig.URL)
	assert.Equal(t, admissionregistrationv1.Ignore, *w.FailurePolicy)
	assert.Equal(t, int32(admission.RegistrationTimeoutSeconds), *w.TimeoutSeconds)
	assert.Equal(t, admissionregistrationv1.SideEffectClassNone, *w.SideEffects)
	require.Len(t, w.Rules, 1)
	assert.Equal(t, []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}, w.Rules[0].Operations)
	assert.Equal(t, []string{"nodes"}, w.Rules[0].Resources, "not nodes/status")
	assert.Equal(t, &metav1.LabelSelector{}, w.ObjectSelector, "every Node registering: the delete webhook's selector is about deletes")
	require.Len(t, w.MatchConditions, 1)
	assert.Equal(t, admission.RegistersCondition, w.MatchConditions[0].Expression)

	self, err := admission.BuildWebhookConfig(admission.WebhookConfigOptions{Service: "nodeguard-system/nodeguard", CABundle: ca, Registrations: true})
	require.NoError(t, err)
	assert.Equal(t, "/register", *self.Webhooks[1].ClientConfig.Service.Path)
}
