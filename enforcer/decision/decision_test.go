package decision_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/enforcer/decision"
	"github.com/nodeguard/nodeguard/enforcer/engine"
)

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
	eval, err := engine.New(context.Background())
	require.NoError(t, err)
	node := map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": "n"}}
	kind := map[string]any{"group": "", "version": "v1", "kind": "Node"}
	for want, review := range map[string]map[string]any{
		decision.ReasonNoLink:      {"operation": "DELETE", "kind": kind, "name": "n", "oldObject": node},
		decision.ReasonNotJudged:   {"operation": "UPDATE", "kind": kind, "name": "n", "oldObject": node},
		decision.ReasonUnjudgeable: {"operation": "DELETE", "kind": kind, "name": "n"},
	} {
		d, err := decision.Evaluate(context.Background(), eval, decision.Input{Review: review})
		require.NoError(t, err)
		assert.Equal(t, want, d.Reason, "%v", d.Messages)
	}
}
