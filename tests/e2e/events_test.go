//go:build e2e

package e2e

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/events"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/serve"
	"github.com/nodeguard/nodeguard/internal/testpki"
)

// denialEvents lists the NodeDeleteDenied Events regarding the object of
// kind and name, in every namespace.
func denialEvents(t require.TestingT, kube kubernetes.Interface, kind, name string) []eventsv1.Event {
	list, err := kube.EventsV1().Events("").List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Reason == events.Reason && e.Regarding.Kind == kind && e.Regarding.Name == name {
			out = append(out, e)
		}
	}
	return out
}

// A denied `kubectl delete node` leaves a NodeDeleteDenied Event on that
// Node naming the blocker and the user, which `kubectl describe node` shows;
// 30 denied deletes of one Node at once are one Event counting 30; a dry run
// leaves none.
func TestDenialEvents(t *testing.T) {
	cfg, env := apiServerEnv(t)
	nodeguard(t, cfg, "")
	kube, dyn := clientsFor(t, cfg)
	ctx := context.Background()
	for _, name := range []string{"md-0-kubectl", "md-0-burst", "md-0-dry-run"} {
		capdMachine(t, dyn, name, false)
	}
	// A real delete only once the API server sends deletes to nodeguard
	// (see TestDenialEventsOfAWorkloadCluster).
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		err := dryRunDelete(ctx, kube, "md-0-kubectl")
		require.Error(c, err)
		assert.Contains(c, err.Error(), "DockerMachine default/md-0-kubectl")
	}, 30*time.Second, 100*time.Millisecond, "the webhook decides")
	var out string
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var err error
		out, err = kubectl(t, env, "delete", "node", "md-0-kubectl")
		require.Error(c, err)
		assert.Contains(c, out, "DockerMachine default/md-0-kubectl")
	}, 30*time.Second, 200*time.Millisecond, "denied once nodeguard is ready")
	user, err := kubectl(t, env, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
	require.NoError(t, err, user)
	node, err := kube.CoreV1().Nodes().Get(ctx, "md-0-kubectl", metav1.GetOptions{})
	require.NoError(t, err)
	var ev eventsv1.Event
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var blocked []eventsv1.Event
		for _, e := range denialEvents(c, kube, "Node", "md-0-kubectl") {
			if strings.Contains(e.Note, "(blocked)") {
				blocked = append(blocked, e)
			}
		}
		require.Len(c, blocked, 1)
		ev = blocked[0]
	}, 10*time.Second, 100*time.Millisecond, "an Event on the Node")
	assert.Equal(t, node.UID, ev.Regarding.UID, "kubectl describe node finds Events by the Node's UID")
	assert.Equal(t, "Warning", ev.Type)
	assert.Equal(t, "nodeguard", ev.ReportingController)
	assert.True(t, strings.HasPrefix(ev.Note, `Delete by "`+user+`" denied (blocked): `), ev.Note)
	assert.Contains(t, ev.Note, "DockerMachine default/md-0-kubectl")
	require.NotNil(t, ev.Related)
	assert.Equal(t, "DockerMachine", ev.Related.Kind)
	described, err := kubectl(t, env, "describe", "node", "md-0-kubectl")
	require.NoError(t, err)
	assert.Contains(t, described, "NodeDeleteDenied")
	t.Logf("kubectl describe node md-0-kubectl, its Events:\n%s", described[strings.Index(described, "Events:"):])

	// A burst: 30 deletes of one Node at once, all denied.
	const n = 30
	var wg sync.WaitGroup
	denied := make([]bool, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			denied[i] = kube.CoreV1().Nodes().Delete(ctx, "md-0-burst", metav1.DeleteOptions{}) != nil
		}()
	}
	wg.Wait()
	for i := range n {
		require.True(t, denied[i], "delete %d denied", i)
	}
	start := time.Now()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		got := denialEvents(c, kube, "Node", "md-0-burst")
		require.Len(c, got, 1, "one Event for the burst")
		require.NotNil(c, got[0].Series)
		assert.EqualValues(c, n, got[0].Series.Count)
	}, 30*time.Second, 200*time.Millisecond, "the Event counts all %d", n)
	t.Logf("%d denied deletes of one Node: 1 Event, series.count %d written %s after the burst", n, n, time.Since(start).Round(time.Millisecond))
	require.Never(t, func() bool { return len(denialEvents(t, kube, "Node", "md-0-burst")) != 1 }, 2*time.Second, 100*time.Millisecond,
		"and no other Event later")
	described, err = kubectl(t, env, "describe", "node", "md-0-burst")
	require.NoError(t, err)
	t.Logf("kubectl describe node md-0-burst, its Events:\n%s", described[strings.Index(described, "Events:"):])

	// A dry run has no side effects (sideEffects: NoneOnDryRun).
	require.Error(t, dryRunDelete(ctx, kube, "md-0-dry-run"))
	require.Never(t, func() bool { return len(denialEvents(t, kube, "Node", "md-0-dry-run")) > 0 }, 3*time.Second, 100*time.Millisecond,
		"no Event for a dry run")
}

// For a workload cluster's route, the Event goes on the Node in the workload
// cluster when nodeguard may read its kubeconfig Secret
// (--denial-events-workload-clusters); otherwise on the Machine in the
// management cluster.
func TestDenialEventsOfAWorkloadCluster(t *testing.T) {
	mgmt := apiServer(t)
	// A cluster route's Events are written only for reviews whose caller
	// the client CA authenticated: the workload API server presents one.
	workload, workloadEnv, clientCA := authenticatingAPIServer(t)
	clients, err := kube.FromConfig(mgmt)
	require.NoError(t, err)
	ca := testpki.New(t)
	toWorkload, _ := serveWith(t, clients, ca, serve.Options{Listen: "127.0.0.1:0", DenialEventsWorkloadClusters: true, ClientCAFile: clientCA.CAFile(t)})
	toMgmt, _ := serveWith(t, clients, ca, serve.Options{Listen: "127.0.0.1:0", ClientCAFile: clientCA.CAFile(t)})
	mgmtKube, dyn := clientsFor(t, mgmt)
	workloadKube, err := kubernetes.NewForConfig(workload)
	require.NoError(t, err)
	ctx := context.Background()
	devCluster(t, dyn, workloadEnv, mgmtKube)
	for _, name := range []string{"md-0-a", "md-0-b"} {
		workloadMachine(t, dyn, mgmtKube, workloadKube, name)
	}
	caPEM, err := os.ReadFile(ca.CAFile(t))
	require.NoError(t, err)
	route := func(url string) {
		vwc, err := admission.BuildWebhookConfig(admission.WebhookConfigOptions{URL: url, CABundle: caPEM, Cluster: "default/dev"})
		require.NoError(t, err)
		require.NoError(t, admission.ApplyWebhookConfig(ctx, dynamic.NewForConfigOrDie(workload), vwc))
	}

	route(toWorkload)
	// Delete for real only once the API server sends deletes to nodeguard:
	// before it has loaded the configuration, a delete goes through and the
	// Node is gone (seen in CI).
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		err := dryRunDelete(ctx, workloadKube, "md-0-a")
		require.Error(c, err)
		assert.Contains(c, err.Error(), "DockerMachine default/md-0-a")
	}, 30*time.Second, 100*time.Millisecond, "the webhook decides in the workload cluster")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		err := workloadKube.CoreV1().Nodes().Delete(ctx, "md-0-a", metav1.DeleteOptions{})
		require.Error(c, err)
		assert.Contains(c, err.Error(), "DockerMachine default/md-0-a")
		assert.NotEmpty(c, denialEvents(c, workloadKube, "Node", "md-0-a"))
	}, 30*time.Second, 500*time.Millisecond, "the Event is on the Node, in the workload cluster")
	node, err := workloadKube.CoreV1().Nodes().Get(ctx, "md-0-a", metav1.GetOptions{})
	require.NoError(t, err)
	ev := denialEvents(t, workloadKube, "Node", "md-0-a")[0]
	assert.Equal(t, node.UID, ev.Regarding.UID)
	assert.Nil(t, ev.Related, "the DockerMachine is in the management cluster")

	// The other replica may not read Secrets: the Event goes on the Machine.
	route(toMgmt)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		require.Error(c, workloadKube.CoreV1().Nodes().Delete(ctx, "md-0-b", metav1.DeleteOptions{}))
		assert.NotEmpty(c, denialEvents(c, mgmtKube, "Machine", "md-0-b"))
	}, 30*time.Second, 500*time.Millisecond, "the Event is on the Machine, in the management cluster")
	machine, err := dyn.Resource(machines).Namespace("default").Get(ctx, "md-0-b", metav1.GetOptions{})
	require.NoError(t, err)
	ev = denialEvents(t, mgmtKube, "Machine", "md-0-b")[0]
	assert.Equal(t, machine.GetUID(), ev.Regarding.UID, "kubectl describe machine finds it")
	assert.Equal(t, "default", ev.Namespace)
	assert.True(t, strings.HasPrefix(ev.Note, `Node "md-0-b" of workload cluster default/dev: Delete by "`), ev.Note)
}
