package nodes_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/nodes"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/internal/testlog"
)

// A Workload cluster removed while one of its Nodes was being judged: the
// verdict told after the removal brings back neither the ghost nor its
// series (a stale nodeguard_ghost_nodes would keep NodeguardGhostNode firing
// for a cluster nobody watches); added again, the cluster is judged again.
func TestAVerdictToldAfterItsClusterWentBringsNothingBack(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := nodes.NewGhostMetrics(reg)
	require.NoError(t, err)
	tr := nodes.NewGhostTracker(nodes.GhostOptions{Metrics: m, Confirm: time.Second})
	ctx := context.Background()
	target := nodes.GhostTarget{Cluster: "fleet/dev"}
	g := guard.Ghost{Node: "dev-md-0-x", ProviderID: "docker:////dev-md-0-x", Ghost: true, UID: "u1", Reason: "alive again"}
	t0 := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	series := func() int { return testutil.CollectAndCount(reg, "nodeguard_ghost_nodes") }
	confirm := func(at time.Time) {
		t.Helper()
		_, err := tr.Observe(ctx, target, g, at, false)
		require.NoError(t, err)
		_, err = tr.Observe(ctx, target, g, at.Add(time.Second), false)
		require.NoError(t, err)
	}

	confirm(t0)
	require.Len(t, tr.Ghosts(), 1)
	require.Equal(t, 1, series())

	tr.ForgetCluster("fleet/dev")
	assert.Empty(t, tr.Ghosts())
	assert.Zero(t, series())
	confirm(t0.Add(time.Minute))
	assert.Empty(t, tr.Ghosts(), "a verdict judged before the cluster went")
	assert.Zero(t, series(), "no series back for a cluster gone")
	tr.Forget("fleet/dev", g.Node)
	assert.Zero(t, series(), "nor when its Node is forgotten")

	tr.AddCluster("fleet/dev")
	confirm(t0.Add(2 * time.Minute))
	assert.Len(t, tr.Ghosts(), 1)
	assert.Equal(t, 1, series())
}

// With a decision log, a ghost confirmed and a ghost no more are logged;
// the verdicts between them, which change nothing reported, are not.
func TestGhostTransitionsAreDecisionLogged(t *testing.T) {
	var console testlog.Buffer
	dlog, err := rule.StartDecisionLog(context.Background(), rule.DecisionLogOptions{Console: true, ConsoleOutput: &console})
	require.NoError(t, err)
	tr := nodes.NewGhostTracker(nodes.GhostOptions{Confirm: time.Second, DecisionLog: dlog})
	ctx := context.Background()
	target := nodes.GhostTarget{Cluster: "fleet/dev"}
	g := guard.Ghost{Node: "dev-md-0-x", ProviderID: "docker:////dev-md-0-x", Ghost: true, UID: "u1", Reason: "alive again"}
	t0 := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	for _, at := range []time.Duration{0, time.Second, 2 * time.Second} {
		_, err := tr.Observe(ctx, target, g, t0.Add(at), false)
		require.NoError(t, err)
	}
	g.Ghost, g.Reason = false, ""
	_, err = tr.Observe(ctx, target, g, t0.Add(3*time.Second), false)
	require.NoError(t, err)
	lines := console.LinesAfter(t, dlog.Stop)
	require.Len(t, lines, 2)
	for i, want := range []string{"ghost", "ghost-no-more"} {
		assert.Equal(t, "nodeguard/ghost", lines[i]["path"])
		assert.Equal(t, want, lines[i]["custom"].(map[string]any)["transition"])
		assert.Equal(t, map[string]any{"cluster": "fleet/dev", "node": "dev-md-0-x", "uid": "u1", "providerID": "docker:////dev-md-0-x"}, lines[i]["input"])
		assert.Equal(t, want == "ghost", lines[i]["result"].(map[string]any)["ghost"])
	}
}
