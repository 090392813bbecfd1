//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/serve"
	"github.com/nodeguard/nodeguard/internal/localcluster"
	"github.com/nodeguard/nodeguard/internal/testpki"
)

var externalConstraintGVR = schema.GroupVersionResource{Group: "constraints.gatekeeper.sh", Version: "v1beta1", Resource: "k8snodeguardexternal"}

// providerDenial is how Gatekeeper denies while nodeguard gives no facts.
const providerDenial = `nodeguard's external data provider "nodeguard" did not give the objects linked to it`

// provider is a `nodeguard serve` that answers Gatekeeper's external data
// (a client certificate of gatekeeperCA), with no webhook of its own.
type provider struct {
	url   string
	ca    *testpki.CA
	caPEM []byte
	opts  serve.Options
	stop  func()
}

// nodeguardProvider runs `nodeguard serve` over cfg's cluster as Gatekeeper's
// external data provider only. With keep, it keeps Gatekeeper's Provider in
// its own cluster pointing at itself (--gatekeeper-provider-url), as the
// chart's external-data install does, and runs with no more rights than the
// kustomize deployment with its external-data component grants.
func nodeguardProvider(t *testing.T, cfg *rest.Config, gatekeeperCA string, keep bool) *provider {
	t.Helper()
	if keep {
		cfg = asDeployed(t, cfg, "external-data")
	}
	clients, err := kube.FromConfig(cfg)
	require.NoError(t, err)
	// The Provider's URL must be known before nodeguard listens.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	p := &provider{url: "https://" + addr, ca: testpki.New(t)}
	p.caPEM, err = os.ReadFile(p.ca.CAFile(t))
	require.NoError(t, err)
	p.opts = serve.Options{Listen: addr, ExternalDataClientCAFile: gatekeeperCA}
	if keep {
		p.opts.GatekeeperProvider = serve.ProviderOptions{URL: p.url, CAFile: p.ca.CAFile(t)}
	}
	_, p.stop = serveWith(t, clients, p.ca, p.opts)
	return p
}

// restart runs it again on the same address, with the same certificate
// authority.
func (p *provider) restart(t *testing.T, cfg *rest.Config) {
	t.Helper()
	clients, err := kube.FromConfig(cfg)
	require.NoError(t, err)
	_, p.stop = serveWith(t, clients, p.ca, p.opts)
}

// Gatekeeper with the K8sNodeGuardExternal template, asking nodeguard (which
// keeps the Provider): what the sync-based template cannot hold (TestGatekeeper)
// holds. An InfraMachine being deleted still blocks; nodeguard down means
// denied, naming the provider; only Gatekeeper's certificate is answered.
func TestGatekeeperAsksNodeguard(t *testing.T) {
	cfg, env := apiServerEnv(t)
	kube, dyn := clientsFor(t, cfg)
	ctx := context.Background()
	gk := gatekeeper(t, env, kube, "constraints/external-data")
	ng := nodeguardProvider(t, cfg, gk.CAFile, true)
	capdMachine(t, dyn, "dev-md-0-abcde", true)

	// nodeguard wrote the Provider Gatekeeper calls: its URL and its CA.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		p, err := dyn.Resource(admission.ProviderGVR).Get(ctx, "nodeguard", metav1.GetOptions{})
		require.NoError(c, err)
		url, _, _ := unstructured.NestedString(p.Object, "spec", "url")
		ca, _, _ := unstructured.NestedString(p.Object, "spec", "caBundle")
		assert.Equal(c, ng.url+"/externaldata", url)
		assert.Equal(c, base64.StdEncoding.EncodeToString(ng.caPEM), ca)
	}, 30*time.Second, 200*time.Millisecond, "nodeguard keeps the Provider")

	dryRun := func(name string) error { return dryRunDelete(ctx, kube, name) }
	start := time.Now()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		err := dryRun("dev-md-0-abcde")
		require.Error(c, err)
		assert.Contains(c, err.Error(), `admission webhook "validation.gatekeeper.sh" denied the request: [node-deletion-guard]`)
		assert.Contains(c, err.Error(), "DockerMachine default/dev-md-0-abcde")
	}, 60*time.Second, 250*time.Millisecond, "Gatekeeper must deny on nodeguard's facts")
	t.Logf("Gatekeeper denies on nodeguard's facts %s after the Provider was there: %v", time.Since(start).Round(time.Millisecond), dryRun("dev-md-0-abcde"))

	// The teardown window: the DockerMachine is being deleted (its
	// finalizer holds it). Gatekeeper's sync forgets it (TestGatekeeper
	// allows here); nodeguard's fresh facts still hold it, every time.
	require.NoError(t, dyn.Resource(dockerMachine).Namespace("default").Delete(ctx, "dev-md-0-abcde", metav1.DeleteOptions{}))
	for range 10 {
		err := dryRun("dev-md-0-abcde")
		require.Error(t, err, "the DockerMachine still exists, being deleted")
		require.Contains(t, err.Error(), "DockerMachine default/dev-md-0-abcde (infrastructure.cluster.x-k8s.io) is being deleted but still exists")
		time.Sleep(300 * time.Millisecond) // time under test: the denial holds ten times over 3 s of the teardown
	}
	t.Logf("Gatekeeper with nodeguard denies while the DockerMachine is being deleted: %v", dryRun("dev-md-0-abcde"))

	// Only Gatekeeper's client certificate is answered.
	anonymous := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: ng.ca.Pool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13}}}
	resp, err := anonymous.Post(ng.url+"/externaldata", "application/json",
		strings.NewReader(`{"apiVersion":"externaldata.gatekeeper.sh/v1beta1","kind":"ProviderRequest","request":{"keys":["x"]}}`))
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "a client without Gatekeeper's certificate")

	// nodeguard down: Gatekeeper denies, naming the provider.
	ng.stop()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		err := dryRun("dev-md-0-abcde")
		require.Error(c, err)
		assert.Contains(c, err.Error(), providerDenial)
	}, 30*time.Second, 250*time.Millisecond, "without nodeguard, Gatekeeper denies naming the provider")
	t.Logf("nodeguard down, Gatekeeper denies: %v", dryRun("dev-md-0-abcde"))

	// Back, and the DockerMachine gone: the delete goes through.
	ng.restart(t, cfg)
	dm, err := dyn.Resource(dockerMachine).Namespace("default").Get(ctx, "dev-md-0-abcde", metav1.GetOptions{})
	require.NoError(t, err)
	dm.SetFinalizers(nil)
	_, err = dyn.Resource(dockerMachine).Namespace("default").Update(ctx, dm, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.NoError(c, kube.CoreV1().Nodes().Delete(ctx, "dev-md-0-abcde", metav1.DeleteOptions{}))
	}, 30*time.Second, 250*time.Millisecond, "once nodeguard is back and the DockerMachine gone, the Node may go")

	// Gatekeeper's audit never asks nodeguard (no operation) and finds
	// nothing in the Nodes that remain.
	capdMachine(t, dyn, "linked-b", false)
	auditFindsNothing(t, dyn, externalConstraintGVR)

	// A rollout on this route is the Constraint's enforcementAction, which
	// Gatekeeper applies to the verdict it reaches on nodeguard's facts:
	// warn admits with the denial as Gatekeeper's warning, dryrun silently.
	seen := &warnings{}
	wc := rest.CopyConfig(cfg)
	wc.WarningHandlerWithContext = seen
	warned, err := kubernetes.NewForConfig(wc)
	require.NoError(t, err)
	for _, action := range []string{"warn", "dryrun"} {
		_, err := dyn.Resource(externalConstraintGVR).Patch(ctx, "node-deletion-guard", types.MergePatchType,
			[]byte(`{"spec":{"enforcementAction":"`+action+`"}}`), metav1.PatchOptions{})
		require.NoError(t, err)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			seen.take()
			require.NoError(c, dryRunDelete(ctx, warned, "linked-b"))
			w := strings.Join(seen.take(), "\n")
			if action == "warn" {
				assert.Contains(c, w, "[node-deletion-guard]")
				assert.Contains(c, w, "DockerMachine default/linked-b")
			} else {
				assert.Empty(c, w)
			}
		}, 60*time.Second, 250*time.Millisecond, "enforcementAction %s", action)
		t.Logf("K8sNodeGuardExternal with enforcementAction %s: the blocked delete is admitted", action)
	}
}

// Real CAPI in a management cluster, Gatekeeper in the workload cluster with
// the K8sNodeGuardExternal template, asking the management cluster's nodeguard
// on the Provider `nodeguard webhook-config --gatekeeper-provider --cluster
// --apply` installs through CAPI's kubeconfig Secret: CAPI's order completes,
// a third party's Node delete while CAPI waits for the DockerMachine is
// denied through Gatekeeper, and CAPI's own Node delete goes through within
// its window once the DockerMachine is gone.
func TestCAPIWithGatekeeperAskingNodeguard(t *testing.T) {
	mgmtCfg, mgmtEnv := apiServerEnv(t)
	workloadCfg, workloadEnv := apiServerEnv(t)
	workloadKube, _ := clientsFor(t, workloadCfg)
	mgmtKube, _ := clientsFor(t, mgmtCfg)
	gk := gatekeeper(t, workloadEnv, workloadKube, "constraints/external-data")
	ng := nodeguardProvider(t, mgmtCfg, gk.CAFile, false)
	c := startCAPI(t, mgmtEnv, workloadEnv)
	installProvider(t, mgmtKube, ng, "default/dev")

	name := "dev-md-0-abcde"
	c.machine(t, name, localcluster.MachineOptions{})
	ctx := context.Background()
	require.EventuallyWithT(t, func(col *assert.CollectT) {
		err := dryRunDelete(ctx, workloadKube, name)
		require.Error(col, err)
		assert.Contains(col, err.Error(), `admission webhook "validation.gatekeeper.sh" denied the request: [node-deletion-guard]`)
		assert.Contains(col, err.Error(), "DockerMachine default/"+name)
	}, 60*time.Second, 250*time.Millisecond, "the workload cluster's Gatekeeper must deny on the management cluster's facts")
	c.deletesInOrder(t, name, `admission webhook "validation.gatekeeper.sh" denied the request: [node-deletion-guard]`, 10*time.Second)
}

// asDeployed applies the RBAC of enforcer/deploy with the named components
// (nothing runs its Deployment here) and returns cfg acting as the
// ServiceAccount it binds.
func asDeployed(t *testing.T, cfg *rest.Config, components ...string) *rest.Config {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	abs, err := filepath.Abs("../../enforcer/deploy")
	require.NoError(t, err)
	rel, err := filepath.Rel(dir, abs) // kustomize takes relative paths only
	require.NoError(t, err)
	var list []string
	for _, c := range components {
		list = append(list, filepath.Join(rel, "components", c))
	}
	k := "resources: [" + rel + "]\ncomponents: [" + strings.Join(list, ", ") + "]\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o600))
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	require.NoError(t, err)
	clients, err := kube.FromConfig(cfg)
	require.NoError(t, err)
	for _, r := range m.Resources() {
		if kind := r.GetKind(); kind != "Namespace" && kind != "ServiceAccount" && !strings.HasPrefix(r.GetApiVersion(), "rbac.") {
			continue
		}
		obj, err := r.Map()
		require.NoError(t, err)
		u := &unstructured.Unstructured{Object: obj}
		mapping, err := clients.Mapper.RESTMapping(u.GroupVersionKind().GroupKind(), u.GroupVersionKind().Version)
		require.NoError(t, err)
		_, err = clients.Dynamic.Resource(mapping.Resource).Namespace(u.GetNamespace()).Create(ctx, u, metav1.CreateOptions{})
		require.NoError(t, err, "%s %s", u.GetKind(), u.GetName())
	}
	sa := rest.CopyConfig(cfg)
	sa.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:nodeguard-system:nodeguard"}
	return sa
}

// installProvider writes the Provider for cluster into its workload cluster
// through the management cluster's kubeconfig Secret, as `nodeguard
// webhook-config --gatekeeper-provider --cluster NS/NAME --apply` does.
func installProvider(t *testing.T, mgmt kubernetes.Interface, ng *provider, cluster string) {
	t.Helper()
	p, err := admission.BuildProvider("nodeguard", admission.WebhookConfigOptions{URL: ng.url, CABundle: ng.caPEM, Cluster: cluster})
	require.NoError(t, err)
	client, where := target(t, mgmt, nil, cluster)
	require.NoError(t, admission.ApplyProvider(context.Background(), client, p))
	require.Equal(t, "workload cluster "+cluster, where)
}
