// Package deploy_test renders the kustomize deployment of nodeguard serve and
// checks what an operator relies on: it fails safe and holds least privilege.
package deploy_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/resmap"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/nodeguard/nodeguard/enforcer/rule"
)

func render(t *testing.T, dir string) resmap.ResMap {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	require.NoError(t, err)
	return m
}

// renderWith renders the deployment with the components named.
func renderWith(t *testing.T, components ...string) resmap.ResMap {
	t.Helper()
	dir := t.TempDir()
	abs, err := filepath.Abs(".")
	require.NoError(t, err)
	rel, err := filepath.Rel(dir, abs)
	require.NoError(t, err)
	list := make([]string, len(components))
	for i, c := range components {
		list[i] = rel + "/components/" + c
	}
	kustomization := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [" + rel + "]\n" +
		"components: [" + strings.Join(list, ", ") + "]\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kustomization), 0o600))
	return render(t, dir)
}

func decode[T any](t *testing.T, m resmap.ResMap, kind, name string) *T {
	t.Helper()
	for _, r := range m.Resources() {
		if r.GetKind() == kind && r.GetName() == name {
			raw, err := r.AsYAML()
			require.NoError(t, err)
			var out T
			require.NoError(t, yaml.UnmarshalStrict(raw, &out))
			return &out
		}
	}
	t.Fatalf("%s %s not rendered", kind, name)
	return nil
}

func TestDeploymentIsHardenedAndAvailable(t *testing.T) {
	m := render(t, ".")
	d := decode[appsv1.Deployment](t, m, "Deployment", "nodeguard")
	assert.Equal(t, "nodeguard-system", d.Namespace)
	assert.EqualValues(t, 2, *d.Spec.Replicas)
	pod := d.Spec.Template.Spec
	require.NotNil(t, pod.Affinity.PodAntiAffinity)
	assert.True(t, *pod.SecurityContext.RunAsNonRoot)
	require.Len(t, pod.Containers, 1)
	c := pod.Containers[0]
	assert.Equal(t, "ghcr.io/nodeguard/nodeguard:v0.1.0", c.Image)
	assert.True(t, *c.SecurityContext.ReadOnlyRootFilesystem)
	assert.False(t, *c.SecurityContext.AllowPrivilegeEscalation)
	assert.False(t, c.Resources.Requests.Memory().IsZero())
	assert.False(t, c.Resources.Limits.Memory().IsZero())
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	assert.Equal(t, "400", env["GOGC"])
	// Go writes 400MiB where a Kubernetes quantity writes 400Mi.
	memLimit, err := resource.ParseQuantity(strings.TrimSuffix(env["GOMEMLIMIT"], "B"))
	require.NoError(t, err, "GOMEMLIMIT")
	assert.Negative(t, memLimit.Cmp(*c.Resources.Limits.Memory()), "GOMEMLIMIT stays below the container's memory limit")
	assert.Equal(t, "/readyz", c.ReadinessProbe.HTTPGet.Path)
	// Probes and metrics are not on the review port (a NetworkPolicy opens
	// only that one to the API server), and the args say which ports.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	assert.Equal(t, map[string]int32{"https": 8443, "metrics": 8080, "probes": 8081}, ports)
	for _, probe := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
		assert.Equal(t, "probes", probe.HTTPGet.Port.String())
		assert.Empty(t, probe.HTTPGet.Scheme, "the probe port serves plain HTTP")
	}
	assert.Contains(t, c.Args, "--metrics-bind-address=:8080")
	assert.Contains(t, c.Args, "--health-probe-bind-address=:8081")
	assert.Contains(t, c.Args, "--listen-address=:8443")
	assert.Contains(t, c.Args, "serve")
	assert.Contains(t, c.Args, "--tls-cert-file=/etc/nodeguard/tls/tls.crt")

	types := map[string]bool{}
	for _, r := range m.Resources() {
		types[r.GetKind()] = true
	}
	for _, k := range []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service", "PodDisruptionBudget", "NetworkPolicy"} {
		assert.True(t, types[k], "%s rendered", k)
	}
}

// The NetworkPolicy selects nodeguard's Pods and opens the review port and,
// to labelled namespaces only, the metrics port; nothing else.
func TestNetworkPolicyOpensOnlyTheReviewPort(t *testing.T) {
	m := render(t, ".")
	np := decode[networkingv1.NetworkPolicy](t, m, "NetworkPolicy", "nodeguard")
	d := decode[appsv1.Deployment](t, m, "Deployment", "nodeguard")
	assert.Equal(t, d.Spec.Template.Labels, np.Spec.PodSelector.MatchLabels)
	assert.Equal(t, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}, np.Spec.PolicyTypes)
	open := map[string][]networkingv1.NetworkPolicyPeer{}
	for _, rule := range np.Spec.Ingress {
		for _, p := range rule.Ports {
			open[p.Port.String()] = rule.From
		}
	}
	assert.Len(t, open, 2, "review and metrics ports only")
	assert.Contains(t, open, "https")
	require.Len(t, open["metrics"], 1)
	assert.Equal(t, map[string]string{"nodeguard.io/scrape-metrics": "true"}, open["metrics"][0].NamespaceSelector.MatchLabels)
	assert.Nil(t, open["metrics"][0].IPBlock)
}

// The server's role reads, writes only Events (NodeDeleteDenied), never
// touches Secrets, and covers every default InfraMachine and pool kind of the
// rule.
func TestServerRoleIsLeastPrivilege(t *testing.T) {
	role := decode[rbacv1.ClusterRole](t, render(t, "."), "ClusterRole", "nodeguard")
	granted := map[string]bool{}
	events := rbacv1.PolicyRule{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}}
	assert.Contains(t, role.Rules, events, "denial Events")
	for _, rule := range role.Rules {
		if reflect.DeepEqual(rule, events) {
			continue
		}
		assert.ElementsMatch(t, []string{"get", "list", "watch"}, rule.Verbs)
		for _, g := range rule.APIGroups {
			for _, r := range rule.Resources {
				assert.NotEqual(t, "*", r)
				assert.NotEqual(t, "secrets", r)
				granted[g+"/"+r] = true
			}
		}
	}
	eval, err := rule.NewEngine(context.Background())
	require.NoError(t, err)
	defaults := eval.DefaultParameters()
	for _, key := range []string{"infraMachineKinds", "infraMachinePoolKinds"} {
		for _, k := range defaults[key].([]any) {
			kind := k.(map[string]any)
			resource := kind["group"].(string) + "/" + strings.ToLower(kind["kind"].(string)) + "s"
			assert.True(t, granted[resource], "the role must let serve watch %s", resource)
		}
	}
	assert.True(t, granted["cluster.x-k8s.io/machines"])
	assert.True(t, granted["apiextensions.k8s.io/customresourcedefinitions"])
}

func TestOptionalComponents(t *testing.T) {
	m := renderWith(t, "cert-manager", "installer", "constraint")
	cert := decode[map[string]any](t, m, "Certificate", "nodeguard")
	spec := (*cert)["spec"].(map[string]any)
	assert.Equal(t, "nodeguard-tls", spec["secretName"])
	assert.Contains(t, spec["dnsNames"], "nodeguard.nodeguard-system.svc")
	d := decode[appsv1.Deployment](t, m, "Deployment", "nodeguard")
	assert.Contains(t, d.Spec.Template.Spec.Containers[0].Args, "--constraint=/etc/nodeguard/constraint/constraint.yaml")
	assert.Equal(t, "nodeguard-constraint", d.Spec.Template.Spec.Volumes[1].ConfigMap.Name)
	installer := decode[rbacv1.ClusterRole](t, m, "ClusterRole", "nodeguard-installer")
	assert.Equal(t, []string{"secrets"}, installer.Rules[0].Resources)
	assert.Equal(t, []string{"get"}, installer.Rules[0].Verbs)
}

func TestOrphanReaperComponents(t *testing.T) {
	m := renderWith(t, "orphan-reaper", "orphan-reaper-workload")
	d := decode[appsv1.Deployment](t, m, "Deployment", "nodeguard")
	c := d.Spec.Template.Spec.Containers[0]
	assert.Contains(t, c.Args, "--reap-orphan-nodes")
	assert.Contains(t, c.Args, "--reap-workload-clusters")
	var podNamespace bool
	for _, e := range c.Env {
		podNamespace = podNamespace || (e.Name == "POD_NAMESPACE" && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace")
	}
	assert.True(t, podNamespace, "the Lease lives in the pod's namespace")
	reap := decode[rbacv1.ClusterRole](t, m, "ClusterRole", "nodeguard-orphan-reaper")
	assert.Equal(t, []string{"nodes"}, reap.Rules[0].Resources)
	assert.Equal(t, []string{"delete"}, reap.Rules[0].Verbs)
	lease := decode[rbacv1.Role](t, m, "Role", "nodeguard-orphan-reaper-lease")
	assert.Equal(t, "nodeguard-system", lease.Namespace)
	assert.Equal(t, []string{"leases"}, lease.Rules[0].Resources)
	workload := decode[rbacv1.ClusterRole](t, m, "ClusterRole", "nodeguard-orphan-reaper-workload")
	assert.Equal(t, []string{"secrets"}, workload.Rules[0].Resources)
	assert.Equal(t, []string{"get"}, workload.Rules[0].Verbs)

	// Without the components, serve can list Nodes (the gauge) but not delete them.
	base := decode[rbacv1.ClusterRole](t, render(t, "."), "ClusterRole", "nodeguard")
	assert.Equal(t, []string{"nodes"}, base.Rules[0].Resources)
	assert.ElementsMatch(t, []string{"get", "list", "watch"}, base.Rules[0].Verbs)
}

// The monitoring components render a ServiceMonitor for a metrics Service on
// the Pods' metrics port, the PrometheusRule and the dashboard ConfigMap, all
// in nodeguard's namespace; denial-events-workload adds its flag and the
// Secret read it needs.
func TestMonitoringAndDenialEventsComponents(t *testing.T) {
	m := renderWith(t, "servicemonitor", "prometheusrule", "grafana-dashboard", "denial-events-workload")
	svc := decode[corev1.Service](t, m, "Service", "nodeguard-metrics")
	d := decode[appsv1.Deployment](t, m, "Deployment", "nodeguard")
	c := d.Spec.Template.Spec.Containers[0]
	assert.Equal(t, "metrics", svc.Spec.Ports[0].TargetPort.String())
	assert.Contains(t, c.Args, fmt.Sprintf("--metrics-bind-address=:%d", svc.Spec.Ports[0].Port))
	assert.Equal(t, d.Spec.Selector.MatchLabels, svc.Spec.Selector)
	assert.Contains(t, c.Args, "--denial-events-workload-clusters")
	workload := decode[rbacv1.ClusterRole](t, m, "ClusterRole", "nodeguard-denial-events-workload")
	assert.Equal(t, []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}}}, workload.Rules)
	for _, r := range m.Resources() {
		switch r.GetKind() {
		case "ServiceMonitor", "PrometheusRule", "ConfigMap", "Service":
			assert.Equal(t, "nodeguard-system", r.GetNamespace(), "%s %s", r.GetKind(), r.GetName())
		}
	}
	sm := decode[map[string]any](t, m, "ServiceMonitor", "nodeguard")
	spec := (*sm)["spec"].(map[string]any)
	assert.Equal(t, map[string]any{"app.kubernetes.io/name": "nodeguard", "app.kubernetes.io/component": "metrics"},
		spec["selector"].(map[string]any)["matchLabels"])
	assert.Equal(t, "metrics", spec["endpoints"].([]any)[0].(map[string]any)["port"])
	cm := decode[corev1.ConfigMap](t, m, "ConfigMap", "nodeguard-dashboard")
	assert.Equal(t, "1", cm.Labels["grafana_dashboard"])
	assert.Contains(t, cm.Data["nodeguard.json"], `"uid": "nodeguard"`)
	decode[map[string]any](t, m, "PrometheusRule", "nodeguard")
}
