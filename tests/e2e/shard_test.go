//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/fleet"
	ngkube "github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/internal/testpki"
)

// shardLabel sets an object's watch-filter label, as an operator moving a
// Cluster between shards does (kubectl label --overwrite).
func shardLabel(t *testing.T, dyn dynamic.Interface, gvr schema.GroupVersionResource, name, value string) {
	t.Helper()
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{ngkube.WatchFilterLabel: value}}})
	require.NoError(t, err)
	_, err = dyn.Resource(gvr).Namespace("default").Patch(context.Background(), name, types.MergePatchType, patch, metav1.PatchOptions{})
	require.NoError(t, err)
}

// shardInstall runs one `nodeguard serve --fleet --watch-filter value`
// process (no filter for "") with a serving CA and port of its own; it
// returns the process and its URL.
func shardInstall(t *testing.T, kubeconfig, value string) (*replica, string) {
	t.Helper()
	ca := testpki.New(t)
	cert, key := ca.ServerFiles(t, "nodeguard")
	listen := "127.0.0.1:" + strconv.Itoa(freePort(t))
	args := []string{"--listen-address", listen, "--tls-cert-file", cert, "--tls-private-key-file", key,
		"--fleet", "--fleet-url", "https://" + listen, "--fleet-ca-file", ca.CAFile(t), "--fleet-namespace", "default"}
	name := "unsharded"
	if value != "" {
		args, name = append(args, "--watch-filter", value), "shard-"+value
	}
	return startReplica(t, name, kubeconfig, args...), "https://" + listen
}

// blockedStream sends a dry-run delete of a blocked Node every 100 ms and
// keeps each answer by its kind, until stop.
type blockedStream struct {
	stop    context.CancelFunc
	wg      sync.WaitGroup
	tries   atomic.Int64
	mu      sync.Mutex
	answers map[string]int
}

// Kinds of answers to a dry-run delete of a blocked Node.
const (
	answerAllowed     = "allowed"
	answerBlocked     = "blocked by the rule"
	answerNotHeld     = "not held by the shard asked"
	answerUnreachable = "webhook unreachable: failed closed"
)

func streamBlocked(ctx context.Context, kube kubernetes.Interface, node, blocker string) *blockedStream {
	s := &blockedStream{answers: map[string]int{}}
	ctx, s.stop = context.WithCancel(ctx)
	s.wg.Go(func() {
		for ctx.Err() == nil {
			err := dryRunDelete(ctx, kube, node)
			if ctx.Err() != nil {
				return
			}
			s.tries.Add(1)
			kind := answerAllowed
			switch {
			case err == nil:
			case strings.Contains(err.Error(), "not one of this nodeguard's Clusters"), strings.Contains(err.Error(), "moving between nodeguard shards"),
				strings.Contains(err.Error(), "left this nodeguard's caches"), strings.Contains(err.Error(), "caches have not caught up"):
				kind = answerNotHeld
			case strings.Contains(err.Error(), blocker):
				kind = answerBlocked
			case strings.Contains(err.Error(), "failed calling webhook"):
				kind = answerUnreachable
			default:
				kind = "other: " + err.Error()
			}
			s.mu.Lock()
			s.answers[kind]++
			s.mu.Unlock()
			time.Sleep(100 * time.Millisecond) // time under test: the stream's pace
		}
	})
	return s
}

// finish lets n more deletes run, stops, and returns the answers by kind.
func (s *blockedStream) finish(t *testing.T, n int64) map[string]int {
	t.Helper()
	more := s.tries.Load() + n
	require.Eventually(t, func() bool { return s.tries.Load() >= more }, 30*time.Second, 50*time.Millisecond)
	s.stop()
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.answers
}

// allDenied checks that no answer let the blocked Node go, and that each
// came from nodeguard (or the API server failing closed without it).
func allDenied(t *testing.T, answers map[string]int) {
	t.Helper()
	assert.Zero(t, answers[answerAllowed], "a blocked Node's delete was allowed: %v", answers)
	for kind := range answers {
		assert.False(t, strings.HasPrefix(kind, "other"), "an answer of no nodeguard: %s", kind)
	}
}

// A running fleet split into two installs with different watch-filter
// values, as Cluster API splits its own controllers: each then guards only
// its Clusters and caches only their Machines, with a Lease and URL of its
// own; a Cluster relabelled from one to the other, in the documented order,
// stays guarded throughout. Through the split and the move, a dry-run delete
// of each blocked Node every 100 ms: every one denied.
func TestShardsSplitTheFleetByWatchFilter(t *testing.T) {
	mgmt, mgmtEnv := apiServerEnv(t)
	w1, w1Env := apiServerWith(t, current, nil)
	w2, w2Env := apiServerWith(t, current, nil)
	mgmtKube, dyn := clientsFor(t, mgmt)
	kube1, _ := clientsFor(t, w1)
	kube2, _ := clientsFor(t, w2)
	clients, err := ngkube.FromConfig(mgmt)
	require.NoError(t, err)
	ctx := context.Background()
	machines := current.GVR("cluster.x-k8s.io", "machines")

	for _, name := range []string{"dev", "two"} {
		writeCluster(t, dyn, name, map[string]any{fleet.ModeAnnotation: fleet.ModeWebhook})
	}
	clusterMachine(t, dyn, kube1, "dev", "dev-md-0")
	clusterMachine(t, dyn, kube2, "two", "two-md-0")
	// dev's Node without Cluster API's annotations: its Machine is then
	// found only through the caches (nodeRef, providerID), not by a fresh
	// read of the Machine the annotations name, so what a shard's caches
	// lack is what the move tests.
	_, err = kube1.CoreV1().Nodes().Patch(ctx, "dev-md-0", types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"cluster.x-k8s.io/cluster-name":null,"cluster.x-k8s.io/cluster-namespace":null,"cluster.x-k8s.io/machine":null}}}`),
		metav1.PatchOptions{})
	require.NoError(t, err)
	for _, k := range []kubernetes.Interface{kube1, kube2} {
		_, err := k.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "free"}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	workloadAdmin(t, ctx, w1Env, mgmtKube, "default", "dev")
	workloadAdmin(t, ctx, w2Env, mgmtKube, "default", "two")
	kubeconfig := adminKubeconfig(t, mgmtEnv)
	// The fleet as it runs before it is split: one install, no filter.
	unsharded, urlU := shardInstall(t, kubeconfig, "")

	guardedBy := func(c require.TestingT, cluster, shard string) {
		cg, err := dyn.Resource(fleet.ClusterGuards).Namespace("default").Get(ctx, cluster, metav1.GetOptions{})
		require.NoError(c, err)
		assert.Equal(c, shard, cg.GetLabels()[ngkube.WatchFilterLabel], "%s's ClusterGuard is written by shard %s", cluster, shard)
		assert.True(c, fleetStates(c, clients)["default/"+cluster].Guarded, "%s guarded", cluster)
	}
	webhookURL := func(c require.TestingT, k kubernetes.Interface) string {
		vwc, err := k.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, admission.Name, metav1.GetOptions{})
		require.NoError(c, err)
		return *vwc.Webhooks[0].ClientConfig.URL
	}
	cached := func(c require.TestingT, r *replica, kind string) float64 {
		v, ok := r.metric(c, "nodeguard_cached_objects", `kind="`+kind+`"`)
		require.True(c, ok, "nodeguard_cached_objects{kind=%q}", kind)
		return v
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		guardedBy(c, "dev", "")
		guardedBy(c, "two", "")
		assert.True(c, strings.HasPrefix(webhookURL(c, kube1), urlU+"/"))
		assert.True(c, strings.HasPrefix(webhookURL(c, kube2), urlU+"/"))
	}, 60*time.Second, 200*time.Millisecond, "both guarded by the install without a filter")

	// Split the running fleet, as operate.md says: label every object (the
	// install without a filter acts on all of them alike), start the shards,
	// stop the old install. A dry-run delete of each blocked Node every
	// 100 ms throughout.
	streams := []*blockedStream{streamBlocked(ctx, kube1, "dev-md-0", "DockerMachine default/dev-md-0"),
		streamBlocked(ctx, kube2, "two-md-0", "DockerMachine default/two-md-0")}
	time.Sleep(time.Second)
	split := time.Now()
	for name, shard := range map[string]string{"dev": "a", "two": "b"} {
		shardLabel(t, dyn, clustersGVR, name, shard)
		shardLabel(t, dyn, machines, name+"-md-0", shard)
		shardLabel(t, dyn, dockerMachine, name+"-md-0", shard)
	}
	a, urlA := shardInstall(t, kubeconfig, "a")
	b, urlB := shardInstall(t, kubeconfig, "b")
	unsharded.terminate(t)
	<-unsharded.exited
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		guardedBy(c, "dev", "a")
		guardedBy(c, "two", "b")
		assert.True(c, strings.HasPrefix(webhookURL(c, kube1), urlA+"/"), "dev's API server calls shard a")
		assert.True(c, strings.HasPrefix(webhookURL(c, kube2), urlB+"/"), "two's API server calls shard b")
	}, 60*time.Second, 200*time.Millisecond, "each Cluster guarded by its shard")
	t.Logf("fleet split into shards a and b %s after the labels were set", time.Since(split).Round(100*time.Millisecond))
	for i, s := range streams {
		answers := s.finish(t, 10)
		t.Logf("splitting, workload cluster %d: %d dry-run deletes of its blocked Node: %v", i+1, s.tries.Load(), answers)
		allDenied(t, answers)
	}

	t.Run("each shard guards only its Clusters, caches only their Machines, with a Lease and URL of its own", func(t *testing.T) {
		assert.True(t, strings.HasPrefix(webhookURL(t, kube1), urlA+"/"), "dev's API server calls shard a")
		assert.True(t, strings.HasPrefix(webhookURL(t, kube2), urlB+"/"), "two's API server calls shard b")
		for _, r := range []*replica{a, b} {
			assert.Equal(t, 1.0, cached(t, r, "Machine"), "shard %s caches its one Machine of two", r.name)
			assert.Equal(t, 1.0, cached(t, r, "DockerMachine"), "shard %s caches its one DockerMachine of two", r.name)
		}
		_, seen := a.metric(t, "nodeguard_workload_cluster_guarded", `cluster_name="two"`)
		assert.False(t, seen, "shard a does not look at two")
		_, seen = b.metric(t, "nodeguard_workload_cluster_guarded", `cluster_name="dev"`)
		assert.False(t, seen, "shard b does not look at dev")
		for _, lease := range []string{"nodeguard-fleet-a", "nodeguard-fleet-b"} {
			l, err := mgmtKube.CoordinationV1().Leases("default").Get(ctx, lease, metav1.GetOptions{})
			require.NoError(t, err, lease)
			assert.NotEmpty(t, *l.Spec.HolderIdentity, lease)
		}
		denied := dryRunDelete(ctx, kube1, "dev-md-0")
		require.Error(t, denied)
		assert.Contains(t, denied.Error(), "DockerMachine default/dev-md-0", "shard a judges dev's Node by the rule")
	})

	t.Run("a Cluster relabelled to the other shard stays guarded throughout", func(t *testing.T) {
		stream := streamBlocked(ctx, kube1, "dev-md-0", "DockerMachine default/dev-md-0")
		time.Sleep(time.Second)
		// The documented order: the Cluster first, then everything that
		// carries its name.
		moved := time.Now()
		shardLabel(t, dyn, clustersGVR, "dev", "b")
		// Shard b takes the route over while dev's Machine and DockerMachine
		// are still shard a's: it holds no object of dev and must say no
		// for what it cannot see.
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.True(c, strings.HasPrefix(webhookURL(c, kube1), urlB+"/"), "dev's API server calls shard b")
		}, 30*time.Second, 50*time.Millisecond)
		t.Logf("shard b took dev's route over %s after the Cluster was relabelled", time.Since(moved).Round(10*time.Millisecond))
		time.Sleep(2 * time.Second)
		shardLabel(t, dyn, dockerMachine, "dev-md-0", "b")
		time.Sleep(500 * time.Millisecond)
		shardLabel(t, dyn, machines, "dev-md-0", "b")
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			guardedBy(c, "dev", "b")
			assert.True(c, strings.HasPrefix(webhookURL(c, kube1), urlB+"/"), "dev's API server calls shard b")
			err := dryRunDelete(ctx, kube1, "dev-md-0")
			require.Error(c, err)
			assert.Contains(c, err.Error(), "DockerMachine default/dev-md-0", "shard b judges dev's Node by the rule")
		}, 60*time.Second, 200*time.Millisecond, "dev guarded by shard b")
		t.Logf("dev moved from shard a to shard b in %s", time.Since(moved).Round(100*time.Millisecond))
		// A while longer on shard b alone.
		answers := stream.finish(t, 20)
		t.Logf("during the move: %d dry-run deletes of dev's blocked Node: %v", stream.tries.Load(), answers)
		allDenied(t, answers)
		assert.Positive(t, answers[answerBlocked])
		assert.Positive(t, answers[answerNotHeld], "shard b was asked before it held dev")

		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.Equal(c, 0.0, cached(c, a, "Machine"), "shard a caches no Machine now")
			assert.Equal(c, 2.0, cached(c, b, "Machine"), "shard b caches both")
		}, 10*time.Second, 100*time.Millisecond)
		_, err := dyn.Resource(fleet.ClusterGuards).Namespace("default").Get(ctx, "dev", metav1.GetOptions{})
		require.NoError(t, err, "the ClusterGuard shard b wrote stays: shard a deletes only its own")
	})
}
