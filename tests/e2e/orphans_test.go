//go:build e2e

package e2e

import (
	"context"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	ngnodes "github.com/nodeguard/nodeguard/enforcer/nodes"
	"github.com/nodeguard/nodeguard/enforcer/serve"
	"github.com/nodeguard/nodeguard/internal/localcluster"
	"github.com/nodeguard/nodeguard/internal/testpki"
)

// reaping is the orphan configuration the e2e tests run serve with: a short
// grace, the Lease (and the tombstones) in "default" (which every API server
// has), ghost detection, and the full
// pass (the safety net) an hour away, so every orphan these tests see is
// found through the watch path: its Node's or its objects' events, and the
// end of its grace.
func reaping(grace time.Duration) serve.ReapOptions {
	return serve.ReapOptions{Enabled: true, Grace: grace, Interval: time.Hour, LeaseNamespace: "default", Ghosts: detecting()}
}

// detecting is ghost detection as serve runs it by default: every test
// that runs the orphan scan runs it too, and serveWith fails a test that
// sees a ghost it did not make on purpose.
func detecting() serve.GhostOptions { return serve.GhostOptions{Window: 24 * time.Hour} }

// watchPathSlack bounds what judging through events adds to the graces: an
// informer event, a judgment, a fresh read and a delete.
const watchPathSlack = 10 * time.Second

// nodeguardReaping runs `nodeguard serve` over the cluster of cfg with the
// orphan options reap, and points the API server's Node deletes at it, so
// the reaper's own deletes pass through nodeguard's webhook.
func nodeguardReaping(t *testing.T, cfg *rest.Config, reap serve.ReapOptions) running {
	t.Helper()
	return nodeguardWith(t, cfg, serve.Options{Orphans: reap})
}

// serveWith runs `nodeguard serve` with opts (a certificate from ca unless
// opts name one) and returns its URL and a function that stops it (also run
// at cleanup).
func serveWith(t *testing.T, clients kube.Clients, ca *testpki.CA, opts serve.Options) (string, func()) {
	t.Helper()
	if opts.CertFile == "" {
		opts.CertFile, opts.KeyFile = ca.ServerFiles(t, "nodeguard")
	}
	ghosts := &atomic.Int64{}
	log := slog.New(countGhosts{Handler: slog.NewJSONHandler(os.Stderr, nil), n: ghosts})
	url, stop, err := localcluster.Serve(context.Background(), clients, opts, log)
	require.NoError(t, err)
	t.Cleanup(stop)
	t.Cleanup(func() {
		if n := ghosts.Load(); n > 0 && !expectsGhosts(t) {
			t.Errorf("nodeguard judged %d Node(s) ghosts in a test of normal Machine lifecycles: a false ghost", n)
		}
	})
	return url, stop
}

// countGhosts counts the Nodes nodeguard first judged ghosts (its log line
// nodes.GhostLogMessage): every e2e test that runs the orphan scan runs ghost
// detection too, and none but those that say so (expectGhosts) may see one.
type countGhosts struct {
	slog.Handler
	n *atomic.Int64
}

func (c countGhosts) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == ngnodes.GhostLogMessage {
		c.n.Add(1)
	}
	return c.Handler.Handle(ctx, r)
}

func (c countGhosts) WithAttrs(attrs []slog.Attr) slog.Handler {
	return countGhosts{Handler: c.Handler.WithAttrs(attrs), n: c.n}
}

func (c countGhosts) WithGroup(name string) slog.Handler {
	return countGhosts{Handler: c.Handler.WithGroup(name), n: c.n}
}

// expectGhosts says t makes ghost Nodes on purpose; call it before serving
// (t.Setenv's restore then runs after serveWith's check).
func expectGhosts(t *testing.T) { t.Setenv(expectGhostsEnv, "true") }

const expectGhostsEnv = "NODEGUARD_E2E_EXPECT_GHOSTS"

func expectsGhosts(*testing.T) bool { return os.Getenv(expectGhostsEnv) == "true" }

// setReady sets the Node's Ready condition, as a kubelet would.
func setReady(t *testing.T, kube kubernetes.Interface, name string, status corev1.ConditionStatus) {
	t.Helper()
	ctx := context.Background()
	n, err := kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	require.NoError(t, err)
	now := metav1.Now()
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, LastHeartbeatTime: now, LastTransitionTime: now}}
	_, err = kube.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
	require.NoError(t, err)
}

// playCAPI deletes what Cluster API deletes for a Machine, InfraMachine
// first, but not the Node: the Node left behind when CAPI's one Node delete
// was denied or never made (cluster-api #14024, #7237).
func playCAPI(t *testing.T, dyn dynamic.Interface, name string) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, dyn.Resource(dockerMachine).Namespace("default").Delete(ctx, name, metav1.DeleteOptions{}))
	require.NoError(t, dyn.Resource(machines).Namespace("default").Delete(ctx, name, metav1.DeleteOptions{}))
}

// waitGone waits until Node name is gone and returns when that was seen.
func waitGone(t *testing.T, kube kubernetes.Interface, name string, within time.Duration) time.Time {
	t.Helper()
	return gone(t, "Node "+name, within, func(ctx context.Context) error {
		_, err := kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		return err
	})
}

// nodeGone says whether Node name is gone (or cannot be read): what must
// never happen to a Node that is no orphan.
func nodeGone(kube kubernetes.Interface, name string) func() bool {
	return func() bool {
		_, err := kube.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		return err != nil
	}
}

// orphanEvents lists the OrphanNodeDeleted Events recorded on Node name.
func orphanEvents(t *testing.T, kube kubernetes.Interface, name string) []string {
	t.Helper()
	list, err := kube.EventsV1().Events("").List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	var notes []string
	for _, e := range list.Items {
		if e.Reason == "OrphanNodeDeleted" && e.Regarding.Kind == "Node" && e.Regarding.Name == name {
			notes = append(notes, e.Note)
		}
	}
	return notes
}

// Orphan Nodes, self-hosted: the Node left behind is deleted once a grace
// has passed between two observations; a Ready Node whose Machine is gone
// is not.
func TestOrphanNodesAreReaped(t *testing.T) {
	cfg := apiServer(t)
	grace := 2 * time.Second
	nodeguardReaping(t, cfg, reaping(grace))
	kube, dyn := clientsFor(t, cfg)

	capdMachine(t, dyn, "control-plane-0", false) // stays: the cluster's DockerMachines show docker:// is synced
	capdMachine(t, dyn, "left-behind", false)
	capdMachine(t, dyn, "still-ready", false)
	setReady(t, kube, "control-plane-0", corev1.ConditionTrue)
	setReady(t, kube, "left-behind", corev1.ConditionUnknown)
	setReady(t, kube, "still-ready", corev1.ConditionTrue)

	playCAPI(t, dyn, "left-behind")
	playCAPI(t, dyn, "still-ready")
	gone := time.Now()
	reaped := waitGone(t, kube, "left-behind", 60*time.Second)
	t.Logf("left-behind reaped %s after its Machine and DockerMachine went (grace %s)", reaped.Sub(gone).Round(time.Millisecond), grace)
	assert.GreaterOrEqual(t, reaped.Sub(gone), grace, "two observations a grace apart")
	// NotReady since just before: an orphan once its grace ends (the watch
	// path's timer), deleted a grace later; the full pass is an hour away.
	assert.Less(t, reaped.Sub(gone), 2*grace+watchPathSlack)

	// Two graces more: the Ready Node stays all along.
	require.Never(t, nodeGone(kube, "still-ready"), 2*grace, 100*time.Millisecond, "a Ready Node is never reaped")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Len(c, orphanEvents(t, kube, "left-behind"), 1)
	}, 10*time.Second, 100*time.Millisecond, "an Event on the deleted Node")
	assert.Empty(t, orphanEvents(t, kube, "still-ready"))

	// Its kubelet stops posting: the Node's change is an event, the end of
	// its grace a timer; it goes within the two graces, not a full pass.
	notReady := time.Now()
	setReady(t, kube, "still-ready", corev1.ConditionUnknown)
	reaped = waitGone(t, kube, "still-ready", 60*time.Second)
	t.Logf("still-ready reaped %s after it went NotReady (grace %s)", reaped.Sub(notReady).Round(time.Millisecond), grace)
	assert.GreaterOrEqual(t, reaped.Sub(notReady), 2*grace-time.Second, "an orphan a grace after NotReady (second-precision times), deleted a grace later")
	assert.Less(t, reaped.Sub(notReady), 2*grace+watchPathSlack)
}

// Orphan Nodes with a linked InfraMachine are never reaped: the rule would
// deny the delete. No webhook is installed, so the reaper's own judgment is
// all that stands between the Node and its delete.
func TestOrphanNodeWithItsInfraMachineIsKept(t *testing.T) {
	cfg := apiServer(t)
	clients, err := kube.FromConfig(cfg)
	require.NoError(t, err)
	serveWith(t, clients, testpki.New(t), serve.Options{Listen: "127.0.0.1:0", Orphans: reaping(time.Second)})
	kube, dyn := clientsFor(t, cfg)
	ctx := context.Background()
	capdMachine(t, dyn, "infra-left", true)
	capdMachine(t, dyn, "reaped", false)
	setReady(t, kube, "infra-left", corev1.ConditionUnknown)
	setReady(t, kube, "reaped", corev1.ConditionUnknown)
	// The Machine goes; the DockerMachine is being deleted (its finalizer holds it).
	require.NoError(t, dyn.Resource(dockerMachine).Namespace("default").Delete(ctx, "infra-left", metav1.DeleteOptions{}))
	require.NoError(t, dyn.Resource(machines).Namespace("default").Delete(ctx, "infra-left", metav1.DeleteOptions{}))
	playCAPI(t, dyn, "reaped")
	waitGone(t, kube, "reaped", 60*time.Second)
	require.Never(t, nodeGone(kube, "infra-left"), 3*time.Second, 100*time.Millisecond,
		"a Node whose DockerMachine is still being deleted is never reaped")
}

// Orphan Nodes in the management/workload topology: Machines in the
// management cluster, Nodes in the workload cluster, reached through CAPI's
// kubeconfig Secret and scoped to that Cluster.
func TestOrphanNodesAreReapedInAWorkloadCluster(t *testing.T) {
	mgmt := apiServer(t)
	workload, workloadEnv := apiServerEnv(t)
	reap := reaping(2 * time.Second)
	reap.WorkloadClusters = true
	// The management cluster's own Nodes are not judged here: no webhook there.
	clients, err := kube.FromConfig(mgmt)
	require.NoError(t, err)
	ca := testpki.New(t)
	url, _ := serveWith(t, clients, ca, serve.Options{Listen: "127.0.0.1:0", Orphans: reap})
	_, dyn := clientsFor(t, mgmt)
	mgmtKube, err := kubernetes.NewForConfig(mgmt)
	require.NoError(t, err)
	workloadKube, err := kubernetes.NewForConfig(workload)
	require.NoError(t, err)
	ctx := context.Background()

	devCluster(t, dyn, workloadEnv, mgmtKube)
	// The workload cluster's Node deletes go to nodeguard's route for Cluster default/dev.
	caPEM, err := os.ReadFile(ca.CAFile(t))
	require.NoError(t, err)
	vwc, err := admission.BuildWebhookConfig(admission.WebhookConfigOptions{URL: url, CABundle: caPEM, Cluster: "default/dev"})
	require.NoError(t, err)
	require.NoError(t, admission.ApplyWebhookConfig(ctx, dynamic.NewForConfigOrDie(workload), vwc))

	for _, name := range []string{"control-plane-0", "left-behind", "still-ready"} {
		workloadMachine(t, dyn, mgmtKube, workloadKube, name)
	}
	setReady(t, workloadKube, "control-plane-0", corev1.ConditionTrue)
	setReady(t, workloadKube, "left-behind", corev1.ConditionUnknown)
	setReady(t, workloadKube, "still-ready", corev1.ConditionTrue)
	playCAPI(t, dyn, "left-behind")
	playCAPI(t, dyn, "still-ready")
	gone := time.Now()
	reaped := waitGone(t, workloadKube, "left-behind", 60*time.Second)
	t.Logf("workload Node left-behind reaped %s after its Machine went", reaped.Sub(gone).Round(time.Millisecond))
	// Found through the workload cluster's Node watch and the management
	// cluster's Machine events, within its grace and the reaper's: the full
	// pass is an hour away.
	assert.Less(t, reaped.Sub(gone), 2*reap.Grace+watchPathSlack)
	require.Never(t, nodeGone(workloadKube, "still-ready"), 4*time.Second, 100*time.Millisecond, "a Ready Node is never reaped")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Len(c, orphanEvents(t, workloadKube, "left-behind"), 1)
	}, 10*time.Second, 100*time.Millisecond, "the Event is recorded in the workload cluster")
}

// devCluster creates Cluster default/dev (paused: no controller acts on it)
// and, as CAPI does, its kubeconfig Secret for the API server of env.
func devCluster(t *testing.T, dyn dynamic.Interface, env *envtest.Environment, mgmt kubernetes.Interface) {
	t.Helper()
	apply(t, dyn, schema.GroupVersionResource{Group: "cluster.x-k8s.io", Version: "v1beta2", Resource: "clusters"}, map[string]any{
		"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "metadata": map[string]any{"namespace": "default", "name": "dev"},
		"spec": map[string]any{"paused": true}})
	workloadAdmin(t, context.Background(), env, mgmt, "default", "dev")
}

// workloadMachine creates what CAPD makes for one Machine of Cluster
// default/dev, its Node in the workload cluster, not the management one.
func workloadMachine(t *testing.T, dyn dynamic.Interface, mgmt, workload kubernetes.Interface, name string) {
	t.Helper()
	ctx := context.Background()
	capdMachine(t, dyn, name, false)
	require.NoError(t, mgmt.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}))
	_, err := workload.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
		Annotations: map[string]string{"cluster.x-k8s.io/cluster-name": "dev", "cluster.x-k8s.io/cluster-namespace": "default", "cluster.x-k8s.io/machine": name}},
		Spec: corev1.NodeSpec{ProviderID: "docker:////" + name}}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// workloadAdmin stores a kubeconfig for an admin of the workload cluster as
// CAPI does: Secret <name>-kubeconfig, key value, in the Cluster's namespace.
func workloadAdmin(t *testing.T, ctx context.Context, env *envtest.Environment, mgmt kubernetes.Interface, namespace, name string) {
	t.Helper()
	user, err := env.AddUser(envtest.User{Name: "kubernetes-admin", Groups: []string{"system:masters"}}, nil)
	require.NoError(t, err)
	kubeconfig, err := user.KubeConfig()
	require.NoError(t, err)
	_, err = clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	require.NoError(t, err)
	_, err = mgmt.CoreV1().Secrets(namespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name + "-kubeconfig", Labels: map[string]string{"cluster.x-k8s.io/cluster-name": name}},
		Data:       map[string][]byte{"value": kubeconfig},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
}
