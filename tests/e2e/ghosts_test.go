//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	v1helper "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/cli"
	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/fleet"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	ngnodes "github.com/nodeguard/nodeguard/enforcer/nodes"
	"github.com/nodeguard/nodeguard/enforcer/serve"
	"github.com/nodeguard/nodeguard/internal/localcluster"
	"github.com/nodeguard/nodeguard/internal/testpki"
)

// scrape returns the value of one series (name and labels as exported) at
// the metrics address, and whether it is there.
func scrape(t require.TestingT, metrics, series string) (float64, bool) {
	resp, err := http.Get("http://" + metrics + "/metrics")
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err)
			return f, true
		}
	}
	return 0, false
}

// kubeletRegisters creates the Node a kubelet whose host outlived its
// deletion registers: its old name and providerID, no CAPI annotations,
// Ready.
func kubeletRegisters(ctx context.Context, c *capiCluster, name string) (*corev1.Node, error) {
	n, err := c.nodes.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.NodeSpec{ProviderID: "docker:////" + name}}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	now := metav1.Now()
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		LastHeartbeatTime: now, LastTransitionTime: now}}
	return c.nodes.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
}

// ghostEvents lists the GhostNode Events on Node name of uid.
func ghostEvents(t require.TestingT, c *capiCluster, name string, uid types.UID) []string {
	list, err := c.nodes.EventsV1().Events("").List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	var notes []string
	for _, e := range list.Items {
		if e.Reason == ngnodes.GhostReason && e.Regarding.Kind == "Node" && e.Regarding.Name == name && e.Regarding.UID == uid {
			notes = append(notes, e.Note)
		}
	}
	return notes
}

func hasTaint(n *corev1.Node) bool {
	for _, taint := range n.Spec.Taints {
		if taint.Key == ngnodes.GhostTaintKey && taint.Effect == corev1.TaintEffectNoExecute {
			return true
		}
	}
	return false
}

// Real CAPI, Machines on the management API server, Nodes on the workload
// one, nodeguard serve --fleet with ghost protection deny: a Machine deleted
// in CAPI's order tombstones its providerID (in a ConfigMap, so nodeguard
// restarted still knows it); the kubelet of the host that outlived it
// registers its Node again and is refused, with nodeguard's message. With
// the Cluster's protection switched to taint, the registration goes through
// and the ghost is reported (metric, Event) and tainted NoExecute within
// seconds; `nodeguard ghosts` lists it and --clear ends the tombstone (the
// taint goes). A new Machine whose DockerMachine carries the same
// providerID is a legitimate reuse: never a ghost.
func TestCAPIGhostNodes(t *testing.T) {
	expectGhosts(t)
	_, mgmtEnv := apiServerEnv(t)
	_, workloadEnv := apiServerEnv(t)
	c := startCAPI(t, mgmtEnv, workloadEnv)
	ctx := context.Background()
	clients, err := kube.FromConfig(localcluster.Config(mgmtEnv))
	require.NoError(t, err)
	ca := testpki.New(t)
	listen := "127.0.0.1:" + strconv.Itoa(freePort(t))
	metricsAt := make(chan net.Addr, 1)
	opts := serve.Options{Listen: listen, MetricsBindAddress: "127.0.0.1:0",
		SideListening: func(name string, a net.Addr) {
			if name == "metrics" {
				metricsAt <- a
			}
		},
		Fleet: serve.FleetOptions{URL: "https://" + listen, CAFiles: []string{ca.CAFile(t)}},
		Orphans: serve.ReapOptions{Interval: time.Hour, WorkloadClusters: true,
			Ghosts: serve.GhostOptions{Window: time.Hour, Protection: ngnodes.ProtectionDeny}}}
	stop := serveFleet(t, clients, ca, opts)
	metrics := (<-metricsAt).String()
	guarded := func(what string) {
		require.EventuallyWithT(t, func(col *assert.CollectT) {
			states, err := fleet.List(ctx, clients)
			require.NoError(col, err)
			require.Len(col, states, 1)
			assert.True(col, states[0].Guarded, "%+v", states[0])
			cfg, err := c.nodes.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, admission.Name, metav1.GetOptions{})
			require.NoError(col, err)
			assert.Len(col, cfg.Webhooks, 2, "the delete webhook and the registration webhook")
		}, 60*time.Second, 200*time.Millisecond, what)
	}
	guarded("the fleet guards Cluster default/dev, its registrations too")

	const name = "dev-md-0-ghost"
	const pid = "docker:////" + name
	c.machine(t, name, localcluster.MachineOptions{})
	require.NoError(t, c.dyn.Resource(machines).Namespace("default").Delete(ctx, name, metav1.DeleteOptions{}))
	gone(t, "Node "+name, 60*time.Second, c.getNode(name))
	gone(t, "Machine "+name, 60*time.Second, c.getMachine(name))
	require.EventuallyWithT(t, func(col *assert.CollectT) {
		ts, _, err := facts.ReadTombstones(ctx, clients.Dynamic, "default")
		require.NoError(col, err)
		require.Len(col, ts, 1)
		assert.Equal(col, pid, ts[0].ProviderID)
		assert.Equal(col, "DockerMachine default/"+name, ts[0].Object, "the InfraMachine's deletion, the later")
		assert.Equal(col, name, ts[0].Node)
		assert.Equal(col, "default/dev", ts[0].Cluster)
	}, 10*time.Second, 50*time.Millisecond, "CAPI deleted the Machine in order: its providerID tombstoned in the ConfigMap")
	t.Log("CAPI deleted Machine " + name + " in order; its providerID is tombstoned in ConfigMap default/nodeguard-tombstones")

	parent := t // nodeguard started again runs to the test's end, not the subtest's
	t.Run("restarted, nodeguard still knows the tombstone and refuses the ghost's registration", func(t *testing.T) {
		stop()
		restarted := time.Now()
		stop = serveFleet(parent, clients, ca, opts)
		metrics = (<-metricsAt).String()
		// Until its caches are synced nodeguard admits registrations (they
		// fail open): a dry run shows when it judges them.
		require.EventuallyWithT(t, func(col *assert.CollectT) {
			_, err := c.nodes.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: corev1.NodeSpec{ProviderID: pid}}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			require.Error(col, err)
		}, 30*time.Second, 50*time.Millisecond)
		t.Logf("registrations judged %s after nodeguard restarted", time.Since(restarted).Round(time.Millisecond))
		_, err := kubeletRegisters(ctx, c, name)
		require.Error(t, err, "the kubelet's Node create is refused")
		assert.Contains(t, err.Error(), `admission webhook "`+admission.RegistrationWebhookName+`" denied the request`)
		assert.Contains(t, err.Error(), `may not register: providerID "`+pid+`" was carried by DockerMachine default/`+name)
		assert.Contains(t, err.Error(), "nodeguard ghosts --clear "+pid)
		t.Logf("the kubelet's registration: %v", err)
		_, err = c.nodes.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		assert.True(t, apierrors.IsNotFound(err), "no Node, so nothing can be scheduled to it: %v", err)
		// A kubelet registered without a providerID, which an external
		// cloud-controller-manager sets afterwards: that update is refused.
		n, err := c.nodes.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		require.NoError(t, err)
		n.Spec.ProviderID = pid
		_, err = c.nodes.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		require.Error(t, err, "the cloud-controller-manager's providerID is refused")
		assert.Contains(t, err.Error(), "may not register")
		require.NoError(t, c.nodes.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}))
	})

	var ghost *corev1.Node
	t.Run("in taint mode the ghost registers, is reported and tainted", func(t *testing.T) {
		_, err := c.dyn.Resource(clustersGVR).Namespace("default").Patch(ctx, "dev", types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"`+ngnodes.GhostAnnotation+`":"taint"}}}`), metav1.PatchOptions{})
		require.NoError(t, err)
		require.EventuallyWithT(t, func(col *assert.CollectT) {
			cfg, err := c.nodes.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, admission.Name, metav1.GetOptions{})
			require.NoError(col, err)
			assert.Len(col, cfg.Webhooks, 1, "the registration webhook removed")
		}, 30*time.Second, 100*time.Millisecond)
		ghost, err = kubeletRegisters(ctx, c, name)
		require.NoError(t, err)
		registered := time.Now()
		series := `nodeguard_ghost_nodes{cluster="default/dev"}`
		var reported, evented, tainted time.Duration
		require.EventuallyWithT(t, func(col *assert.CollectT) {
			if v, _ := scrape(col, metrics, series); v == 1 && reported == 0 {
				reported = time.Since(registered)
			}
			if len(ghostEvents(col, c, name, ghost.UID)) == 1 && evented == 0 {
				evented = time.Since(registered)
			}
			n, err := c.nodes.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			require.NoError(col, err)
			if hasTaint(n) && tainted == 0 {
				tainted = time.Since(registered)
			}
			assert.NotZero(col, reported, "metric")
			assert.NotZero(col, evented, "Event")
			assert.NotZero(col, tainted, "taint")
		}, 10*time.Second, 20*time.Millisecond, "reported within 10 s of its registration")
		t.Logf("ghost Node %s: metric %s, GhostNode Event %s, tainted %s:NoExecute %s after its registration",
			name, reported.Round(time.Millisecond), evented.Round(time.Millisecond), ngnodes.GhostTaintKey, tainted.Round(time.Millisecond))
		// What kube-scheduler's TaintToleration filter asks of it (the same
		// k8s.io/component-helpers call): a Pod with the tolerations the API
		// server gives every Pod (DefaultTolerationSeconds) cannot be put there.
		n, err := c.nodes.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		seconds := int64(300)
		everyPod := []corev1.Toleration{
			{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &seconds},
			{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &seconds},
		}
		// nodeguard's taint alone: the API server's not-ready taint, which no
		// controller here lifts, would keep Pods off as well.
		nodeguards := func(t *corev1.Taint) bool {
			return t.Key == ngnodes.GhostTaintKey && (t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute)
		}
		taint, untolerated := v1helper.FindMatchingUntoleratedTaint(klog.Background(), n.Spec.Taints, everyPod, nodeguards, false)
		assert.True(t, untolerated, "no Pod can be scheduled to the ghost: nodeguard's taint is tolerated by none")
		assert.Equal(t, corev1.TaintEffectNoExecute, taint.Effect)
		notes := ghostEvents(t, c, name, ghost.UID)
		assert.Contains(t, notes[0], "DockerMachine default/"+name)
		assert.Contains(t, notes[0], "deleted at")

		var out bytes.Buffer
		code, err := cli.Ghosts(ctx, cli.GhostsOptions{Kubeconfig: adminKubeconfig(t, mgmtEnv), Namespace: "default", Output: "text"}, &out)
		require.NoError(t, err)
		assert.Equal(t, cli.ExitGhost, code, out.String())
		assert.Contains(t, out.String(), `GHOST: Node "`+name+`" in Cluster default/dev: providerID "`+pid+`" was carried by DockerMachine default/`+name)
		assert.Contains(t, out.String(), "tainted "+ngnodes.GhostTaintKey)
		t.Logf("nodeguard ghosts:\n%s", out.String())
	})

	t.Run("nodeguard ghosts --clear ends the tombstone: no ghost, no taint", func(t *testing.T) {
		var out bytes.Buffer
		code, err := cli.Ghosts(ctx, cli.GhostsOptions{Kubeconfig: adminKubeconfig(t, mgmtEnv), Namespace: "default", Output: "text",
			Clear: []string{pid}}, &out)
		require.NoError(t, err)
		assert.Equal(t, cli.ExitNone, code)
		assert.Contains(t, out.String(), "cleared: tombstone of providerID \""+pid+"\"")
		cleared := time.Now()
		require.EventuallyWithT(t, func(col *assert.CollectT) {
			v, _ := scrape(col, metrics, `nodeguard_ghost_nodes{cluster="default/dev"}`)
			assert.Zero(col, v)
			n, err := c.nodes.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			require.NoError(col, err)
			assert.False(col, hasTaint(n), "nodeguard's taint removed")
		}, 10*time.Second, 20*time.Millisecond)
		t.Logf("tombstone cleared: the ghost's taint removed %s later", time.Since(cleared).Round(time.Millisecond))
		require.Never(t, func() bool {
			ts, _, err := facts.ReadTombstones(ctx, clients.Dynamic, "default")
			return err != nil || len(ts) > 0
		}, 2*facts.DefaultTombstoneWriteInterval, 50*time.Millisecond, "serve took the clear; it did not write the tombstone back")
		// The host stopped for good: its Node goes like any unlinked one.
		require.NoError(t, c.nodes.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}))
	})

	t.Run("a new Machine whose DockerMachine carries the providerID again is never a ghost", func(t *testing.T) {
		const reused = "dev-md-0-reused"
		c.machine(t, reused, localcluster.MachineOptions{})
		require.NoError(t, c.dyn.Resource(machines).Namespace("default").Delete(ctx, reused, metav1.DeleteOptions{}))
		gone(t, "Machine "+reused, 60*time.Second, c.getMachine(reused))
		require.EventuallyWithT(t, func(col *assert.CollectT) {
			ts, _, err := facts.ReadTombstones(ctx, clients.Dynamic, "default")
			require.NoError(col, err)
			require.Len(col, ts, 1)
		}, 10*time.Second, 50*time.Millisecond, "tombstoned")
		// The same name, so CAPD gives its DockerMachine the same providerID.
		c.machine(t, reused, localcluster.MachineOptions{})
		n, err := c.nodes.CoreV1().Nodes().Get(ctx, reused, metav1.GetOptions{})
		require.NoError(t, err)
		require.EventuallyWithT(t, func(col *assert.CollectT) {
			ts, _, err := facts.ReadTombstones(ctx, clients.Dynamic, "default")
			require.NoError(col, err)
			assert.Empty(col, ts, "the new link ended the tombstone")
		}, 10*time.Second, 50*time.Millisecond)
		v, _ := scrape(t, metrics, `nodeguard_ghost_nodes{cluster="default/dev"}`)
		assert.Zero(t, v)
		assert.Empty(t, ghostEvents(t, c, reused, n.UID))
		assert.False(t, hasTaint(n))
	})

	// Against the real API server (the fake client keeps no
	// resourceVersions): two replicas that find the ConfigMap absent both
	// create it; the second's create fails, it reads the first's and writes
	// the merge, losing neither's tombstone.
	t.Run("two replicas creating the tombstones ConfigMap lose nothing", func(t *testing.T) {
		const ns = "kube-public"
		keeper := func() (*facts.TombstoneKeeper, *facts.Tombstones) {
			s := facts.NewTombstones(facts.TombstoneOptions{})
			k := &facts.TombstoneKeeper{Store: s, Client: c.dyn, Namespace: ns}
			require.NoError(t, k.Load(ctx))
			return k, s
		}
		ka, a := keeper()
		kb, b := keeper()
		a.Record(facts.Tombstone{ProviderID: "docker:////a", Object: "DockerMachine default/a", DeletedAt: time.Now()})
		b.Record(facts.Tombstone{ProviderID: "docker:////b", Object: "DockerMachine default/b", DeletedAt: time.Now()})
		ka.Flush(ctx)
		kb.Flush(ctx) // AlreadyExists: reads a's
		kb.Flush(ctx) // writes the merge under a's resourceVersion
		ts, ok, err := facts.ReadTombstones(ctx, c.dyn, ns)
		require.NoError(t, err)
		require.True(t, ok)
		var pids []string
		for _, stone := range ts {
			pids = append(pids, stone.ProviderID)
		}
		assert.ElementsMatch(t, []string{"docker:////a", "docker:////b"}, pids)
	})
}
