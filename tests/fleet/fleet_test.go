// Package fleet measures the orphan scan at fleet size: Nodes in many
// workload clusters (simulated API servers over HTTP, protobuf, in this
// process) and their Machines and DockerMachines in a management cluster
// (client-go's fake dynamic client), with `nodeguard serve`'s own orphan scan
// (serve.OrphanScan) between them. docs/performance.md has the figures and
// the commands.
package fleet

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/nodes"
	"github.com/nodeguard/nodeguard/enforcer/serve"
	"github.com/nodeguard/nodeguard/internal/stacks"
	"github.com/nodeguard/nodeguard/internal/testcluster"
)

var (
	clustersFlag = flag.Int("clusters", 10, "workload clusters")
	nodesFlag    = flag.Int("nodes", 50_000, "Nodes in all, spread evenly over the clusters")
	windowFlag   = flag.Duration("window", 2*time.Minute, "how long nothing changes while CPU and requests are counted (Go forces a garbage collection every 2 minutes)")
	updatesFlag  = flag.Int("updates", 20_000, "kubelet status reports pushed to measure what one costs")
)

// The grace and the full pass period are the shipped defaults.
const (
	grace    = 5 * time.Minute
	interval = serve.DefaultOrphanScanInterval
)

var (
	clusterGVK = schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "Cluster"}
	crdGVK     = schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"}
	machines   = schema.GroupVersionResource{Group: "cluster.x-k8s.io", Version: "v1beta2", Resource: "machines"}
	dockers    = schema.GroupVersionResource{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Resource: "dockermachines"}
)

// notReady picks 1% of the Nodes: NotReady for an hour, their Machines
// still there (kept, but past the screen, so a full pass judges them whole).
func notReady(i int) bool { return i%100 == 99 }

// created is when every Node registered; now is long after.
var created = metav1.NewTime(time.Now().Add(-24 * time.Hour).Truncate(time.Second))

// node is a Node as a kubelet and CAPI leave it (~4 KiB as protobuf, ~6 KiB
// as JSON: labels, conditions, addresses, 20 images); notReady ones went
// NotReady an hour ago.
func node(cluster string, i int, notReady bool) *corev1.Node {
	name := fmt.Sprintf("%s-md-0-%05d", cluster, i)
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(fmt.Sprintf("6a1f3c2e-8d4b-4c1a-9e2f-%012d", i)), ResourceVersion: "1", CreationTimestamp: created,
			Labels: map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux",
				"node.kubernetes.io/instance-type": "m6i.2xlarge", "topology.kubernetes.io/zone": "us-east-1a"},
			Annotations: map[string]string{"cluster.x-k8s.io/cluster-name": cluster, "cluster.x-k8s.io/cluster-namespace": "fleet",
				"cluster.x-k8s.io/machine": name, "cluster.x-k8s.io/owner-kind": "MachineSet", "cluster.x-k8s.io/owner-name": cluster + "-md-0",
				"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
		},
		Spec: corev1.NodeSpec{ProviderID: "docker:////" + name, PodCIDR: "192.168.1.0/24", PodCIDRs: []string{"192.168.1.0/24"}},
	}
	ready := corev1.ConditionTrue
	since := created
	if notReady {
		ready, since = corev1.ConditionUnknown, metav1.NewTime(created.Add(23*time.Hour)) // an hour before the run
	}
	for _, c := range []corev1.NodeConditionType{corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure} {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: c, Status: corev1.ConditionFalse,
			LastHeartbeatTime: created, LastTransitionTime: created, Reason: "KubeletHasSufficient" + string(c), Message: "kubelet has sufficient resources"})
	}
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeReady, Status: ready,
		LastHeartbeatTime: since, LastTransitionTime: since, Reason: "KubeletReady", Message: "kubelet is posting ready status"})
	n.Status.Capacity = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("32Gi"),
		corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceEphemeralStorage: resource.MustParse("100Gi")}
	n.Status.Allocatable = n.Status.Capacity
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255)},
		{Type: corev1.NodeHostName, Address: name}}
	n.Status.NodeInfo = corev1.NodeSystemInfo{MachineID: "ec2abcdef0123456789", SystemUUID: "ec2abcdef-0123-4567", BootID: "abcdef01-2345-6789",
		KernelVersion: "6.8.0-1019-aws", OSImage: "Ubuntu 24.04.1 LTS", ContainerRuntimeVersion: "containerd://2.0.2", KubeletVersion: "v1.36.3",
		OperatingSystem: "linux", Architecture: "amd64"}
	for j := range 20 {
		n.Status.Images = append(n.Status.Images, corev1.ContainerImage{SizeBytes: 1 << 26, Names: []string{
			fmt.Sprintf("registry.k8s.io/team/image-%d@sha256:%064x", j, j), fmt.Sprintf("registry.k8s.io/team/image-%d:v1.%d.0", j, j)}})
	}
	return n
}

// fleet is the world: the management cluster's objects, the workload
// clusters' API servers, and the scan between them.
type fleet struct {
	clusters []string
	servers  map[string]*nodeServer
	mgmt     *dynamicfake.FakeDynamicClient
	mapper   meta.RESTMapper
	secrets  *fake.Clientset
	scanner  *nodes.Scanner
	changes  *facts.Relay
	// relayed counts the inventory's changes passed to the relay (each
	// reaches the scan once it started); objects is how many the inventory
	// holds once synced, each of which comes first as an add.
	relayed atomic.Int64
	objects int64
	reg     *prometheus.Registry
	nodes   int
	// victim is a NotReady Node whose Machine and DockerMachine the test
	// deletes: CAPI leaving it behind.
	victimCluster, victim string
}

func newFleet(t testing.TB, clusterCount, nodeCount int) *fleet {
	t.Helper()
	f := &fleet{servers: map[string]*nodeServer{}, secrets: fake.NewClientset(), reg: prometheus.NewRegistry()}
	crd := testcluster.Object(crdGVK, "", "dockermachines.infrastructure.cluster.x-k8s.io", nil)
	crd.SetLabels(map[string]string{"cluster.x-k8s.io/v1beta2": "v1beta1_v1beta2"})
	objs := []k8sruntime.Object{crd}
	perCluster := nodeCount / clusterCount
	for c := range clusterCount {
		cluster := fmt.Sprintf("prod-%02d", c)
		f.clusters = append(f.clusters, cluster)
		objs = append(objs, testcluster.Object(clusterGVK, "fleet", cluster, nil))
		for i := range perCluster {
			// 1% NotReady (their Machines exist: kept, but past the screen).
			name, pid := fmt.Sprintf("%s-md-0-%05d", cluster, i), fmt.Sprintf("docker:////%s-md-0-%05d", cluster, i)
			m := testcluster.Object(testcluster.MachineGVK, "fleet", name, map[string]any{
				"spec": map[string]any{"clusterName": cluster, "providerID": pid, "bootstrap": map[string]any{"dataSecretName": name},
					"infrastructureRef": map[string]any{"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": name}},
				"status": map[string]any{"nodeRef": map[string]any{"name": name}, "phase": "Running"}})
			m.SetLabels(map[string]string{"cluster.x-k8s.io/cluster-name": cluster, "cluster.x-k8s.io/deployment-name": cluster + "-md-0"})
			d := testcluster.Object(testcluster.DockerMachineGVK, "fleet", name, map[string]any{"spec": map[string]any{"providerID": pid}})
			d.SetLabels(map[string]string{"cluster.x-k8s.io/cluster-name": cluster})
			objs = append(objs, m, d)
		}
		s := newNodeServer(func(yield func(*corev1.Node) bool) {
			for i := range perCluster {
				if !yield(node(cluster, i, notReady(i))) {
					return
				}
			}
		})
		f.nodes += perCluster
		t.Cleanup(s.srv.Close)
		f.servers[cluster] = s
		f.secret(t, cluster, s.srv.URL)
	}
	f.victimCluster, f.victim = f.clusters[clusterCount-1], fmt.Sprintf("%s-md-0-%05d", f.clusters[clusterCount-1], 99)
	f.mgmt, f.mapper = testcluster.Serve(kinds, objs...)
	return f
}

var kinds = []testcluster.Kind{
	{GVK: schema.GroupVersionKind{Version: "v1", Kind: "Node"}, Resource: "nodes", Cluster: true},
	{GVK: testcluster.MachineGVK, Resource: "machines"},
	{GVK: clusterGVK, Resource: "clusters"},
	{GVK: testcluster.DockerMachineGVK, Resource: "dockermachines"},
	{GVK: crdGVK, Resource: "customresourcedefinitions", Cluster: true},
}

// secret stores CAPI's kubeconfig Secret of a workload cluster.
func (f *fleet) secret(t testing.TB, cluster, server string) {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[cluster] = &clientcmdapi.Cluster{Server: server}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: "t"}
	cfg.Contexts["admin"] = &clientcmdapi.Context{Cluster: cluster, AuthInfo: "admin"}
	cfg.CurrentContext = "admin"
	kc, err := clientcmd.Write(*cfg)
	require.NoError(t, err)
	_, err = f.secrets.CoreV1().Secrets("fleet").Create(context.Background(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "fleet", Name: cluster + "-kubeconfig"}, Data: map[string][]byte{"value": kc}}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// inventory runs the management cluster's informers, as serve does, their
// changes relayed to the scan once it starts.
func (f *fleet) inventory(t testing.TB, ctx context.Context) *guard.Enforcer {
	t.Helper()
	f.changes = &facts.Relay{}
	relay := func(c facts.Change) {
		f.changes.Send(c)
		f.relayed.Add(1)
	}
	e, err := guard.StartEnforcer(ctx, kube.Clients{Dynamic: f.mgmt, Mapper: f.mapper}, guard.EnforcerOptions{OnChange: relay, Engine: testcluster.Engine(t)})
	require.NoError(t, err)
	require.NoError(t, guard.WaitReady(ctx, e.Syncer.Ready, 5*time.Minute))
	for _, n := range e.Inventory.Count() {
		f.objects += int64(n)
	}
	return e
}

// start runs the orphan scan over the inventory, as serve does.
func (f *fleet) start(t testing.TB, ctx context.Context, e *guard.Enforcer) {
	t.Helper()
	clients := kube.Clients{Dynamic: f.mgmt, Mapper: f.mapper}
	scan := serve.OrphanScan{Management: clients, Kube: f.secrets, Enforcer: e, Changes: f.changes, Registry: f.reg,
		Options: serve.ReapOptions{Grace: grace, Interval: interval, WorkloadClusters: true},
		Log:     slog.New(slog.NewJSONHandler(&errorsOnly{t: t}, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	var err error
	f.scanner, err = scan.Start(ctx)
	require.NoError(t, err)
}

// errorsOnly fails the test on an error line from the scan.
type errorsOnly struct{ t testing.TB }

func (e *errorsOnly) Write(p []byte) (int, error) {
	e.t.Errorf("scan logged: %s", p)
	return len(p), nil
}

// metric sums a metric's samples whose labels contain the given pairs.
func (f *fleet) metric(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	families, err := f.reg.Gather()
	require.NoError(t, err)
	var sum float64
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if matches(m, labels) {
				sum += m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func matches(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// gauges prints nodeguard_orphan_nodes, for failures.
func (f *fleet) gauges(t testing.TB) string {
	families, err := f.reg.Gather()
	require.NoError(t, err)
	for _, mf := range families {
		if mf.GetName() == "nodeguard_orphan_nodes" {
			return mf.String()
		}
	}
	return "no nodeguard_orphan_nodes"
}

func (f *fleet) judged(t testing.TB) float64 {
	return f.metric(t, "nodeguard_orphan_judgments_total", "stage", "screen")
}

// requests counts the API requests of the scan: to every workload API
// server, and to the management cluster after its first sync.
type requests struct {
	workload map[string]int64 // list, watch, get, other
	mgmt     int
	secrets  int
}

func (f *fleet) requests() requests {
	r := requests{workload: map[string]int64{}}
	for _, s := range f.servers {
		for k := range s.requests {
			r.workload[k] += s.count(k)
		}
	}
	r.mgmt = len(f.mgmt.Actions())
	r.secrets = len(f.secrets.Actions())
	return r
}

func (r requests) since(before requests) requests {
	out := requests{workload: map[string]int64{}, mgmt: r.mgmt - before.mgmt, secrets: r.secrets - before.secrets}
	for k, v := range r.workload {
		out.workload[k] = v - before.workload[k]
	}
	return out
}

func (r requests) total() int64 {
	n := int64(r.mgmt + r.secrets)
	for _, v := range r.workload {
		n += v
	}
	return n
}

// cpu is the process's user+system CPU time so far.
func cpu(t testing.TB) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// Figures is what one run measures.
type Figures struct {
	Nodes, Clusters int
	SyncTime        time.Duration // from the scan's start to every Node judged once
	SyncCPU         time.Duration
	BytesPerNode    float64       // heap the Node caches hold, per Node
	IdleCPUPerMin   time.Duration // nothing changing, no full pass in the window
	FullPassCPU     time.Duration // one full pass (the safety net, every interval)
	FullPassTime    time.Duration
	JudgedIdle      float64 // Nodes judged in the idle window
	Requests        requests
	Window          time.Duration
	OrphanTime      time.Duration // a Machine and DockerMachine deleted -> the Node counted an orphan
	OrphanCPU       time.Duration
	UpdateCPU       time.Duration // one kubelet status report that changes nothing judged
	NodeLists       int64         // Node LISTs sent after the caches synced
}

// measure runs the whole sequence.
func measure(t testing.TB, clusterCount, nodeCount int, window time.Duration, updates int) Figures {
	t.Helper()
	f := newFleet(t, clusterCount, nodeCount)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	fig := Figures{Nodes: f.nodes, Clusters: clusterCount, Window: window}

	// The management inventory first: its memory is not the Node caches'.
	e := f.inventory(t, ctx)
	before := heap()
	cpu0, t0 := cpu(t), time.Now()
	f.start(t, ctx, e)
	// Judgments alone can reach the count early (the inventory's replay
	// judges Nodes of synced clusters again): every cluster synced too.
	require.Eventually(t, func() bool {
		return f.metric(t, "nodeguard_orphan_watch_synced") == float64(clusterCount+1) && f.judged(t) >= float64(f.nodes)
	}, 10*time.Minute, 50*time.Millisecond, "every Node judged once its cache synced")
	fig.SyncTime, fig.SyncCPU = time.Since(t0), cpu(t)-cpu0
	require.Equal(t, float64(clusterCount+1), f.metric(t, "nodeguard_orphan_watch_synced"), "every cluster synced, and the management cluster (no Nodes here)")
	// The inventory's objects replayed to the scan re-judge their Nodes for a
	// while after the first pass; memory is measured once that settled.
	f.settle(t)
	fig.BytesPerNode = float64(int64(heap())-int64(before)) / float64(f.nodes)
	lists := f.requests().workload["list"]

	// Nothing changes.
	r0, judged0, cpu0 := f.requests(), f.judged(t), cpu(t)
	time.Sleep(window) // time under test: the measured window, nothing changing
	fig.IdleCPUPerMin = time.Duration(float64(cpu(t)-cpu0) * float64(time.Minute) / float64(window))
	fig.JudgedIdle = f.judged(t) - judged0
	fig.Requests = f.requests().since(r0)

	// One full pass, asked for now instead of waiting for the interval.
	judged0, cpu0, t0 = f.judged(t), cpu(t), time.Now()
	f.judgeAll(t)
	require.Eventually(t, func() bool { return f.judged(t) >= judged0+float64(f.nodes) }, 5*time.Minute, 50*time.Millisecond)
	fig.FullPassTime, fig.FullPassCPU = time.Since(t0), cpu(t)-cpu0

	// CAPI deletes a Machine and its DockerMachine and leaves the Node (NotReady
	// for an hour, past its grace): how long and how much CPU until it counts.
	// Measured once the full pass is over and its garbage collected: neither
	// counts in the orphan's time or CPU.
	require.Eventually(t, scanIdle, time.Minute, 10*time.Millisecond, "the full pass is over: the scan waits")
	runtime.GC()
	cpu0, t0 = cpu(t), time.Now()
	for _, gvr := range []schema.GroupVersionResource{dockers, machines} {
		require.NoError(t, f.mgmt.Resource(gvr).Namespace("fleet").Delete(ctx, f.victim, metav1.DeleteOptions{}))
	}
	cluster := "fleet/" + f.victimCluster
	require.Eventually(t, func() bool { return f.metric(t, "nodeguard_orphan_nodes", "cluster", cluster) == 1 }, time.Minute, time.Millisecond,
		"the Node left behind is found: %v", f.gauges(t))
	fig.OrphanTime, fig.OrphanCPU = time.Since(t0), cpu(t)-cpu0

	// Kubelets' status reports: heartbeat and resourceVersion change, nothing
	// judged does; the last one flips Ready so its end can be seen.
	if updates > 0 {
		cluster := f.clusters[0]
		s := f.servers[cluster]
		judged0 := f.judged(t)
		cpu0 = cpu(t)
		require.Positive(t, s.watching())
		// Encoded before the clock starts: the server's work is not the scan's.
		raws := make([][]byte, updates)
		now := metav1.NewTime(time.Now().Truncate(time.Second))
		for i := range updates {
			k := i % len(s.names)
			n := node(cluster, k, notReady(k))
			n.ResourceVersion = fmt.Sprint(2 + i)
			n.Status.Conditions[3].LastHeartbeatTime = now
			if i == updates-1 {
				n = node(cluster, 0, false) // Ready until now
				n.ResourceVersion = fmt.Sprint(2 + i)
				n.Status.Conditions[3].Status, n.Status.Conditions[3].LastTransitionTime = corev1.ConditionFalse, now
			}
			raws[i] = mustEncode(n)
		}
		cpu0 = cpu(t)
		for _, raw := range raws {
			s.push(raw)
		}
		require.Eventually(t, func() bool { return f.judged(t) > judged0 }, time.Minute, time.Millisecond)
		fig.UpdateCPU = (cpu(t) - cpu0) / time.Duration(updates)
		assert.Equal(t, judged0+1, f.judged(t), "only the report that changed Ready was judged")
	}
	fig.NodeLists = f.requests().workload["list"] - lists
	return fig
}

// settle waits until the scan has taken in the first add of every Node and
// inventory object, and judged what they made due: every Node counted in
// its cache and every inventory change relayed, then, in one snapshot of the
// goroutines (the world stopped), none telling the scan of a change or
// judging, and the scan's loop waiting with nothing due.
func (f *fleet) settle(t testing.TB) {
	t.Helper()
	require.Eventually(t, func() bool {
		return f.metric(t, "nodeguard_orphan_watched_nodes") >= float64(f.nodes) && f.relayed.Load() >= f.objects && scanIdle()
	}, 5*time.Minute, 100*time.Millisecond, "the scan takes in every first add and judges what they made due")
}

// scanIdle reports whether, in one snapshot of the goroutines, the scan's
// loop waits (a wake or a due time would have made it runnable) and no
// goroutine is judging or telling the scan of a change.
func scanIdle() bool {
	waiting := false
	for _, g := range stacks.All() {
		for _, busy := range []string{"nodes.(*Scanner).RunDue(", "nodes.(*Scanner).NodeChanged(", "nodes.(*Scanner).ObjectChanged(",
			"facts.(*Nodes).added(", "facts.(*Nodes).updated(", "facts.(*Nodes).deleted("} {
			if strings.Contains(g, busy) {
				return false
			}
		}
		head, _, _ := strings.Cut(g, "\n")
		if strings.Contains(g, "nodes.(*Scanner).Run(") && strings.Contains(head, "[select") {
			waiting = true
		}
	}
	return waiting
}

// judgeAll asks the scan for a full pass now, as its interval's timer does.
func (f *fleet) judgeAll(t testing.TB) {
	t.Helper()
	f.scanner.JudgeAll()
}

// steadyCPUPerMin is the CPU a minute costs with nothing changing: the
// window's, when it held the scan's own full pass (a window of at least the
// interval), else the window's and a full pass every interval's share.
func (fig Figures) steadyCPUPerMin() time.Duration {
	if fig.JudgedIdle >= float64(fig.Nodes) {
		return fig.IdleCPUPerMin
	}
	return fig.IdleCPUPerMin + time.Duration(float64(fig.FullPassCPU)*float64(time.Minute)/float64(interval))
}

func report(t testing.TB, fig Figures) {
	t.Logf("fleet: %d Nodes in %d clusters; synced and judged in %s (%s CPU)", fig.Nodes, fig.Clusters, fig.SyncTime.Round(time.Millisecond), fig.SyncCPU.Round(time.Millisecond))
	t.Logf("memory per watched Node: %.0f B", fig.BytesPerNode)
	perMin := fig.steadyCPUPerMin()
	if fig.JudgedIdle >= float64(fig.Nodes) {
		t.Logf("nothing changing: %s CPU/min over the %s window, which held the scan's own full pass (%.0f Nodes judged); a full pass alone: %s CPU, %s",
			perMin.Round(time.Millisecond), fig.Window, fig.JudgedIdle, fig.FullPassCPU.Round(time.Millisecond), fig.FullPassTime.Round(time.Millisecond))
	} else {
		t.Logf("nothing changing: %s CPU/min over the %s window (%.0f Nodes judged) + a full pass every %s (%s CPU, %s) = %s CPU/min",
			fig.IdleCPUPerMin.Round(time.Millisecond), fig.Window, fig.JudgedIdle, interval, fig.FullPassCPU.Round(time.Millisecond),
			fig.FullPassTime.Round(time.Millisecond), perMin.Round(time.Millisecond))
	}
	per := func(n int64) float64 { return float64(n) * float64(time.Minute) / float64(fig.Window) }
	t.Logf("API requests per minute, nothing changing: workload %v (per minute: list %.1f, watch %.1f, get %.1f), management %.1f, kubeconfig Secrets %.1f",
		fig.Requests.workload, per(fig.Requests.workload["list"]), per(fig.Requests.workload["watch"]), per(fig.Requests.workload["get"]),
		per(int64(fig.Requests.mgmt)), per(int64(fig.Requests.secrets)))
	t.Logf("one new orphan (Machine and DockerMachine deleted): found in %s, %s CPU", fig.OrphanTime.Round(time.Microsecond), fig.OrphanCPU.Round(time.Microsecond))
	t.Logf("one kubelet status report that changes nothing judged: %s CPU (protobuf decode, reduce, compare)", fig.UpdateCPU.Round(time.Microsecond))
	t.Logf("Node LISTs after the first sync: %d", fig.NodeLists)
}

// BenchmarkOrphanFleet: go test ./tests/fleet/ -run '^$' -bench OrphanFleet -benchtime 1x -timeout 30m -v
func BenchmarkOrphanFleet(b *testing.B) {
	for range b.N {
		fig := measure(b, *clustersFlag, *nodesFlag, *windowFlag, *updatesFlag)
		report(b, fig)
		b.ReportMetric(fig.BytesPerNode, "B/node")
		b.ReportMetric(fig.steadyCPUPerMin().Seconds(), "cpu-s/min")
		b.ReportMetric(float64(fig.Requests.total())*float64(time.Minute)/float64(fig.Window), "requests/min")
		b.ReportMetric(float64(fig.OrphanTime.Microseconds())/1000, "ms/orphan")
	}
}

// A small fleet, in `make test`: the claims the benchmark measures, checked.
func TestSmallFleet(t *testing.T) {
	fig := measure(t, 2, 400, 2*time.Second, 200)
	report(t, fig)
	assert.Zero(t, fig.JudgedIdle, "nothing changes, nothing is judged")
	assert.Zero(t, fig.NodeLists, "no Node LIST after the first sync")
	assert.Zero(t, fig.Requests.workload["list"]+fig.Requests.workload["get"], "no reads of Nodes while nothing changes")
	assert.Less(t, fig.OrphanTime, 5*time.Second)
}
