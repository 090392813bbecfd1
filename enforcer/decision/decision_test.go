package decision_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeguard/nodeguard/enforcer/decision"
)

func TestKindsTakeTheRulesDefaultsForWhatIsNotGiven(t *testing.T) {
	eval, err := decision.NewEvaluator(context.Background())
	require.NoError(t, err)
	infra, pools, err := eval.Kinds(nil)
	require.NoError(t, err)
	assert.Contains(t, infra, schema.GroupKind{Group: "infrastructure.cluster.x-k8s.io", Kind: "DockerMachine"})
	assert.NotEmpty(t, pools)

	infra, pools2, err := eval.Kinds(map[string]any{"infraMachineKinds": []any{map[string]any{"group": "example.com", "kind": "BareMetal"}}})
	require.NoError(t, err)
	assert.Equal(t, []schema.GroupKind{{Group: "example.com", Kind: "BareMetal"}}, infra)
	assert.Equal(t, pools, pools2, "pools not given: the defaults")

	_, _, err = eval.Kinds(map[string]any{"infraMachineKinds": "DockerMachine"})
	assert.ErrorContains(t, err, "parameter infraMachineKinds: want a list of {group, kind}")
	_, _, err = eval.Kinds(map[string]any{"infraMachinePoolKinds": []any{map[string]any{"group": "g"}}})
	assert.ErrorContains(t, err, "parameter infraMachinePoolKinds[0]: want {group, kind}")
}

func TestDenyIsShapedLikeTheRulesDenials(t *testing.T) {
	d := decision.Deny(decision.ReasonNotReady, "not yet")
	assert.False(t, d.Allowed)
	assert.Equal(t, decision.ReasonNotReady, d.Reason)
	assert.Equal(t, []string{"not yet"}, d.Messages)
	// Empty lists, not nil: -o json prints [] as the rule's answers do.
	assert.NotNil(t, d.Blockers)
	assert.NotNil(t, d.Unverified)
	assert.NotNil(t, d.Warnings)
}

func TestEvaluateNamesTheReasonTheRuleGives(t *testing.T) {
	eval, err := decision.NewEvaluator(context.Background())
	require.NoError(t, err)
	node := map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": "n"}}
	kind := map[string]any{"group": "", "version": "v1", "kind": "Node"}
	for want, review := range map[string]map[string]any{
		decision.ReasonNoLink:      {"operation": "DELETE", "kind": kind, "name": "n", "oldObject": node},
		decision.ReasonNotJudged:   {"operation": "UPDATE", "kind": kind, "name": "n", "oldObject": node},
		decision.ReasonUnjudgeable: {"operation": "DELETE", "kind": kind, "name": "n"},
	} {
		d, err := eval.Evaluate(context.Background(), decision.Input{Review: review})
		require.NoError(t, err)
		assert.Equal(t, want, d.Reason, "%v", d.Messages)
	}
}
