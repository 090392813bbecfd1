//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/fleet"
	ngkube "github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/enforcer/serve"
	"github.com/nodeguard/nodeguard/internal/localcluster"
	"github.com/nodeguard/nodeguard/internal/testpki"
)

// nodeguardBin is the nodeguard binary, built once per test run.
var nodeguardBin = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "nodeguard-e2e-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "nodeguard")
	if out, err := exec.Command("go", "build", "-o", bin, "../../enforcer/cmd/nodeguard").CombinedOutput(); err != nil {
		return "", fmt.Errorf("build nodeguard: %v: %s", err, out)
	}
	return bin, nil
})

// replica is one `nodeguard serve` process, as a Deployment's Pod runs it.
type replica struct {
	name             string
	cmd              *exec.Cmd
	metrics, probes  string
	log              string
	exited           chan struct{}
	exitErr          error
	signalled, ended time.Time
}

// startReplica runs `nodeguard serve` with args against the cluster of
// kubeconfig (in namespace default), and waits until it is ready.
func startReplica(t *testing.T, name, kubeconfig string, args ...string) *replica {
	t.Helper()
	bin, err := nodeguardBin()
	require.NoError(t, err)
	r := &replica{name: name, metrics: fmt.Sprintf("127.0.0.1:%d", freePort(t)), probes: fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		exited: make(chan struct{})}
	r.cmd = exec.Command(bin, append([]string{"serve", "--kubeconfig", kubeconfig, "--constraint-name=",
		"--metrics-bind-address", r.metrics, "--health-probe-bind-address", r.probes}, args...)...)
	r.cmd.Env = append(os.Environ(), "POD_NAMESPACE=default", "GOGC=400", "GOMEMLIMIT=400MiB")
	r.log = keepLog(t, "nodeguard-"+name, &r.cmd.Stdout, &r.cmd.Stderr)
	require.NoError(t, r.cmd.Start())
	go func() {
		r.exitErr = r.cmd.Wait()
		r.ended = time.Now()
		close(r.exited)
	}()
	t.Cleanup(func() {
		_ = r.cmd.Process.Kill()
		<-r.exited
	})
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + r.probes + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 60*time.Second, 100*time.Millisecond, "nodeguard %s never became ready", name)
	return r
}

// terminate sends SIGTERM, as the kubelet does once a Pod's preStop hook
// ran.
func (r *replica) terminate(t *testing.T) {
	t.Helper()
	r.signalled = time.Now()
	require.NoError(t, r.cmd.Process.Signal(syscall.SIGTERM))
}

// logged says whether the replica's log has a line with msg.
func (r *replica) logged(msg string) bool {
	b, _ := os.ReadFile(r.log)
	return bytes.Contains(b, []byte(`"msg":"`+msg+`"`))
}

// metric is the value of a series of the replica's /metrics whose name and
// labels are given ("name{a=\"b\",...}" prefix match on the labels given).
func (r *replica) metric(c require.TestingT, name string, labels ...string) (float64, bool) {
	resp, err := http.Get("http://" + r.metrics + "/metrics")
	require.NoError(c, err)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		all := true
		for _, l := range labels {
			all = all && strings.Contains(line, l)
		}
		if all {
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			require.NoError(c, err, line)
			return v, true
		}
	}
	return 0, false
}

// clusterMachine is a Machine and DockerMachine of Cluster cluster in the
// management cluster, and their Node in the workload cluster, as CAPI and
// CAPD leave them.
func clusterMachine(t *testing.T, dyn dynamic.Interface, workload kubernetes.Interface, cluster, name string) {
	t.Helper()
	ctx := context.Background()
	pid := "docker:////" + name
	labels := map[string]any{"cluster.x-k8s.io/cluster-name": cluster}
	apply(t, dyn, dockerMachine, map[string]any{"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "DockerMachine",
		"metadata": map[string]any{"namespace": "default", "name": name, "labels": labels}, "spec": map[string]any{"providerID": pid}})
	apply(t, dyn, current.GVR("cluster.x-k8s.io", "machines"), map[string]any{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
		"metadata": map[string]any{"namespace": "default", "name": name, "labels": labels},
		"spec": map[string]any{"clusterName": cluster, "providerID": pid, "bootstrap": map[string]any{"dataSecretName": name + "-bootstrap"},
			"infrastructureRef": map[string]any{"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": name}},
		"status": map[string]any{"nodeRef": map[string]any{"name": name}}})
	_, err := workload.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
		Annotations: map[string]string{"cluster.x-k8s.io/cluster-name": cluster, "cluster.x-k8s.io/cluster-namespace": "default", "cluster.x-k8s.io/machine": name}},
		Spec: corev1.NodeSpec{ProviderID: pid}}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// writeCluster writes a Cluster as CAPI does, with annotations.
func writeCluster(t *testing.T, dyn dynamic.Interface, name string, annotations map[string]any) {
	t.Helper()
	apply(t, dyn, clustersGVR, map[string]any{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
		"metadata": map[string]any{"namespace": "default", "name": name, "annotations": annotations}, "spec": map[string]any{"paused": true}})
}

// annotate sets (or, with value nil, removes) an annotation of a Cluster.
func annotate(t *testing.T, dyn dynamic.Interface, cluster, key string, value any) {
	t.Helper()
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{key: value}}})
	require.NoError(t, err)
	_, err = dyn.Resource(clustersGVR).Namespace("default").Patch(context.Background(), cluster, types.MergePatchType, patch, metav1.PatchOptions{})
	require.NoError(t, err)
}

// unguardedEvents are the WorkloadClusterUnguarded Events on Cluster name,
// by message.
func unguardedEvents(c require.TestingT, kube kubernetes.Interface, name string) []string {
	list, err := kube.EventsV1().Events("default").List(context.Background(), metav1.ListOptions{})
	require.NoError(c, err)
	var out []string
	for _, e := range list.Items {
		if e.Reason == serve.EventUnguarded && e.Regarding.Kind == "Cluster" && e.Regarding.Name == name {
			out = append(out, e.Note)
		}
	}
	return out
}

// fleetStates are the States `nodeguard clusters` reads, by Cluster key.
func fleetStates(c require.TestingT, clients ngkube.Clients) map[string]fleet.State {
	list, err := fleet.List(context.Background(), clients)
	require.NoError(c, err)
	out := map[string]fleet.State{}
	for _, s := range list {
		out[s.Cluster] = s
	}
	return out
}

// The fleet's status tells the truth, with `nodeguard serve` as its own
// process at the default proof interval, a management and two workload
// kube-apiservers, each presenting the webhook client certificate nodeguard
// issued for its own Cluster: installed in either mode, a cluster is reported
// guarded with no unguarded report or Event on the way; a route refuses
// another Cluster's certificate; an enforcement action of dryrun is reported
// within 10 s; leaving mode admission-policy denies no released Node; a
// stopped workload API server is reported unreachable within 30 s, and
// guarded again within 30 s of its return.
func TestTheFleetTellsTheTruth(t *testing.T) {
	info := mustInfo(t)
	mgmt, mgmtEnv := apiServerEnv(t)
	mgmtKube, dyn := clientsFor(t, mgmt)
	clients, err := ngkube.FromConfig(mgmt)
	require.NoError(t, err)
	ctx := context.Background()
	serving, clientCA := testpki.New(t), testpki.New(t)
	cert, key := serving.ServerFiles(t, "nodeguard")
	listen := "127.0.0.1:" + strconv.Itoa(freePort(t))
	ng := startReplica(t, "a", adminKubeconfig(t, mgmtEnv), "--listen-address", listen, "--tls-cert-file", cert, "--tls-private-key-file", key,
		"--fleet", "--fleet-url", "https://"+listen, "--fleet-ca-file", serving.CAFile(t), "--fleet-namespace", "default",
		"--fleet-client-ca-cert-file", clientCA.CAFile(t), "--fleet-client-ca-key-file", clientCA.KeyFile(t))

	// The Clusters come first, as CAPI writes them before their control
	// planes boot: each is issued its webhook client certificate, which
	// its API server reads when it starts.
	// two names no mode: the default's, admission-policy, its API server
	// serving ValidatingAdmissionPolicy v1.
	writeCluster(t, dyn, "dev", map[string]any{fleet.ModeAnnotation: fleet.ModeWebhook})
	writeCluster(t, dyn, "two", nil)
	issued := map[string][]byte{}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		for _, name := range []string{"dev", "two"} {
			s, err := mgmtKube.CoreV1().Secrets("default").Get(ctx, name+"-nodeguard-webhook-client", metav1.GetOptions{})
			require.NoError(c, err)
			issued[name] = s.Data["value"]
			assert.Equal(c, name, s.OwnerReferences[0].Name, "owned by its Cluster")
		}
	}, 30*time.Second, 100*time.Millisecond, "each Cluster's webhook client certificate issued")
	kc, err := clientcmd.Load(issued["dev"])
	require.NoError(t, err)
	require.Contains(t, kc.AuthInfos, listen, "the user is named for the webhook's host:port, as the API server looks it up")
	w1, w1Env := apiServerWith(t, current, func(env *envtest.Environment) {
		require.NoError(t, localcluster.AuthenticateToWebhooksWith(env, t.TempDir(), issued["dev"]))
	})
	w2, w2Env := apiServerWith(t, current, func(env *envtest.Environment) {
		require.NoError(t, localcluster.AuthenticateToWebhooksWith(env, t.TempDir(), issued["two"]))
	})
	kube1, _ := clientsFor(t, w1)
	kube2, _ := clientsFor(t, w2)
	for _, k := range []kubernetes.Interface{kube1, kube2} {
		_, err := k.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "free"}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	clusterMachine(t, dyn, kube1, "dev", "dev-md-0")
	clusterMachine(t, dyn, kube2, "two", "two-md-0")
	secretsAt := time.Now()
	workloadAdmin(t, ctx, w1Env, mgmtKube, "default", "dev")
	workloadAdmin(t, ctx, w2Env, mgmtKube, "default", "two")

	t.Run("installed in either mode, a cluster is reported guarded with no unguarded report on the way", func(t *testing.T) {
		var mu sync.Mutex
		seen := map[string][]string{} // every reason read, in order
		sample := func(ctx context.Context) {
			list, err := fleet.List(ctx, clients)
			if err != nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, s := range list {
				r := s.Reason
				if s.Guarded {
					r = "guarded"
				}
				if n := len(seen[s.Cluster]); n == 0 || seen[s.Cluster][n-1] != r {
					seen[s.Cluster] = append(seen[s.Cluster], r)
				}
			}
		}
		watchCtx, stopWatching := context.WithCancel(ctx)
		defer stopWatching()
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			for watchCtx.Err() == nil {
				sample(watchCtx)
				time.Sleep(20 * time.Millisecond) // time under test: the pace of the status reads
			}
		}()
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			s := fleetStates(c, clients)
			assert.True(c, s["default/dev"].Guarded, "dev: %+v", s["default/dev"])
			assert.True(c, s["default/two"].Guarded, "two: %+v", s["default/two"])
			assert.Equal(c, fleet.ModeAdmissionPolicy, s["default/two"].Mode, "two names no mode: the default where the policies are served")
		}, 60*time.Second, 100*time.Millisecond)
		t.Logf("guarded and proven %s after the kubeconfig Secrets appeared (dev in mode webhook, two in mode admission-policy)",
			time.Since(secretsAt).Round(100*time.Millisecond))
		stopWatching()
		<-watched
		sample(ctx) // the last state too, whatever the pace caught
		mu.Lock()
		defer mu.Unlock()
		for _, key := range []string{"default/dev", "default/two"} {
			// Before its kubeconfig Secret exists a Cluster is reported so (true:
			// nothing can be installed); from then on, nothing but guarded.
			reports := dropLeading(dropLeading(seen[key], fleet.ReasonNotReported)[1:], fleet.ReasonNoKubeconfig)[1:]
			assert.Equal(t, []string{"guarded"}, reports, "%s's reports once its kubeconfig Secret was there: %q", key, seen[key])
			for _, e := range unguardedEvents(t, mgmtKube, strings.TrimPrefix(key, "default/")) {
				assert.Contains(t, e, "("+fleet.ReasonNoKubeconfig+")", "%s: no WorkloadClusterUnguarded Event but the missing Secret's", key)
			}
		}
		_, err := kube2.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, admission.Name, metav1.GetOptions{})
		assert.True(t, apierrors.IsNotFound(err), "mode admission-policy installs no webhook: %v", err)
		err = kube1.CoreV1().Nodes().Delete(ctx, "dev-md-0", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "DockerMachine default/dev-md-0", "judged on dev's route, reached with dev's certificate")
	})

	t.Run("a route refuses the certificate issued for another Cluster", func(t *testing.T) {
		kc, err := clientcmd.Load(issued["dev"])
		require.NoError(t, err)
		user := kc.AuthInfos[listen]
		pair, err := tls.X509KeyPair(user.ClientCertificateData, user.ClientKeyData)
		require.NoError(t, err)
		client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
			RootCAs: serving.Pool(), Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}}}
		post := func(route string) (int, string) {
			resp, err := client.Post("https://"+listen+route, "application/json", strings.NewReader(`{}`))
			require.NoError(t, err)
			defer resp.Body.Close()
			var body bytes.Buffer
			_, _ = body.ReadFrom(resp.Body)
			return resp.StatusCode, body.String()
		}
		code, body := post("/validate/clusters/default/two")
		assert.Equal(t, http.StatusUnauthorized, code, body)
		assert.Contains(t, body, "was not issued for Cluster default/two")
		code, body = post("/validate/clusters/default/dev")
		assert.Equal(t, http.StatusBadRequest, code, "its own route takes it (and finds no review in {}): %s", body)
		n, ok := ng.metric(t, "nodeguard_rejected_requests_total", `reason="`+admission.RejectWrongCluster+`"`)
		assert.True(t, ok)
		assert.Equal(t, 1.0, n, "counted")
	})

	t.Run("an enforcement action of dryrun is reported within 10 s, in either mode", func(t *testing.T) {
		annotate(t, dyn, "dev", rule.ActionAnnotation, "dryrun")
		annotate(t, dyn, "two", rule.ActionAnnotation, "dryrun")
		at := time.Now()
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			s := fleetStates(c, clients)
			for _, key := range []string{"default/dev", "default/two"} {
				assert.False(c, s[key].Guarded, key)
				assert.Equal(c, fleet.ReasonDryRun, s[key].Reason, "%s: %+v", key, s[key])
			}
		}, 10*time.Second, 100*time.Millisecond)
		t.Logf("dryrun reported %s after the annotations", time.Since(at).Round(100*time.Millisecond))
		require.NoError(t, dryRunDelete(ctx, kube2, "two-md-0"), "the binding only audits now")
		annotate(t, dyn, "dev", rule.ActionAnnotation, nil)
		annotate(t, dyn, "two", rule.ActionAnnotation, nil)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			s := fleetStates(c, clients)
			assert.True(c, s["default/dev"].Guarded, "%+v", s["default/dev"])
			assert.True(c, s["default/two"].Guarded, "%+v", s["default/two"])
		}, 10*time.Second, 100*time.Millisecond, "deny again")
	})

	t.Run("leaving mode admission-policy denies no released Node", func(t *testing.T) {
		require.EventuallyWithT(t, func(c *assert.CollectT) { assert.NoError(c, dryRunDelete(ctx, kube2, "free")) },
			10*time.Second, 50*time.Millisecond, "free is released")
		stream := streamDeletes(ctx, kube2, "free", 50*time.Millisecond)
		eventsBefore := len(unguardedEvents(t, mgmtKube, "two"))
		annotate(t, dyn, "two", fleet.ModeAnnotation, fleet.ModeWebhook)
		switched := time.Now()
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			s := fleetStates(c, clients)["default/two"]
			assert.True(c, s.Guarded && s.Mode == fleet.ModeWebhook, "%+v", s)
			for _, name := range []string{info.Name, info.Guard} {
				_, err := kube2.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, name, metav1.GetOptions{})
				assert.True(c, apierrors.IsNotFound(err), "binding %s removed: %v", name, err)
				_, err = kube2.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{})
				assert.True(c, apierrors.IsNotFound(err), "policy %s removed: %v", name, err)
			}
		}, 60*time.Second, 100*time.Millisecond)
		took := time.Since(switched)
		tries, denied, first := stream.finish(t, 20) // some more on the webhook alone
		assert.Zero(t, denied, "dry-run deletes of a released Node denied during the switch (first: %s)", first)
		t.Logf("admission-policy -> webhook in %s: %d dry-run deletes of a released Node, %d denied", took.Round(100*time.Millisecond), tries, denied)
		assert.Len(t, unguardedEvents(t, mgmtKube, "two"), eventsBefore, "no WorkloadClusterUnguarded Event on the way")
		err := kube2.CoreV1().Nodes().Delete(ctx, "two-md-0", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "DockerMachine default/two-md-0", "judged on two's route now")
	})

	t.Run("a stopped workload API server is reported unreachable within 30 s, and guarded within 30 s of its return", func(t *testing.T) {
		api := w1Env.ControlPlane.APIServer
		stopped := time.Now()
		require.NoError(t, api.Stop())
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.Equal(c, fleet.ReasonUnreachable, fleetStates(c, clients)["default/dev"].Reason, "nodeguard clusters")
			v, ok := ng.metric(c, "nodeguard_workload_cluster_unguarded_reason", `cluster_name="dev"`, `reason="unreachable"`)
			assert.True(c, ok && v == 1, "the metric")
			events := unguardedEvents(c, mgmtKube, "dev")
			assert.True(c, len(events) > 0 && strings.Contains(events[len(events)-1], "("+fleet.ReasonUnreachable+")"), "the Event: %q", events)
		}, 30*time.Second, 100*time.Millisecond)
		t.Logf("a stopped workload API server reported unreachable (nodeguard clusters, metric, Event) %s after its stop began",
			time.Since(stopped).Round(100*time.Millisecond))
		back := time.Now()
		require.NoError(t, api.Start())
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.True(c, fleetStates(c, clients)["default/dev"].Guarded, "nodeguard clusters")
			v, ok := ng.metric(c, "nodeguard_workload_cluster_guarded", `cluster_name="dev"`)
			assert.True(c, ok && v == 1, "the metric")
		}, 30*time.Second, 100*time.Millisecond)
		t.Logf("guarded and proven again %s after it was started again (it serves ~3-4 s after start)", time.Since(back).Round(100*time.Millisecond))
		err := kube1.CoreV1().Nodes().Delete(ctx, "dev-md-0", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "DockerMachine default/dev-md-0")
	})
}

// dropLeading is reasons without the leading run of r, then r once in front
// (a Cluster not reported yet may be read as such any number of times).
func dropLeading(reasons []string, r string) []string {
	for len(reasons) > 0 && reasons[0] == r {
		reasons = reasons[1:]
	}
	return append([]string{r}, reasons...)
}

// minReady is the chart's minReadySeconds: a new replica, ready (its
// management caches synced), is given that long to connect to the workload
// clusters and judge their Nodes before the rollout terminates an old one.
const minReady = 5 * time.Second

// leaderIdentity is the identity a replica campaigns for the fleet's Lease
// with, from its log ("" before it led).
func (r *replica) leaderIdentity() string {
	b, _ := os.ReadFile(r.log)
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.Contains(line, `"msg":"fleet: leading"`) {
			continue
		}
		var l struct{ Identity string }
		if json.Unmarshal([]byte(line), &l) == nil {
			return l.Identity
		}
	}
	return ""
}

// A rolling update of both replicas of `nodeguard serve`, as its own
// processes (the chart's 2 replicas, maxSurge 1, maxUnavailable 0): each old
// replica, SIGTERMed, gives the fleet's Lease up before it exits, and the
// next leader leads within 2 s; a Node whose InfraMachine goes at that very
// moment is released in the workload cluster (mode admission-policy) within
// 3 s, inside Cluster API's 10 s Node-delete window.
func TestTheFleetHandsOverInsideCAPIsWindow(t *testing.T) {
	mgmt, mgmtEnv := apiServerEnv(t)
	w, wEnv := apiServerEnv(t)
	mgmtKube, dyn := clientsFor(t, mgmt)
	kube, _ := clientsFor(t, w)
	clients, err := ngkube.FromConfig(mgmt)
	require.NoError(t, err)
	ctx := context.Background()
	writeCluster(t, dyn, "dev", map[string]any{fleet.ModeAnnotation: fleet.ModeAdmissionPolicy})
	for _, name := range []string{"dev-md-0-a", "dev-md-0-b", "dev-md-0-c"} {
		clusterMachine(t, dyn, kube, "dev", name)
	}
	workloadAdmin(t, ctx, wEnv, mgmtKube, "default", "dev")
	kubeconfig := adminKubeconfig(t, mgmtEnv)
	serving := testpki.New(t)
	fleetURL := "https://127.0.0.1:" + strconv.Itoa(freePort(t)) // the workload API server never calls it in this mode
	replicaArgs := func(name string) []string {
		cert, key := serving.ServerFiles(t, name)
		return []string{"--listen-address", "127.0.0.1:" + strconv.Itoa(freePort(t)), "--tls-cert-file", cert, "--tls-private-key-file", key,
			"--fleet", "--fleet-url", fleetURL, "--fleet-ca-file", serving.CAFile(t), "--fleet-namespace", "default", "--fleet-admission-policy"}
	}
	old := []*replica{startReplica(t, "a", kubeconfig, replicaArgs("a")...), startReplica(t, "b", kubeconfig, replicaArgs("b")...)}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.True(c, fleetStates(c, clients)["default/dev"].Guarded)
	}, 60*time.Second, 100*time.Millisecond)
	holder := func() string {
		l, err := mgmtKube.CoordinationV1().Leases("default").Get(ctx, "nodeguard-fleet", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	released := func(node string) bool { return dryRunDelete(ctx, kube, node) == nil }
	for _, name := range []string{"dev-md-0-a", "dev-md-0-b"} {
		require.False(t, released(name), "%s is linked to its DockerMachine", name)
	}

	step := func(next string, node string) {
		// The rollout starts a new replica and, once it is ready and its
		// minReadySeconds passed, terminates an old one: the leader first.
		startReplica(t, next, kubeconfig, replicaArgs(next)...)
		time.Sleep(minReady) // time under test: the chart's minReadySeconds
		before := holder()
		require.NotEmpty(t, before)
		going := old[0]
		if len(old) > 1 && old[1].leaderIdentity() == before {
			going = old[1]
		}
		led := going.leaderIdentity() == before
		old = slices.DeleteFunc(old, func(r *replica) bool { return r == going })

		// The InfraMachine goes as the replica is told to stop.
		require.NoError(t, dyn.Resource(dockerMachine).Namespace("default").Delete(ctx, node, metav1.DeleteOptions{}))
		going.terminate(t)
		var handover, release time.Duration
		require.Eventually(t, func() bool {
			if h := holder(); led && handover == 0 && h != "" && h != before {
				handover = time.Since(going.signalled)
			}
			if release == 0 && released(node) {
				release = time.Since(going.signalled)
			}
			return (handover > 0 || !led) && release > 0
		}, 30*time.Second, 10*time.Millisecond)
		select {
		case <-going.exited:
		case <-time.After(30 * time.Second):
			t.Fatalf("replica %s did not exit after SIGTERM", going.name)
		}
		assert.NoError(t, going.exitErr, "replica %s exits 0", going.name)
		t.Logf("replica %s (leader: %v) SIGTERMed: exited after %s; new leader after %s; Node %s released after %s",
			going.name, led, going.ended.Sub(going.signalled).Round(time.Millisecond), handover.Round(time.Millisecond), node, release.Round(time.Millisecond))
		if led {
			assert.LessOrEqual(t, handover, 2*time.Second, "the next replica leads within 2 s")
			assert.True(t, going.logged("fleet: not leading"), "the old leader gave the Lease up")
		}
		assert.LessOrEqual(t, release, 3*time.Second, "released within 3 s of the InfraMachine going")
	}
	step("c", "dev-md-0-a")
	step("d", "dev-md-0-b")
	assert.False(t, released("dev-md-0-c"), "the Node whose DockerMachine stays stays denied")
}
