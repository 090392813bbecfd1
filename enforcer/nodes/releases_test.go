package nodes_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/nodes"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/internal/testlog"
)

const cluster = "fleet/prod"

// world is what the caches and fresh reads say of each Node, and what the
// Nodes carry (as written).
type world struct {
	info    admission.PolicyInfo
	mu      sync.Mutex
	cached  map[string]guard.Release
	fresh   map[string]guard.Release
	ready   error
	on      map[string]admission.ReleaseVerdict
	writes  int
	failing bool
	leading bool
	freshN  int
	// hold, when set, holds fresh reads until it is closed.
	hold chan struct{}
}

func (w *world) judge(_ context.Context, nodes []*unstructured.Unstructured, _ string, fresh bool) ([]guard.Release, error) {
	w.mu.Lock()
	from, hold := w.cached, w.hold
	if fresh {
		w.freshN++
	}
	w.mu.Unlock()
	if fresh && hold != nil {
		<-hold
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if fresh {
		from = w.fresh
	}
	out := make([]guard.Release, len(nodes))
	for i, n := range nodes {
		out[i] = from[n.GetName()]
		out[i].UID = n.GetUID()
	}
	return out, nil
}

func (w *world) write(_ context.Context, node string, v admission.ReleaseVerdict) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failing {
		return errors.New("the workload API server is away")
	}
	w.on[node] = v
	w.writes++
	return nil
}

// node is a Node as the cache has it: carrying what was written on it.
func (w *world) node(name, uid string) *unstructured.Unstructured {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := &unstructured.Unstructured{}
	n.SetName(name)
	n.SetUID(types.UID(uid))
	a := map[string]string{}
	if v := w.on[name]; v.UID != "" {
		a[w.info.Released] = v.UID
	}
	if v := w.on[name]; v.Blocker != "" {
		a[w.info.Blocker] = v.Blocker
	}
	n.SetAnnotations(a)
	return n
}

func (w *world) carries(name string) admission.ReleaseVerdict {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.on[name]
}

func (w *world) set(f func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f()
}

func start(t *testing.T, m *nodes.ReleaseMetrics) (*world, *nodes.Publisher) {
	t.Helper()
	return startWith(t, m, nil)
}

// startWith is start with a decision log.
func startWith(t *testing.T, m *nodes.ReleaseMetrics, dlog *rule.DecisionLog) (*world, *nodes.Publisher) {
	t.Helper()
	info, err := admission.LoadPolicyInfo()
	require.NoError(t, err)
	w := &world{info: info, cached: map[string]guard.Release{}, fresh: map[string]guard.Release{}, on: map[string]admission.ReleaseVerdict{}, leading: true}
	p, err := nodes.NewPublisher(nodes.PublisherOptions{Judge: w.judge, Info: info, Metrics: m, DecisionLog: dlog,
		Ready: func() error {
			w.mu.Lock()
			defer w.mu.Unlock()
			return w.ready
		},
		Leading: func() bool {
			w.mu.Lock()
			defer w.mu.Unlock()
			return w.leading
		}})
	require.NoError(t, err)
	p.Enroll(cluster, w.write)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx, 10*time.Millisecond); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return w, p
}

// settle waits until the publisher has nothing left to do for name:
// what the Node carries stays the same for a while.
func carriesSoon(t *testing.T, w *world, name string, want admission.ReleaseVerdict) {
	t.Helper()
	assert.EventuallyWithT(t, func(c *assert.CollectT) { assert.Equal(c, want, w.carries(name)) }, 5*time.Second, 5*time.Millisecond)
}

func TestReleasedOnlyWhatFreshReadsConfirm(t *testing.T) {
	ctx := context.Background()
	w, p := start(t, nil)
	blocker := "DockerMachine default/lagging is being deleted but still exists."
	w.set(func() {
		w.cached["gone"], w.fresh["gone"] = guard.Release{Released: true}, guard.Release{Released: true}
		// The caches lag: they say released, a fresh read finds the DockerMachine.
		w.cached["lagging"], w.fresh["lagging"] = guard.Release{Released: true}, guard.Release{Blocker: blocker}
	})
	for _, n := range []*unstructured.Unstructured{w.node("gone", "u-gone"), w.node("lagging", "u-lagging"), w.node("running", "u-running")} {
		require.NoError(t, p.Judge(ctx, cluster, n))
	}
	carriesSoon(t, w, "gone", admission.ReleaseVerdict{UID: "u-gone"})
	carriesSoon(t, w, "lagging", admission.ReleaseVerdict{Blocker: blocker})
	assert.Equal(t, 2, w.writes, "a running Node carries nothing and is not written")

	// Judged again, carrying its verdict: no fresh read, no write.
	reads := w.freshN
	require.NoError(t, p.Judge(ctx, cluster, w.node("gone", "u-gone")))
	require.NoError(t, p.Judge(ctx, cluster, w.node("running", "u-running")))
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, reads, w.freshN)
	assert.Equal(t, 2, w.writes)

	// Someone took the release off (with the guard policy gone): written
	// again.
	w.set(func() { delete(w.on, "gone") })
	require.NoError(t, p.Judge(ctx, cluster, w.node("gone", "u-gone")))
	carriesSoon(t, w, "gone", admission.ReleaseVerdict{UID: "u-gone"})
}

func TestARevocationNeedsNoFreshRead(t *testing.T) {
	ctx := context.Background()
	w, p := start(t, nil)
	w.set(func() { w.cached["n"], w.fresh["n"] = guard.Release{Released: true}, guard.Release{Released: true} })
	require.NoError(t, p.Judge(ctx, cluster, w.node("n", "u-1")))
	carriesSoon(t, w, "n", admission.ReleaseVerdict{UID: "u-1"})

	// A link appears (a Machine that names it): revoked at once.
	w.set(func() { w.cached["n"] = guard.Release{} })
	reads := w.freshN
	require.NoError(t, p.Judge(ctx, cluster, w.node("n", "u-1")))
	carriesSoon(t, w, "n", admission.ReleaseVerdict{})
	assert.Equal(t, reads, w.freshN)
}

// A confirmation on fresh reads that a later verdict overtook is dropped: it
// never writes a release over the revocation that came after it.
func TestAConfirmationNeverOverwritesALaterRevocation(t *testing.T) {
	ctx := context.Background()
	w, p := start(t, nil)
	hold := make(chan struct{})
	w.set(func() {
		w.cached["n"], w.fresh["n"] = guard.Release{Released: true}, guard.Release{Released: true}
		w.hold = hold
	})
	require.NoError(t, p.Judge(ctx, cluster, w.node("n", "u-1")))
	require.Eventually(t, func() bool { w.mu.Lock(); defer w.mu.Unlock(); return w.freshN == 1 }, 5*time.Second, time.Millisecond)
	// While the fresh read is out, the caches see a new link.
	w.set(func() { w.cached["n"] = guard.Release{} })
	require.NoError(t, p.Judge(ctx, cluster, w.node("n", "u-1")))
	close(hold) // the fresh read, begun before the link, says released
	time.Sleep(100 * time.Millisecond)
	assert.Equal(t, admission.ReleaseVerdict{}, w.carries("n"))
	assert.Zero(t, w.writes, "nothing to write: it carried no release")
}

func TestARecreatedNodeIsJudgedAnew(t *testing.T) {
	ctx := context.Background()
	w, p := start(t, nil)
	w.set(func() { w.cached["n"], w.fresh["n"] = guard.Release{Released: true}, guard.Release{Released: true} })
	require.NoError(t, p.Judge(ctx, cluster, w.node("n", "u-1")))
	carriesSoon(t, w, "n", admission.ReleaseVerdict{UID: "u-1"})
	reads := w.freshN
	p.Forget(cluster, "n")
	// The new host is linked after all; its Node was created with the old
	// one's annotations (copied): the release names the old UID.
	w.set(func() { w.fresh["n"] = guard.Release{} })
	require.NoError(t, p.Judge(ctx, cluster, w.node("n", "u-2")))
	carriesSoon(t, w, "n", admission.ReleaseVerdict{})
	assert.Equal(t, reads+1, w.freshN, "another UID is another Node: confirmed again")
}

func TestNothingNewIsReleasedWhileTheCachesAreNotReady(t *testing.T) {
	ctx := context.Background()
	w, p := start(t, nil)
	w.set(func() {
		w.cached["kept"], w.fresh["kept"] = guard.Release{Released: true}, guard.Release{Released: true}
		w.cached["new"], w.fresh["new"] = guard.Release{Released: true}, guard.Release{Released: true}
	})
	require.NoError(t, p.Judge(ctx, cluster, w.node("kept", "u-kept")))
	carriesSoon(t, w, "kept", admission.ReleaseVerdict{UID: "u-kept"})
	w.set(func() { w.ready = errors.New("the management cluster's caches are recovering") })
	require.NoError(t, p.Judge(ctx, cluster, w.node("new", "u-new")))
	require.NoError(t, p.Judge(ctx, cluster, w.node("kept", "u-kept")))
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, admission.ReleaseVerdict{}, w.carries("new"), "nothing new")
	assert.Equal(t, admission.ReleaseVerdict{UID: "u-kept"}, w.carries("kept"), "what was released stays")
}

func TestAFailedWriteIsTriedAgain(t *testing.T) {
	ctx := context.Background()
	w, p := start(t, nil)
	w.set(func() {
		w.cached["n"], w.fresh["n"] = guard.Release{Released: true}, guard.Release{Released: true}
		w.failing = true
	})
	require.NoError(t, p.Judge(ctx, cluster, w.node("n", "u-1")))
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, admission.ReleaseVerdict{}, w.carries("n"))
	w.set(func() { w.failing = false })
	carriesSoon(t, w, "n", admission.ReleaseVerdict{UID: "u-1"})
}

// A replica that does not lead writes nothing; when it starts leading it
// writes every verdict that differs.
func TestOnlyTheLeaderWrites(t *testing.T) {
	ctx := context.Background()
	w, p := start(t, nil)
	w.set(func() {
		w.leading = false
		w.cached["n"], w.fresh["n"] = guard.Release{Released: true}, guard.Release{Released: true}
	})
	time.Sleep(30 * time.Millisecond) // the publisher sees it not leading
	require.NoError(t, p.Judge(ctx, cluster, w.node("n", "u-1")))
	time.Sleep(50 * time.Millisecond)
	assert.Zero(t, w.writes)
	w.set(func() { w.leading = true })
	carriesSoon(t, w, "n", admission.ReleaseVerdict{UID: "u-1"})
}

// The delete policy is bound once every Node was judged and none carries a
// release the rule does not confirm.
func TestSettledOnceNoNodeCarriesAStaleRelease(t *testing.T) {
	ctx := context.Background()
	w, p := start(t, nil)
	assert.False(t, p.Settled(cluster), "not judged yet")
	// Left from an earlier stay in the mode: its InfraMachine is back.
	w.set(func() { w.on["stale"] = admission.ReleaseVerdict{UID: "u-1"}; w.failing = true })
	require.NoError(t, p.Judge(ctx, cluster, w.node("stale", "u-1")))
	p.Synced(cluster)
	time.Sleep(30 * time.Millisecond)
	assert.False(t, p.Settled(cluster), "a release the rule does not give is still on a Node")
	w.set(func() { w.failing = false })
	carriesSoon(t, w, "stale", admission.ReleaseVerdict{})
	assert.True(t, p.Settled(cluster))
	assert.False(t, p.Settled("fleet/other"))
}

func TestOnlyEnrolledClustersAreJudged(t *testing.T) {
	ctx := context.Background()
	w, p := start(t, nil)
	require.NoError(t, p.Judge(ctx, "fleet/other", w.node("n", "u-1")))
	assert.Zero(t, w.freshN)
	p.Remove(cluster)
	assert.False(t, p.Enrolled(cluster))
}

// The writes and the Nodes carrying a release are counted by cluster, and
// dropped with the cluster.
func TestWritesAndReleasesAreCounted(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	m, err := nodes.NewReleaseMetrics(reg)
	require.NoError(t, err)
	w, p := start(t, m)
	w.set(func() { w.failing = true })
	for _, n := range []string{"a", "b"} {
		w.set(func() { w.cached[n], w.fresh[n] = guard.Release{Released: true}, guard.Release{Released: true} })
		require.NoError(t, p.Judge(ctx, cluster, w.node(n, "u-"+n)))
	}
	require.Eventually(t, func() bool { return testutil.ToFloat64(m.Writes(cluster, "error")) >= 2 }, 5*time.Second, time.Millisecond)
	w.set(func() { w.failing = false })
	carriesSoon(t, w, "a", admission.ReleaseVerdict{UID: "u-a"})
	carriesSoon(t, w, "b", admission.ReleaseVerdict{UID: "u-b"})
	assert.Equal(t, 2.0, testutil.ToFloat64(m.Writes(cluster, "ok")))
	assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP nodeguard_released_nodes Nodes of a workload cluster carrying nodeguard's release, as last written.
# TYPE nodeguard_released_nodes gauge
nodeguard_released_nodes{cluster="fleet/prod"} 2
`), "nodeguard_released_nodes"))
	p.Remove(cluster)
	n, err := testutil.GatherAndCount(reg)
	require.NoError(t, err)
	assert.Zero(t, n, "a removed cluster leaves no series")
}

// A change of what a Node carries, and nothing else (the leader's write,
// seen by a replica that does not lead), is recorded without a judgment: a
// replica that comes to lead revokes a release the old leader wrote on
// older caches, though no judgment of its own changed.
func TestWhatANodeCarriesIsFollowedWithoutAJudgment(t *testing.T) {
	ctx := context.Background()
	w, p := start(t, nil)
	w.set(func() { w.leading = false })
	time.Sleep(30 * time.Millisecond) // the publisher sees it not leading
	require.NoError(t, p.Judge(ctx, cluster, w.node("n", "u-1")))
	// The old leader released it; this replica sees only that.
	w.set(func() { w.on["n"] = admission.ReleaseVerdict{UID: "u-1"} })
	reads := w.freshN
	p.Carries(cluster, w.node("n", "u-1"))
	p.Carries(cluster, w.node("unjudged", "u-2")) // not judged yet: nothing to follow
	w.set(func() { w.leading = true })
	require.Eventually(t, func() bool { return w.carries("n") == admission.ReleaseVerdict{} }, 5*time.Second, 5*time.Millisecond, "revoked")
	assert.Equal(t, reads, w.freshN, "no judgment: a revocation needs no fresh read")
	assert.Equal(t, 1, w.writes)
}

// With a decision log, each verdict written is logged: the release, then
// its revocation.
func TestEachVerdictWrittenIsDecisionLogged(t *testing.T) {
	var console testlog.Buffer
	dlog, err := rule.StartDecisionLog(context.Background(), rule.DecisionLogOptions{Console: true, ConsoleOutput: &console})
	require.NoError(t, err)
	w, p := startWith(t, nil, dlog)
	w.set(func() {
		w.cached["md-0"], w.fresh["md-0"] = guard.Release{Released: true}, guard.Release{Released: true}
	})
	require.NoError(t, p.Judge(context.Background(), cluster, w.node("md-0", "uid-1")))
	carriesSoon(t, w, "md-0", admission.ReleaseVerdict{UID: "uid-1"})
	w.set(func() { w.cached["md-0"] = guard.Release{} })
	require.NoError(t, p.Judge(context.Background(), cluster, w.node("md-0", "uid-1")))
	carriesSoon(t, w, "md-0", admission.ReleaseVerdict{})
	lines := console.LinesAfter(t, dlog.Stop)
	require.Len(t, lines, 2)
	for i, want := range []string{"released", "revoked"} {
		assert.Equal(t, "nodeguard/release", lines[i]["path"])
		assert.Equal(t, map[string]any{"cluster": cluster, "node": "md-0"}, lines[i]["input"])
		assert.Equal(t, want, lines[i]["custom"].(map[string]any)["written"])
		assert.Equal(t, want == "released", lines[i]["result"].(map[string]any)["released"])
	}
}
