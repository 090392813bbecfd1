package nodes_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/nodes"
)

// world is what the caches and fresh reads say of each Node, and what was
// written.
type world struct {
	mu      sync.Mutex
	cached  map[string]guard.Release
	fresh   map[string]guard.Release
	ready   error
	written []map[string]string
	failing bool
	freshN  int
}

func (w *world) judge(_ context.Context, nodes []*unstructured.Unstructured, _ string, fresh bool) ([]guard.Release, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	from := w.cached
	if fresh {
		from, w.freshN = w.fresh, w.freshN+1
	}
	out := make([]guard.Release, len(nodes))
	for i, n := range nodes {
		out[i] = from[n.GetName()]
		out[i].UID = n.GetUID()
	}
	return out, nil
}

func (w *world) write(_ context.Context, cm *corev1.ConfigMap) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failing {
		return errors.New("the workload API server is away")
	}
	w.written = append(w.written, cm.Data)
	return nil
}

func (w *world) last() map[string]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.written) == 0 {
		return nil
	}
	return w.written[len(w.written)-1]
}

func node(name, uid string) *unstructured.Unstructured {
	n := &unstructured.Unstructured{}
	n.SetName(name)
	n.SetUID(types.UID(uid))
	return n
}

func start(t *testing.T) (*world, *nodes.Publisher) {
	t.Helper()
	w := &world{cached: map[string]guard.Release{}, fresh: map[string]guard.Release{}}
	p, err := nodes.NewPublisher(nodes.PublisherOptions{Judge: w.judge, Ready: func() error {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.ready
	}})
	require.NoError(t, err)
	p.Enroll("fleet/prod", w.write)
	return w, p
}

func TestReleasedOnlyWhatFreshReadsConfirm(t *testing.T) {
	ctx := context.Background()
	w, p := start(t)
	w.cached["gone"], w.fresh["gone"] = guard.Release{Released: true}, guard.Release{Released: true}
	// The caches lag: they say released, a fresh read finds the DockerMachine.
	w.cached["lagging"], w.fresh["lagging"] = guard.Release{Released: true}, guard.Release{Blocker: "DockerMachine default/lagging is being deleted but still exists."}
	w.cached["running"] = guard.Release{}
	for _, n := range []*unstructured.Unstructured{node("gone", "u-gone"), node("lagging", "u-lagging"), node("running", "u-running")} {
		require.NoError(t, p.Judge(ctx, "fleet/prod", n))
	}
	p.Flush(ctx)
	assert.Nil(t, w.last(), "nothing is written before every Node was judged once")
	p.Synced("fleet/prod")
	p.Flush(ctx)
	assert.Equal(t, map[string]string{"gone": "u-gone", "blocker_lagging": "DockerMachine default/lagging is being deleted but still exists."}, w.last())

	// Judged again with nothing changed: no fresh read, no write.
	reads, writes := w.freshN, len(w.written)
	require.NoError(t, p.Judge(ctx, "fleet/prod", node("gone", "u-gone")))
	p.Flush(ctx)
	assert.Equal(t, reads, w.freshN)
	assert.Len(t, w.written, writes)
}

func TestARevocationNeedsNoFreshRead(t *testing.T) {
	ctx := context.Background()
	w, p := start(t)
	w.cached["n"], w.fresh["n"] = guard.Release{Released: true}, guard.Release{Released: true}
	require.NoError(t, p.Judge(ctx, "fleet/prod", node("n", "u-1")))
	p.Synced("fleet/prod")
	p.Flush(ctx)
	require.Equal(t, map[string]string{"n": "u-1"}, w.last())

	// A link appears (a Machine that names it): revoked at once.
	w.cached["n"] = guard.Release{}
	reads := w.freshN
	require.NoError(t, p.Judge(ctx, "fleet/prod", node("n", "u-1")))
	p.Flush(ctx)
	assert.Empty(t, w.last())
	assert.Equal(t, reads, w.freshN)
}

func TestARecreatedNodeIsJudgedAnew(t *testing.T) {
	ctx := context.Background()
	w, p := start(t)
	w.cached["n"], w.fresh["n"] = guard.Release{Released: true}, guard.Release{Released: true}
	require.NoError(t, p.Judge(ctx, "fleet/prod", node("n", "u-1")))
	p.Synced("fleet/prod")
	reads := w.freshN
	p.Forget("fleet/prod", "n")
	w.fresh["n"] = guard.Release{} // the new host is linked after all
	require.NoError(t, p.Judge(ctx, "fleet/prod", node("n", "u-2")))
	assert.Equal(t, reads+1, w.freshN, "another UID is another Node: confirmed again")
	p.Flush(ctx)
	assert.Empty(t, w.last())
}

func TestNothingNewIsReleasedWhileTheCachesAreNotReady(t *testing.T) {
	ctx := context.Background()
	w, p := start(t)
	w.cached["kept"], w.fresh["kept"] = guard.Release{Released: true}, guard.Release{Released: true}
	w.cached["new"], w.fresh["new"] = guard.Release{Released: true}, guard.Release{Released: true}
	require.NoError(t, p.Judge(ctx, "fleet/prod", node("kept", "u-kept")))
	p.Synced("fleet/prod")
	w.ready = errors.New("the management cluster's caches are recovering")
	require.NoError(t, p.Judge(ctx, "fleet/prod", node("new", "u-new")))
	require.NoError(t, p.Judge(ctx, "fleet/prod", node("kept", "u-kept")))
	p.Flush(ctx)
	assert.Equal(t, map[string]string{"kept": "u-kept"}, w.last(), "what was released stays; nothing new")
}

func TestAFailedWriteIsTriedAgain(t *testing.T) {
	ctx := context.Background()
	w, p := start(t)
	w.cached["n"], w.fresh["n"] = guard.Release{Released: true}, guard.Release{Released: true}
	require.NoError(t, p.Judge(ctx, "fleet/prod", node("n", "u-1")))
	p.Synced("fleet/prod")
	w.failing = true
	p.Flush(ctx)
	assert.Nil(t, w.last())
	w.failing = false
	p.Flush(ctx)
	assert.Equal(t, map[string]string{"n": "u-1"}, w.last())
}

func TestOnlyEnrolledClustersAreJudged(t *testing.T) {
	ctx := context.Background()
	w, p := start(t)
	require.NoError(t, p.Judge(ctx, "fleet/other", node("n", "u-1")))
	assert.Zero(t, w.freshN)
	p.Remove("fleet/prod")
	assert.False(t, p.Enrolled("fleet/prod"))
}

// The writes, the Nodes listed and those a full ConfigMap left out are
// counted by cluster, and dropped with the cluster.
func TestWritesAndOmissionsAreCounted(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	m, err := nodes.NewReleaseMetrics(reg)
	require.NoError(t, err)
	w := &world{cached: map[string]guard.Release{}, fresh: map[string]guard.Release{}}
	// Room for two of the three released Nodes (name and UID: 4 bytes each).
	p, err := nodes.NewPublisher(nodes.PublisherOptions{Judge: w.judge, Ready: func() error { return nil }, Limit: 8, Metrics: m})
	require.NoError(t, err)
	p.Enroll("fleet/prod", w.write)
	for _, n := range []string{"a", "b", "c"} {
		w.cached[n], w.fresh[n] = guard.Release{Released: true}, guard.Release{Released: true}
		require.NoError(t, p.Judge(ctx, "fleet/prod", node(n, "u-"+n)))
	}
	p.Synced("fleet/prod")
	w.failing = true
	p.Flush(ctx)
	w.failing = false
	p.Flush(ctx)
	assert.Len(t, w.last(), 2)
	assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP nodeguard_release_omitted_nodes Released Nodes left out of a workload cluster's last write because the ConfigMap was full: their deletes are denied there.
# TYPE nodeguard_release_omitted_nodes gauge
nodeguard_release_omitted_nodes{cluster="fleet/prod"} 1
# HELP nodeguard_release_writes_total Writes of the released Nodes into a workload cluster in mode admission-policy, by result: ok, error (tried again at the next batch).
# TYPE nodeguard_release_writes_total counter
nodeguard_release_writes_total{cluster="fleet/prod",result="error"} 1
nodeguard_release_writes_total{cluster="fleet/prod",result="ok"} 1
# HELP nodeguard_released_nodes Nodes listed as released in a workload cluster at its last write.
# TYPE nodeguard_released_nodes gauge
nodeguard_released_nodes{cluster="fleet/prod"} 2
`)))
	p.Remove("fleet/prod")
	n, err := testutil.GatherAndCount(reg)
	require.NoError(t, err)
	assert.Zero(t, n, "a removed cluster leaves no series")
}
