// Package charts_test renders the Helm chart with the pinned helm (tools/helm)
// and checks it against the kustomize deployment in enforcer/deploy and the
// webhook configuration `nodeguard webhook-config` builds: the two install
// paths must deploy the same facts.
package charts_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/internal/testpki"
)

const namespace = "nodeguard-system"

// objects are rendered manifests by "Kind/name", and namespaced ones also
// by "Kind/name@namespace".
type objects map[string][]byte

func (o objects) decode(t *testing.T, key string, into any) {
	t.Helper()
	raw, ok := o[key]
	require.True(t, ok, "%s rendered; have %v", key, keys(o))
	require.NoError(t, yaml.UnmarshalStrict(raw, into), key)
}

func keys(o objects) []string {
	var out []string
	for k := range o {
		out = append(out, k)
	}
	return out
}

func split(t *testing.T, stream []byte) objects {
	t.Helper()
	out := objects{}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(stream), 4096)
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); err != nil {
			require.ErrorContains(t, err, "EOF")
			return out
		}
		if len(u.Object) == 0 {
			continue
		}
		raw, err := yaml.Marshal(u.Object)
		require.NoError(t, err)
		out[u.GetKind()+"/"+u.GetName()] = raw
		if ns := u.GetNamespace(); ns != "" {
			out[u.GetKind()+"/"+u.GetName()+"@"+ns] = raw // same-named objects of several namespaces
		}
	}
}

// Helm runs the pinned helm from the repository root.
func Helm(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("go", append([]string{"tool", "-modfile=tools/helm/go.mod", "helm"}, args...)...)
	cmd.Dir = ".."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "helm %v: %s", args, stderr.String())
	return out
}

func chart(t *testing.T, set ...string) objects {
	t.Helper()
	args := []string{"template", "nodeguard", "charts/nodeguard", "--namespace", namespace}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return split(t, Helm(t, args...))
}

func kustomize(t *testing.T, dir string) objects {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	require.NoError(t, err)
	raw, err := m.AsYaml()
	require.NoError(t, err)
	return split(t, raw)
}

// kustomizeAll renders enforcer/deploy with its cert-manager component and
// the other components named.
func kustomizeAll(t *testing.T, components ...string) objects {
	t.Helper()
	dir := t.TempDir()
	abs, err := filepath.Abs("../enforcer/deploy")
	require.NoError(t, err)
	rel, err := filepath.Rel(dir, abs)
	require.NoError(t, err)
	list := rel + "/components/cert-manager"
	for _, c := range components {
		list += ", " + rel + "/components/" + c
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [" + rel + "]\ncomponents: [" + list + "]\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o600))
	return kustomize(t, dir)
}

func TestChartLints(t *testing.T) {
	out := Helm(t, "lint", "--strict", "charts/nodeguard")
	assert.Contains(t, string(out), "0 chart(s) failed")
}

// Image, flags, environment, Pod security, probes, resources, RBAC,
// Service, PDB and certificate: the chart's defaults render what kustomize
// renders.
func TestChartAndKustomizeAgree(t *testing.T) {
	h, k := chart(t), kustomizeAll(t)

	var hd, kd appsv1.Deployment
	h.decode(t, "Deployment/nodeguard", &hd)
	k.decode(t, "Deployment/nodeguard", &kd)
	assert.Equal(t, kd.Namespace, hd.Namespace)
	assert.Equal(t, *kd.Spec.Replicas, *hd.Spec.Replicas)
	assert.Equal(t, kd.Spec.Selector, hd.Spec.Selector)
	assert.Equal(t, kd.Spec.MinReadySeconds, hd.Spec.MinReadySeconds)
	assert.Equal(t, kd.Spec.Strategy, hd.Spec.Strategy)
	require.NotNil(t, hd.Spec.Strategy.RollingUpdate)
	assert.Equal(t, 0, hd.Spec.Strategy.RollingUpdate.MaxUnavailable.IntValue(), "a replica is added before one goes")
	hp, kp := hd.Spec.Template.Spec, kd.Spec.Template.Spec
	assert.Equal(t, kp.TerminationGracePeriodSeconds, hp.TerminationGracePeriodSeconds)
	assert.Equal(t, kp.SecurityContext, hp.SecurityContext)
	assert.Equal(t, kp.Affinity, hp.Affinity)
	assert.Equal(t, kp.PriorityClassName, hp.PriorityClassName)
	assert.Equal(t, kp.TopologySpreadConstraints, hp.TopologySpreadConstraints)
	assert.Equal(t, kp.ServiceAccountName, hp.ServiceAccountName)
	assert.Equal(t, kp.Volumes, hp.Volumes)
	require.Len(t, hp.Containers, 1)
	hc, kc := hp.Containers[0], kp.Containers[0]
	assert.Equal(t, kc.Image, hc.Image, "one image")
	assert.ElementsMatch(t, kc.Args, hc.Args, "the same serve flags")
	assert.ElementsMatch(t, kc.Env, hc.Env)
	assert.Equal(t, kc.Ports, hc.Ports)
	assert.Equal(t, kc.Lifecycle, hc.Lifecycle)
	require.NotNil(t, hc.Lifecycle)
	assert.Equal(t, kc.ReadinessProbe, hc.ReadinessProbe)
	assert.Equal(t, kc.LivenessProbe, hc.LivenessProbe)
	assert.Equal(t, kc.Resources, hc.Resources)
	assert.Equal(t, kc.SecurityContext, hc.SecurityContext)
	assert.Equal(t, kc.VolumeMounts, hc.VolumeMounts)

	sameClusterRole(t, h, k, "nodeguard")

	var hs, ks corev1.Service
	h.decode(t, "Service/nodeguard", &hs)
	k.decode(t, "Service/nodeguard", &ks)
	assert.Equal(t, ks.Spec, hs.Spec)
	var hpdb, kpdb policyv1.PodDisruptionBudget
	h.decode(t, "PodDisruptionBudget/nodeguard", &hpdb)
	k.decode(t, "PodDisruptionBudget/nodeguard", &kpdb)
	assert.Equal(t, kpdb.Spec, hpdb.Spec)

	var hnp, knp networkingv1.NetworkPolicy
	h.decode(t, "NetworkPolicy/nodeguard", &hnp)
	k.decode(t, "NetworkPolicy/nodeguard", &knp)
	assert.Equal(t, knp.Spec, hnp.Spec, "the same NetworkPolicy")

	var hcert, kcert map[string]any
	h.decode(t, "Certificate/nodeguard", &hcert)
	k.decode(t, "Certificate/nodeguard", &kcert)
	assert.Equal(t, kcert["spec"], hcert["spec"])
	_, ok := h["ServiceAccount/nodeguard"]
	assert.True(t, ok)
}

// orphanReaper in the chart deploys what the orphan-reaper components add
// to the kustomize deployment: the flags, POD_NAMESPACE and the RBAC.
func TestChartOrphanReaperIsTheKustomizeComponents(t *testing.T) {
	for _, tc := range []struct {
		set        []string
		components []string
		roles      []string
	}{
		{[]string{"orphanReaper.enabled=true"}, []string{"orphan-reaper"},
			[]string{"ClusterRole/nodeguard-orphan-reaper", "Role/nodeguard-orphan-reaper-lease"}},
		{[]string{"orphanReaper.enabled=true", "orphanReaper.workloadClusters=true"}, []string{"orphan-reaper", "orphan-reaper-workload"},
			[]string{"ClusterRole/nodeguard-orphan-reaper", "Role/nodeguard-orphan-reaper-lease", "ClusterRole/nodeguard-orphan-reaper-workload"}},
	} {
		t.Run(strings.Join(tc.components, "+"), func(t *testing.T) {
			h, k := chart(t, tc.set...), kustomizeAll(t, tc.components...)
			var hd, kd appsv1.Deployment
			h.decode(t, "Deployment/nodeguard", &hd)
			k.decode(t, "Deployment/nodeguard", &kd)
			hc, kc := hd.Spec.Template.Spec.Containers[0], kd.Spec.Template.Spec.Containers[0]
			assert.ElementsMatch(t, kc.Args, hc.Args, "the same serve flags")
			assert.ElementsMatch(t, kc.Env, hc.Env)
			for _, name := range tc.roles {
				var hr, kr rbacv1.ClusterRole // a Role's rules decode the same way
				h.decode(t, name, &hr)
				k.decode(t, name, &kr)
				assert.Equal(t, kr.Rules, hr.Rules, name)
				assert.Equal(t, kr.Namespace, hr.Namespace, name)
			}
			for name := range h {
				if strings.Contains(name, "orphan-reaper") {
					_, ok := k[name]
					assert.True(t, ok, "the chart renders %s, kustomize does not", name)
				}
			}
		})
	}
	_, ok := chart(t)["ClusterRole/nodeguard-orphan-reaper"]
	assert.False(t, ok, "off by default")
}

// fleet in the chart deploys what the fleet component adds to the kustomize
// deployment (with cert-manager): the flags, POD_NAMESPACE, the CA
// Secret's certificate and the RBAC; with fleet.secretNamespaces the
// Secret read moves from the ClusterRole to a Role in each.
func TestChartFleetIsTheKustomizeComponent(t *testing.T) {
	h, k := chart(t, "fleet.enabled=true", "fleet.url=https://nodeguard.example.com", "fleet.allowUnauthenticatedReviews=true"), kustomizeAll(t, "fleet")
	var hd, kd appsv1.Deployment
	h.decode(t, "Deployment/nodeguard", &hd)
	k.decode(t, "Deployment/nodeguard", &kd)
	hp, kp := hd.Spec.Template.Spec, kd.Spec.Template.Spec
	assert.ElementsMatch(t, kp.Containers[0].Args, hp.Containers[0].Args, "the same serve flags")
	assert.ElementsMatch(t, kp.Containers[0].Env, hp.Containers[0].Env)
	assert.ElementsMatch(t, kp.Containers[0].VolumeMounts, hp.Containers[0].VolumeMounts)
	assert.ElementsMatch(t, kp.Volumes, hp.Volumes)
	for _, name := range []string{"ClusterRole/nodeguard-fleet", "Role/nodeguard-fleet"} {
		var hr, kr rbacv1.ClusterRole
		h.decode(t, name, &hr)
		k.decode(t, name, &kr)
		assert.Equal(t, kr.Rules, hr.Rules, name)
		assert.Equal(t, kr.Namespace, hr.Namespace, name)
	}
	for _, name := range []string{"Certificate/nodeguard-ca", "Issuer/nodeguard-ca", "Issuer/nodeguard-selfsigned"} {
		var hc, kc map[string]any
		h.decode(t, name, &hc)
		k.decode(t, name, &kc)
		assert.Equal(t, kc["spec"], hc["spec"], name)
	}

	scoped := chart(t, "fleet.enabled=true", "fleet.url=https://nodeguard.example.com", "fleet.allowUnauthenticatedReviews=true",
		"fleet.secretNamespaces={fleet-a,fleet-b}")
	var cr rbacv1.ClusterRole
	scoped.decode(t, "ClusterRole/nodeguard-fleet", &cr)
	for _, r := range cr.Rules {
		assert.NotContains(t, r.Resources, "secrets", "no cluster-wide Secret read")
	}
	for _, ns := range []string{"fleet-a", "fleet-b"} {
		var role rbacv1.Role
		scoped.decode(t, "Role/nodeguard-fleet-kubeconfigs@"+ns, &role)
		assert.Equal(t, []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}}}, role.Rules)
	}
	_, ok := chart(t)["ClusterRole/nodeguard-fleet"]
	assert.False(t, ok, "off by default")
}

// tls.clientCA makes every review route require a client certificate of
// that CA: its ConfigMap, mounted, passed as --client-ca-file.
func TestChartClientCA(t *testing.T) {
	h := chart(t, "tls.clientCA=-----BEGIN CERTIFICATE-----")
	var d appsv1.Deployment
	h.decode(t, "Deployment/nodeguard", &d)
	c := d.Spec.Template.Spec.Containers[0]
	assert.Contains(t, c.Args, "--client-ca-file=/etc/nodeguard/client-ca/ca.crt")
	assert.Contains(t, c.VolumeMounts, corev1.VolumeMount{Name: "client-ca", MountPath: "/etc/nodeguard/client-ca", ReadOnly: true})
	var cm corev1.ConfigMap
	h.decode(t, "ConfigMap/nodeguard-client-ca", &cm)
	assert.Equal(t, "-----BEGIN CERTIFICATE-----", cm.Data["ca.crt"])
	assert.NotEmpty(t, d.Spec.Template.Annotations["checksum/config"], "a new CA rolls the Pods")
	_, ok := chart(t)["ConfigMap/nodeguard-client-ca"]
	assert.False(t, ok, "off by default")
}

// fleet.clientCA makes the cluster routes alone require client
// certificates; without it (or tls.clientCA) fleet.enabled does not render.
func TestChartFleetRequiresAuthenticatedReviews(t *testing.T) {
	h := chart(t, "fleet.enabled=true", "fleet.url=https://nodeguard.example.com", "fleet.clientCA=-----BEGIN CERTIFICATE-----")
	var d appsv1.Deployment
	h.decode(t, "Deployment/nodeguard", &d)
	assert.Contains(t, d.Spec.Template.Spec.Containers[0].Args, "--cluster-routes-client-ca-file=/etc/nodeguard/cluster-client-ca/ca.crt")
	var cm corev1.ConfigMap
	h.decode(t, "ConfigMap/nodeguard-cluster-client-ca", &cm)
	assert.Equal(t, "-----BEGIN CERTIFICATE-----", cm.Data["ca.crt"])

	cmd := exec.Command("go", "tool", "-modfile=tools/helm/go.mod", "helm", "template", "nodeguard", "charts/nodeguard", "--namespace", namespace,
		"--set", "fleet.enabled=true", "--set", "fleet.url=https://nodeguard.example.com")
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "renders without a client CA")
	assert.Contains(t, string(out), "fleet.clientCertificates.caSecretName (or fleet.clientCA, or tls.clientCA) is required with fleet.enabled")
}

// fleet.clientCertificates.caSecretName has nodeguard issue each workload
// API server its own client certificate: the CA Secret mounted, the flags,
// and Secret create and patch where the kubeconfig Secrets are read; it
// authenticates the cluster routes on its own.
func TestChartFleetClientCertificates(t *testing.T) {
	for _, scope := range [][]string{nil, {"fleet.secretNamespaces={fleet-a}"}} {
		h := chart(t, append([]string{"fleet.enabled=true", "fleet.url=https://nodeguard.example.com",
			"fleet.clientCertificates.caSecretName=nodeguard-fleet-client-ca"}, scope...)...)
		var d appsv1.Deployment
		h.decode(t, "Deployment/nodeguard", &d)
		c := d.Spec.Template.Spec.Containers[0]
		assert.Contains(t, c.Args, "--fleet-client-ca-cert-file=/etc/nodeguard/fleet-client-ca/tls.crt")
		assert.Contains(t, c.Args, "--fleet-client-ca-key-file=/etc/nodeguard/fleet-client-ca/tls.key")
		assert.Contains(t, c.VolumeMounts, corev1.VolumeMount{Name: "fleet-client-ca", MountPath: "/etc/nodeguard/fleet-client-ca", ReadOnly: true})
		var rules []rbacv1.PolicyRule
		if scope == nil {
			var cr rbacv1.ClusterRole
			h.decode(t, "ClusterRole/nodeguard-fleet", &cr)
			rules = cr.Rules
		} else {
			var r rbacv1.Role
			h.decode(t, "Role/nodeguard-fleet-kubeconfigs@fleet-a", &r)
			rules = r.Rules
		}
		assert.Contains(t, rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "create", "patch"}})
	}
}

// externalData in the chart deploys what the external-data component adds
// to the kustomize deployment: the flags, the Gatekeeper CA's volume and the
// RBAC to keep the Provider.
func TestChartExternalDataIsTheKustomizeComponent(t *testing.T) {
	h, k := chart(t, "externalData.enabled=true", "webhook.enabled=false"), kustomizeAll(t, "external-data")
	var hd, kd appsv1.Deployment
	h.decode(t, "Deployment/nodeguard", &hd)
	k.decode(t, "Deployment/nodeguard", &kd)
	hp, kp := hd.Spec.Template.Spec, kd.Spec.Template.Spec
	assert.ElementsMatch(t, kp.Containers[0].Args, hp.Containers[0].Args, "the same serve flags")
	assert.Contains(t, hp.Containers[0].Args, "--externaldata-client-ca-file=/etc/nodeguard/gatekeeper-ca/ca.crt")
	assert.ElementsMatch(t, kp.Containers[0].VolumeMounts, hp.Containers[0].VolumeMounts)
	assert.ElementsMatch(t, kp.Volumes, hp.Volumes)
	var hr, kr rbacv1.ClusterRole
	h.decode(t, "ClusterRole/nodeguard-gatekeeper-provider", &hr)
	k.decode(t, "ClusterRole/nodeguard-gatekeeper-provider", &kr)
	assert.Equal(t, kr.Rules, hr.Rules)
	var hb, kb rbacv1.ClusterRoleBinding
	h.decode(t, "ClusterRoleBinding/nodeguard-gatekeeper-provider", &hb)
	k.decode(t, "ClusterRoleBinding/nodeguard-gatekeeper-provider", &kb)
	assert.Equal(t, kb.Subjects, hb.Subjects)
	assert.NotContains(t, h, "ValidatingWebhookConfiguration/nodeguard", "Gatekeeper is the admission point")
	assert.NotContains(t, h, "ConfigMap/nodeguard-gatekeeper-ca", "created by the operator unless the value holds the CA")

	h = chart(t, "externalData.enabled=true", "externalData.gatekeeperCA=PEM")
	var cm corev1.ConfigMap
	h.decode(t, "ConfigMap/nodeguard-gatekeeper-ca", &cm)
	assert.Equal(t, "PEM", cm.Data["ca.crt"])
	h.decode(t, "Deployment/nodeguard", &hd)
	assert.NotEmpty(t, hd.Spec.Template.Annotations["checksum/config"], "a new Gatekeeper CA rolls the Pods")
	assert.NotContains(t, chart(t), "ClusterRole/nodeguard-gatekeeper-provider", "off by default")
}

// The chart's webhook is the configuration `nodeguard webhook-config
// --service` builds.
func TestChartWebhookIsWhatWebhookConfigBuilds(t *testing.T) {
	ca, err := os.ReadFile(testpki.New(t).CAFile(t))
	require.NoError(t, err)
	h := chart(t, "tls.certManager.enabled=false", "tls.caBundle="+string(ca))
	var got admissionregistrationv1.ValidatingWebhookConfiguration
	h.decode(t, "ValidatingWebhookConfiguration/nodeguard", &got)
	want, err := admission.BuildWebhookConfig(admission.WebhookConfigOptions{Service: namespace + "/nodeguard", CABundle: ca})
	require.NoError(t, err)
	assert.Equal(t, want.Name, got.Name)
	assert.Equal(t, want.Webhooks, got.Webhooks)
	for _, k := range []string{"Certificate/nodeguard", "Issuer/nodeguard-selfsigned"} {
		assert.NotContains(t, h, k, "no cert-manager objects without cert-manager")
	}

	// With cert-manager, its CA injector fills the caBundle.
	h = chart(t)
	got = admissionregistrationv1.ValidatingWebhookConfiguration{}
	h.decode(t, "ValidatingWebhookConfiguration/nodeguard", &got)
	assert.Equal(t, namespace+"/nodeguard", got.Annotations["cert-manager.io/inject-ca-from"])
	assert.Empty(t, got.Webhooks[0].ClientConfig.CABundle)

	assert.NotContains(t, chart(t, "webhook.enabled=false"), "ValidatingWebhookConfiguration/nodeguard")

	// The webhook's settings, as webhook-config builds them.
	h = chart(t, "tls.certManager.enabled=false", "tls.caBundle="+string(ca), "webhook.failurePolicy=Ignore", "webhook.timeoutSeconds=3",
		"webhook.objectSelector.matchLabels.tier=worker", "webhook.matchConditions[0].name=not-ops",
		"webhook.matchConditions[0].expression=request.userInfo.username != 'ops'")
	got = admissionregistrationv1.ValidatingWebhookConfiguration{}
	h.decode(t, "ValidatingWebhookConfiguration/nodeguard", &got)
	want, err = admission.BuildWebhookConfig(admission.WebhookConfigOptions{Service: namespace + "/nodeguard", CABundle: ca, Webhook: admission.WebhookSettings{
		FailurePolicy: admissionregistrationv1.Ignore, TimeoutSeconds: 3, ObjectSelector: "tier=worker",
		MatchConditions: []admissionregistrationv1.MatchCondition{{Name: "not-ops", Expression: "request.userInfo.username != 'ops'"}}}})
	require.NoError(t, err)
	wj, _ := json.Marshal(want.Webhooks[0])
	gj, _ := json.Marshal(got.Webhooks[0])
	assert.JSONEq(t, string(wj), string(gj))

	// And the fleet's, as serve flags.
	var d appsv1.Deployment
	chart(t, "fleet.enabled=true", "fleet.url=https://nodeguard.example", "fleet.allowUnauthenticatedReviews=true", "fleet.webhook.failurePolicy=Ignore",
		"fleet.webhook.timeoutSeconds=3", "fleet.webhook.objectSelector=tier=worker", "fleet.webhook.matchConditions[0].name=a",
		"fleet.webhook.matchConditions[0].expression=1 == 1").decode(t, "Deployment/nodeguard", &d)
	args := d.Spec.Template.Spec.Containers[0].Args
	for _, a := range []string{"--fleet-webhook-failure-policy=Ignore", "--fleet-webhook-timeout-seconds=3", "--fleet-webhook-object-selector=tier=worker",
		"--fleet-webhook-match-condition=a=1 == 1"} {
		assert.Contains(t, args, a)
	}
}

func TestChartValues(t *testing.T) {
	h := chart(t,
		"image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		"constraint.parameters.exemptGroups[0]=nodeguard:break-glass",
		"flags.request-timeout=3s",
		"ports.https=9443",
		"policyBundle.configMapName=my-bundle",
		"policyBundle.verificationKey=PEM",
		"policyBundle.scope=prod",
	)
	var d appsv1.Deployment
	h.decode(t, "Deployment/nodeguard", &d)
	c := d.Spec.Template.Spec.Containers[0]
	assert.Equal(t, "ghcr.io/nodeguard/nodeguard:v0.1.0@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", c.Image)
	assert.Contains(t, c.Args, "--request-timeout=3s", "a flag is one line of values")
	assert.Contains(t, c.Args, "--listen-address=:9443", "the serve flag follows the port")
	assert.Equal(t, int32(9443), c.Ports[0].ContainerPort)
	for _, a := range []string{"--constraint=/etc/nodeguard/constraint/constraint.yaml", "--bundle=/etc/nodeguard/bundle/bundle.tar.gz",
		"--bundle-verification-key=/etc/nodeguard/bundle-key/key.pem", "--bundle-key-id=default", "--bundle-scope=prod"} {
		assert.Contains(t, c.Args, a)
	}
	assert.NotEmpty(t, d.Spec.Template.Annotations["checksum/config"])

	// The Constraint in the ConfigMap is one nodeguard reads.
	var cm corev1.ConfigMap
	h.decode(t, "ConfigMap/nodeguard-constraint", &cm)
	path := filepath.Join(t.TempDir(), "constraint.yaml")
	require.NoError(t, os.WriteFile(path, []byte(cm.Data["constraint.yaml"]), 0o600))
	params, err := facts.ConstraintParameters(path)
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"exemptGroups": []any{"nodeguard:break-glass"}}, params)
	var key corev1.ConfigMap
	h.decode(t, "ConfigMap/nodeguard-bundle-key", &key)
	assert.Equal(t, "PEM", key.Data["key.pem"])

	// A bundle without its key is refused at render time.
	cmd := exec.Command("go", "tool", "-modfile=tools/helm/go.mod", "helm", "template", "x", "charts/nodeguard", "--set", "policyBundle.configMapName=b")
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "policyBundle.verificationKey is required")
}

// The chart's monitoring values render what the kustomize components
// servicemonitor, prometheusrule and grafana-dashboard add: the same metrics
// Service and ServiceMonitor, the same rules (both generated from
// internal/monitoring) and the same dashboard.
func TestChartMonitoringIsTheKustomizeComponents(t *testing.T) {
	on := []string{"monitoring.serviceMonitor.enabled=true", "monitoring.prometheusRule.enabled=true", "monitoring.dashboard.enabled=true"}
	h, k := chart(t, on...), kustomizeAll(t, "servicemonitor", "prometheusrule", "grafana-dashboard")
	for _, name := range []string{"Service/nodeguard-metrics", "ServiceMonitor/nodeguard", "PrometheusRule/nodeguard"} {
		var hs, ks map[string]any
		h.decode(t, name, &hs)
		k.decode(t, name, &ks)
		assert.Equal(t, ks["spec"], hs["spec"], name)
		assert.Equal(t, ks["metadata"].(map[string]any)["namespace"], hs["metadata"].(map[string]any)["namespace"], name)
	}
	var hm, km corev1.ConfigMap
	h.decode(t, "ConfigMap/nodeguard-dashboard", &hm)
	k.decode(t, "ConfigMap/nodeguard-dashboard", &km)
	assert.Equal(t, km.Data, hm.Data, "one dashboard")
	assert.Equal(t, "1", hm.Labels["grafana_dashboard"], "the label Grafana's sidecar looks for")
	assert.Equal(t, "1", km.Labels["grafana_dashboard"])
	assert.JSONEq(t, hm.Data["nodeguard.json"], km.Data["nodeguard.json"])

	// The ServiceMonitor selects the metrics Service only, whose port is the
	// Pods' metrics port; the Service also lists replicas not ready.
	var svc corev1.Service
	h.decode(t, "Service/nodeguard-metrics", &svc)
	assert.True(t, svc.Spec.PublishNotReadyAddresses)
	var sm struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Metadata   map[string]any `json:"metadata"`
		Spec       struct {
			Selector  struct{ MatchLabels map[string]string } `json:"selector"`
			Endpoints []map[string]any                        `json:"endpoints"`
		} `json:"spec"`
	}
	h.decode(t, "ServiceMonitor/nodeguard", &sm)
	assert.Subset(t, svc.Labels, sm.Spec.Selector.MatchLabels)
	var web corev1.Service
	h.decode(t, "Service/nodeguard", &web)
	for k, v := range sm.Spec.Selector.MatchLabels {
		if web.Labels[k] != v {
			return // the webhook's Service is not selected
		}
	}
	t.Errorf("the ServiceMonitor selects the webhook's Service too")
}

// Off by default; thresholds and labels are values.
func TestChartMonitoringValues(t *testing.T) {
	for name := range chart(t) {
		assert.NotContains(t, []string{"Service/nodeguard-metrics", "ServiceMonitor/nodeguard", "PrometheusRule/nodeguard", "ConfigMap/nodeguard-dashboard"}, name, "off by default")
	}
	h := chart(t, "monitoring.prometheusRule.enabled=true", "monitoring.prometheusRule.thresholds.orphanNodesFor=2h",
		"monitoring.prometheusRule.labels.release=kube-prometheus-stack", "monitoring.prometheusRule.selector=job=\"ng\"",
		"monitoring.dashboard.enabled=true", "monitoring.dashboard.namespace=monitoring")
	var pr struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Metadata   metav1.ObjectMeta `json:"metadata"`
		Spec       struct {
			Groups []struct {
				Name  string `json:"name"`
				Rules []struct {
					Alert       string            `json:"alert"`
					Expr        string            `json:"expr"`
					For         string            `json:"for"`
					Labels      map[string]string `json:"labels"`
					Annotations map[string]string `json:"annotations"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	h.decode(t, "PrometheusRule/nodeguard", &pr)
	assert.Equal(t, "kube-prometheus-stack", pr.Metadata.Labels["release"])
	var found bool
	for _, r := range pr.Spec.Groups[0].Rules {
		assert.Contains(t, r.Expr, `{job="ng"`, r.Alert)
		if r.Alert == "NodeguardOrphanNodes" {
			found = true
			assert.Equal(t, "2h", r.For)
			assert.Contains(t, r.Annotations["summary"], "{{ $labels.cluster }}", "Prometheus' templates reach Prometheus")
		}
	}
	assert.True(t, found)
	var cm corev1.ConfigMap
	h.decode(t, "ConfigMap/nodeguard-dashboard", &cm)
	assert.Equal(t, "monitoring", cm.Namespace)
}

// denialEvents in the chart: on by default (Events RBAC in the server's
// role, as in enforcer/deploy); off with ghost detection off too, neither
// the rule nor the Events; with
// workloadClusters, what the denial-events-workload component adds.
func TestChartDenialEvents(t *testing.T) {
	events := rbacv1.PolicyRule{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}}
	var role rbacv1.ClusterRole
	chart(t).decode(t, "ClusterRole/nodeguard", &role)
	assert.Contains(t, role.Rules, events)

	role = rbacv1.ClusterRole{}
	chart(t, "denialEvents.enabled=false").decode(t, "ClusterRole/nodeguard", &role)
	assert.Contains(t, role.Rules, events, "GhostNode Events still")
	h := chart(t, "denialEvents.enabled=false", "ghosts.window=0s")
	role = rbacv1.ClusterRole{}
	h.decode(t, "ClusterRole/nodeguard", &role)
	assert.NotContains(t, role.Rules, events)
	var d appsv1.Deployment
	h.decode(t, "Deployment/nodeguard", &d)
	assert.Contains(t, d.Spec.Template.Spec.Containers[0].Args, "--denial-events=false")

	h, k := chart(t, "denialEvents.workloadClusters=true"), kustomizeAll(t, "denial-events-workload")
	var hd, kd appsv1.Deployment
	h.decode(t, "Deployment/nodeguard", &hd)
	k.decode(t, "Deployment/nodeguard", &kd)
	assert.ElementsMatch(t, kd.Spec.Template.Spec.Containers[0].Args, hd.Spec.Template.Spec.Containers[0].Args)
	assert.Contains(t, hd.Spec.Template.Spec.Containers[0].Args, "--denial-events-workload-clusters")
	sameClusterRole(t, h, k, "nodeguard-denial-events-workload")
}

// sameClusterRole checks that the chart (h) and kustomize (k) grant the same
// through the ClusterRole name and its binding.
func sameClusterRole(t *testing.T, h, k objects, name string) {
	t.Helper()
	var hr, kr rbacv1.ClusterRole
	h.decode(t, "ClusterRole/"+name, &hr)
	k.decode(t, "ClusterRole/"+name, &kr)
	assert.Equal(t, kr.Rules, hr.Rules, "the same RBAC")
	var hb, kb rbacv1.ClusterRoleBinding
	h.decode(t, "ClusterRoleBinding/"+name, &hb)
	k.decode(t, "ClusterRoleBinding/"+name, &kb)
	assert.Equal(t, kb.RoleRef, hb.RoleRef)
	assert.Equal(t, kb.Subjects, hb.Subjects)
}

// The enforcement actions are the serve flags, left out at their default.
func TestChartEnforcementActions(t *testing.T) {
	args := func(values ...string) []string {
		var d appsv1.Deployment
		chart(t, values...).decode(t, "Deployment/nodeguard", &d)
		return d.Spec.Template.Spec.Containers[0].Args
	}
	for _, a := range args() {
		assert.NotContains(t, a, "enforcement-action")
		assert.NotContains(t, a, "admission-policy-action")
	}
	assert.Contains(t, args("enforcementAction=warn"), "--enforcement-action=warn")
	fleet := []string{"fleet.enabled=true", "fleet.url=https://nodeguard.example", "fleet.allowUnauthenticatedReviews=true"}
	assert.Contains(t, args(append(fleet, "fleet.admissionPolicyAction=dryrun")...), "--fleet-admission-policy-action=dryrun")
	// Mode admission-policy is the default, where the workload API server
	// serves it: no flag says so.
	for _, a := range args(fleet...) {
		assert.NotContains(t, a, "admission-policy")
		assert.NotContains(t, a, "default-mode")
	}
	assert.Contains(t, args(append(fleet, "fleet.admissionPolicy=false")...), "--fleet-admission-policy=false")
	assert.Contains(t, args(append(fleet, "fleet.defaultMode=webhook")...), "--fleet-default-mode=webhook")
}

// The schema refuses what would otherwise be ignored or crash the Pod.
func TestChartSchemaRejectsTypos(t *testing.T) {
	for set, want := range map[string]string{
		"replica=3":                 "additional properties 'replica' not allowed",
		"enforcementAction=warnn":   "value must be one of 'deny', 'warn', 'dryrun'",
		"fleet.proofInterval=5 min": "fleet/proofInterval",
		"orphanReaper.enable=true":  "additional properties 'enable' not allowed",
		"replicas=0":                "minimum",
	} {
		cmd := exec.Command("go", "tool", "-modfile=tools/helm/go.mod", "helm", "template", "nodeguard", "charts/nodeguard", "--set", set)
		cmd.Dir = ".."
		out, err := cmd.CombinedOutput()
		require.Error(t, err, "--set %s renders", set)
		assert.Contains(t, string(out), want, set)
	}
	chart(t, "flags.request-timeout=3s", "env.FOO=bar") // free-form maps stay free
}

// With one replica no PDB is rendered: minAvailable 1 would block drains.
func TestChartPDBOnlyWithReplicas(t *testing.T) {
	_, ok := chart(t)["PodDisruptionBudget/nodeguard"]
	assert.True(t, ok)
	_, ok = chart(t, "replicas=1")["PodDisruptionBudget/nodeguard"]
	assert.False(t, ok)
}

// The Pod values render where they belong.
func TestChartPodValues(t *testing.T) {
	var d appsv1.Deployment
	chart(t, "podAnnotations.team=infra", "podLabels.tier=control", "imagePullSecrets[0].name=regcred", "extraArgs[0]=--shutdown-grace=20s",
		"extraVolumes[0].name=ca", "extraVolumes[0].secret.secretName=my-ca", "extraVolumeMounts[0].name=ca", "extraVolumeMounts[0].mountPath=/etc/my-ca",
		"priorityClassName=").decode(t, "Deployment/nodeguard", &d)
	p := d.Spec.Template
	assert.Equal(t, "infra", p.Annotations["team"])
	assert.Equal(t, "control", p.Labels["tier"])
	assert.Equal(t, "nodeguard", p.Labels["app.kubernetes.io/name"], "the chart's labels stay")
	assert.Equal(t, "regcred", p.Spec.ImagePullSecrets[0].Name)
	assert.Contains(t, p.Spec.Containers[0].Args, "--shutdown-grace=20s")
	assert.Equal(t, "my-ca", p.Spec.Volumes[len(p.Spec.Volumes)-1].Secret.SecretName)
	assert.Equal(t, "/etc/my-ca", p.Spec.Containers[0].VolumeMounts[len(p.Spec.Containers[0].VolumeMounts)-1].MountPath)
	assert.Empty(t, p.Spec.PriorityClassName, "an empty priorityClassName leaves it out")
}

// helm uninstall runs `nodeguard cleanup` first when nodeguard writes
// outside the chart (fleet, external data), with only the rights it needs.
func TestChartCleanupHook(t *testing.T) {
	fleetOn := []string{"fleet.enabled=true", "fleet.url=https://nodeguard.example.com", "fleet.allowUnauthenticatedReviews=true"}
	h := chart(t, fleetOn...)
	var job batchv1.Job
	h.decode(t, "Job/nodeguard-cleanup", &job)
	assert.Equal(t, "pre-delete", job.Annotations["helm.sh/hook"])
	for _, key := range []string{"Job/nodeguard-cleanup", "ServiceAccount/nodeguard-cleanup", "Role/nodeguard-cleanup", "RoleBinding/nodeguard-cleanup"} {
		_, ok := h[key+"@"+namespace]
		assert.True(t, ok, "%s in the release's namespace", key)
	}
	c := job.Spec.Template.Spec.Containers[0]
	assert.Equal(t, []string{"cleanup", "--namespace=" + namespace, "--deployment=nodeguard"}, c.Args)
	assert.Equal(t, "nodeguard-cleanup", job.Spec.Template.Spec.ServiceAccountName)
	var cr rbacv1.ClusterRole
	h.decode(t, "ClusterRole/nodeguard-cleanup", &cr)
	assert.Equal(t, "-5", cr.Annotations["helm.sh/hook-weight"], "its rights exist before the Job runs")
	var secrets bool
	for _, r := range cr.Rules {
		secrets = secrets || slices.Contains(r.Resources, "secrets")
	}
	assert.True(t, secrets, "the kubeconfig Secrets, as the fleet reads them")

	scoped := chart(t, append(fleetOn, "fleet.secretNamespaces={fleet-a}")...)
	scoped.decode(t, "ClusterRole/nodeguard-cleanup", &cr)
	for _, r := range cr.Rules {
		assert.NotContains(t, r.Resources, "secrets", "no cluster-wide Secret read")
	}
	var rb rbacv1.RoleBinding
	scoped.decode(t, "RoleBinding/nodeguard-cleanup-kubeconfigs@fleet-a", &rb)
	assert.Equal(t, "nodeguard-fleet-kubeconfigs", rb.RoleRef.Name)

	_, ok := chart(t)["Job/nodeguard-cleanup"]
	assert.False(t, ok, "nothing to clean without the fleet or external data")
	_, ok = chart(t, append(fleetOn, "cleanup.enabled=false")...)["Job/nodeguard-cleanup"]
	assert.False(t, ok, "cleanup.enabled=false")
	_, ok = chart(t, "externalData.enabled=true")["Job/nodeguard-cleanup"]
	assert.True(t, ok, "Gatekeeper's Provider is nodeguard's to remove")
}

// ghosts in the chart: detection on by default, with its Role for the
// tombstones' ConfigMap (as enforcer/deploy); protection taint grants Node
// update, deny adds the registration webhook webhook-config builds; a window
// of 0s, or the orphan scan off, turns it all off.
func TestChartGhosts(t *testing.T) {
	h, k := chart(t), kustomizeAll(t)
	for _, o := range []objects{h, k} {
		var role rbacv1.Role
		o.decode(t, "Role/nodeguard-tombstones", &role)
		assert.Contains(t, role.Rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"},
			ResourceNames: []string{"nodeguard-tombstones"}, Verbs: []string{"get", "list", "watch", "patch", "update"}})
		var b rbacv1.RoleBinding
		o.decode(t, "RoleBinding/nodeguard-tombstones", &b)
		assert.Equal(t, "nodeguard", b.Subjects[0].Name)
	}
	update := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"update"}}
	var role rbacv1.ClusterRole
	h.decode(t, "ClusterRole/nodeguard", &role)
	assert.NotContains(t, role.Rules, update)

	taint := chart(t, "ghosts.protection=taint", "ghosts.window=6h", "ghosts.tombstonesMax=500")
	role = rbacv1.ClusterRole{}
	taint.decode(t, "ClusterRole/nodeguard", &role)
	assert.Contains(t, role.Rules, update)
	var d appsv1.Deployment
	taint.decode(t, "Deployment/nodeguard", &d)
	args := d.Spec.Template.Spec.Containers[0].Args
	for _, a := range []string{"--ghost-window=6h", "--ghost-tombstones-max=500", "--ghost-protection=taint"} {
		assert.Contains(t, args, a)
	}

	ca, err := os.ReadFile(testpki.New(t).CAFile(t))
	require.NoError(t, err)
	var got admissionregistrationv1.ValidatingWebhookConfiguration
	chart(t, "tls.certManager.enabled=false", "tls.caBundle="+string(ca), "ghosts.protection=deny").decode(t, "ValidatingWebhookConfiguration/nodeguard", &got)
	want, err := admission.BuildWebhookConfig(admission.WebhookConfigOptions{Service: namespace + "/nodeguard", CABundle: ca, Registrations: true})
	require.NoError(t, err)
	wj, _ := json.Marshal(want.Webhooks)
	gj, _ := json.Marshal(got.Webhooks)
	assert.JSONEq(t, string(wj), string(gj), "the registration webhook, as webhook-config --ghost-registrations builds it")

	for _, off := range [][]string{{"ghosts.window=0s", "ghosts.protection=deny"}, {"flags.orphan-scan-interval=0", "ghosts.protection=deny"}} {
		o := chart(t, off...)
		_, ok := o["Role/nodeguard-tombstones"]
		assert.False(t, ok, off)
		got = admissionregistrationv1.ValidatingWebhookConfiguration{}
		o.decode(t, "ValidatingWebhookConfiguration/nodeguard", &got)
		assert.Len(t, got.Webhooks, 1, off)
	}
}

// Decision logs in the chart: the flags, and a ConfigMap holding an OPA
// configuration and a mask that nodeguard starts its decision log with.
func TestChartDecisionLogs(t *testing.T) {
	h := chart(t, "decisionLogs.console=true",
		"decisionLogs.config.services.audit.url=https://audit.example.com",
		"decisionLogs.config.decision_logs.service=audit",
		"decisionLogs.config.decision_logs.reporting.buffer_type=event",
		"decisionLogs.mask=package system.log\n\nmask contains \"/input/inventory\"\n")
	var d appsv1.Deployment
	h.decode(t, "Deployment/nodeguard", &d)
	c := d.Spec.Template.Spec.Containers[0]
	for _, a := range []string{"--decision-log-console", "--decision-log-config=/etc/nodeguard/decision-logs/opa.yaml",
		"--decision-log-mask=/etc/nodeguard/decision-logs/mask.rego"} {
		assert.Contains(t, c.Args, a)
	}
	assert.Contains(t, c.VolumeMounts, corev1.VolumeMount{Name: "decision-logs", MountPath: "/etc/nodeguard/decision-logs", ReadOnly: true})
	var cm corev1.ConfigMap
	h.decode(t, "ConfigMap/nodeguard-decision-logs", &cm)
	dlog, err := rule.StartDecisionLog(context.Background(), rule.DecisionLogOptions{Config: []byte(cm.Data["opa.yaml"]), Mask: cm.Data["mask.rego"]})
	require.NoError(t, err, "nodeguard takes what the chart wrote:\n%s", cm.Data["opa.yaml"])
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	dlog.Stop(ctx)

	off := chart(t)
	off.decode(t, "Deployment/nodeguard", &d)
	for _, a := range d.Spec.Template.Spec.Containers[0].Args {
		assert.NotContains(t, a, "--decision-log", "off by default")
	}
	assert.NotContains(t, keys(off), "ConfigMap/nodeguard-decision-logs")
}

// fleet.watchFilter makes a release one shard of a fleet: serve and its
// cleanup scoped to the value, the fleet's Leases its own, and every object
// two shards' releases would share named for the shard, so releases in two
// namespaces install side by side; the CRD comes with one of them.
func TestChartShards(t *testing.T) {
	shard := func(value string, more ...string) objects {
		return chart(t, append([]string{"fleet.enabled=true", "fleet.url=https://" + value + ".example.com", "fleet.allowUnauthenticatedReviews=true",
			"fleet.watchFilter=" + value, "webhook.enabled=false", "fleet.secretNamespaces={fleet-x}"}, more...)...)
	}
	a, b := shard("a"), shard("b", "fleet.clusterGuardCRD=false")
	var d appsv1.Deployment
	a.decode(t, "Deployment/nodeguard", &d)
	assert.Contains(t, d.Spec.Template.Spec.Containers[0].Args, "--watch-filter=a")
	var job batchv1.Job
	a.decode(t, "Job/nodeguard-cleanup", &job)
	assert.Contains(t, job.Spec.Template.Spec.Containers[0].Args, "--watch-filter=a", "uninstalling a shard cleans only its Clusters")
	var role rbacv1.Role
	a.decode(t, "Role/nodeguard-fleet", &role)
	assert.Contains(t, role.Rules[len(role.Rules)-1].ResourceNames, "nodeguard-fleet-a", "the shard's own Lease")
	shared := func(o objects) []string {
		var out []string
		for _, k := range keys(o) {
			if strings.HasPrefix(k, "ClusterRole") || strings.HasPrefix(k, "CustomResourceDefinition") || strings.HasSuffix(k, "@fleet-x") {
				out = append(out, k)
			}
		}
		return out
	}
	sa, sb := shared(a), shared(b)
	assert.NotEmpty(t, sa)
	for _, k := range sa {
		assert.NotContains(t, sb, k, "two shards' releases both render %s", k)
	}
	assert.Contains(t, sa, "CustomResourceDefinition/clusterguards.nodeguard.io")
	var crb rbacv1.ClusterRoleBinding
	a.decode(t, "ClusterRoleBinding/nodeguard-fleet-a", &crb)
	assert.Equal(t, "nodeguard-fleet-a", crb.RoleRef.Name)

	_, unsharded := chart(t, "fleet.enabled=true", "fleet.url=https://x.example.com", "fleet.allowUnauthenticatedReviews=true")["ClusterRole/nodeguard-fleet"]
	assert.True(t, unsharded, "no watch filter: the names as before")

	cmd := exec.Command("go", "tool", "-modfile=tools/helm/go.mod", "helm", "template", "nodeguard", "charts/nodeguard", "--set", "fleet.enabled=true",
		"--set", "fleet.url=https://a.example.com", "--set", "fleet.allowUnauthenticatedReviews=true", "--set", "fleet.watchFilter=a")
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "a shard with the management webhook renders")
	assert.Contains(t, string(out), "set webhook.enabled=false")
}
