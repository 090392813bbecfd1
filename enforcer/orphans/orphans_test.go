package orphans_test

import (
	"context"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/enforcer/orphans"
	"github.com/nodeguard/nodeguard/policies"
)

// The Go default (flags) and the Rego default (entry point without grace)
// are one number.
func TestDefaultGraceMatchesTheRego(t *testing.T) {
	c, err := policies.Compile()
	require.NoError(t, err)
	rs, err := rego.New(rego.Query("data.nodeguard.orphans.default_grace"), rego.Compiler(c)).Eval(context.Background())
	require.NoError(t, err)
	require.Len(t, rs, 1)
	d, err := time.ParseDuration(rs[0].Expressions[0].Value.(string))
	require.NoError(t, err)
	assert.Equal(t, orphans.DefaultGrace, d)
}

func TestEvaluatorPassesEveryInput(t *testing.T) {
	ctx := context.Background()
	e, err := orphans.NewEvaluator(ctx)
	require.NoError(t, err)
	node := map[string]any{
		"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": "n", "annotations": map[string]any{
			"cluster.x-k8s.io/cluster-name": "dev", "cluster.x-k8s.io/cluster-namespace": "default", "cluster.x-k8s.io/machine": "m",
		}},
		"spec":   map[string]any{"providerID": "docker:////n"},
		"status": map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": "Unknown", "lastTransitionTime": "2026-11-30T11:00:00Z"}}},
	}
	// A DockerMachine of another host: the cluster uses docker:// providerIDs.
	inv := map[string]any{"namespace": map[string]any{"default": map[string]any{"infrastructure.cluster.x-k8s.io/v1beta2": map[string]any{
		"DockerMachine": map[string]any{"other": map[string]any{"metadata": map[string]any{"name": "other"}, "spec": map[string]any{"providerID": "docker:////other"}}},
	}}}}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	v, err := e.Evaluate(ctx, orphans.Input{Node: node, Inventory: inv, Now: now, Grace: 59 * time.Minute})
	require.NoError(t, err)
	assert.True(t, v.Orphan)
	assert.Equal(t, "default/m", v.Machine)
	assert.Equal(t, "default/dev", v.Cluster)
	assert.Empty(t, v.Kept)
	v, err = e.Evaluate(ctx, orphans.Input{Node: node, Inventory: inv, Now: now, Grace: 61 * time.Minute})
	require.NoError(t, err)
	assert.False(t, v.Orphan)
	// Without the evidence, the absence of a DockerMachine proves nothing.
	v, err = e.Evaluate(ctx, orphans.Input{Node: node, Now: now, Grace: 59 * time.Minute})
	require.NoError(t, err)
	assert.False(t, v.Orphan)
	// A clock an hour behind sees the Node NotReady for no time at all.
	v, err = e.Evaluate(ctx, orphans.Input{Node: node, Inventory: inv, Now: now.Add(-time.Hour), Grace: time.Second})
	require.NoError(t, err)
	assert.False(t, v.Orphan)
}
