package rule_test

import (
	"context"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/policies"
)

func TestDenyIsShapedLikeTheRulesDenials(t *testing.T) {
	d := rule.Denial(rule.ReasonNotReady, "not yet")
	assert.False(t, d.Allowed)
	assert.Equal(t, rule.ReasonNotReady, d.Reason)
	assert.Equal(t, []string{"not yet"}, d.Messages)
	// Empty lists, not nil: -o json prints [] as the rule's answers do.
	assert.NotNil(t, d.Blockers)
	assert.NotNil(t, d.Unverified)
	assert.NotNil(t, d.Warnings)
}

func TestEvaluateNamesTheReasonTheRuleGives(t *testing.T) {
	eval, err := rule.NewEngine(context.Background())
	require.NoError(t, err)
	node := map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": "n"}, "spec": map[string]any{"providerID": "docker:////n"}}
	kind := map[string]any{"group": "", "version": "v1", "kind": "Node"}
	del := map[string]any{"operation": "DELETE", "kind": kind, "name": "n", "oldObject": node,
		"userInfo": map[string]any{"username": "u", "groups": []any{"ops"}}}
	infra := func(kind string) map[string]any {
		return map[string]any{"namespace": map[string]any{"default": map[string]any{"infrastructure.cluster.x-k8s.io/v1beta2": map[string]any{
			kind: map[string]any{"n": map[string]any{"metadata": map[string]any{"namespace": "default", "name": "n"}, "spec": map[string]any{"providerID": "docker:////n"}}},
		}}}}
	}
	machine := map[string]any{"namespace": map[string]any{"default": map[string]any{"cluster.x-k8s.io/v1beta2": map[string]any{
		"Machine": map[string]any{"n": map[string]any{"metadata": map[string]any{"namespace": "default", "name": "n"}, "status": map[string]any{"nodeRef": map[string]any{"name": "n"}},
			"spec": map[string]any{"infrastructureRef": map[string]any{"apiGroup": "example.com", "kind": "FooMachine", "name": "n"}}}},
	}}}}
	exempt, err := rule.NewParameters(map[string]any{"exemptGroups": []any{"ops"}})
	require.NoError(t, err)
	for want, in := range map[string]rule.Input{
		rule.ReasonNoLink:      {Review: del},
		rule.ReasonNotJudged:   {Review: map[string]any{"operation": "UPDATE", "kind": kind, "name": "n", "oldObject": node}},
		rule.ReasonUnjudgeable: {Review: map[string]any{"operation": "DELETE", "kind": kind, "name": "n"}},
		rule.ReasonBlocked:     {Review: del, Inventory: infra("DockerMachine")},
		rule.ReasonUnverified:  {Review: del, Inventory: machine},
		rule.ReasonExempt:      {Review: del, Inventory: infra("DockerMachine"), Parameters: exempt},
	} {
		d, err := rule.Evaluate(context.Background(), eval, in)
		require.NoError(t, err)
		assert.Equal(t, want, d.Reason, "%v", d.Messages)
	}
}

// Go never infers the reason: it passes on the decision's own, and a policy
// whose decision gives none yields no decision (and callers deny).
func TestTheReasonIsTheDecisions(t *testing.T) {
	ctx := context.Background()
	files, err := policies.All()
	require.NoError(t, err)
	review := map[string]any{"operation": "DELETE", "kind": map[string]any{"group": "", "version": "v1", "kind": "Node"}, "name": "n"}
	for name, tc := range map[string]struct{ decision, want string }{
		"none":    {`{"allowed": true, "blockers": [], "unverified": [], "messages": [], "warnings": []}`, `field "reason" is missing`},
		"empty":   {`{"allowed": true, "reason": "", "blockers": [], "unverified": [], "messages": [], "warnings": []}`, `gives no reason`},
		"its own": {`{"allowed": false, "reason": "unjudgeable", "blockers": [], "unverified": [], "messages": ["no"], "warnings": []}`, ""},
	} {
		t.Run(name, func(t *testing.T) {
			modules := map[string]string{}
			for _, f := range files {
				modules[f.Path] = f.Source
			}
			modules[policies.EnforcerEntry] = "package nodeguard\n\ndecision := " + tc.decision + "\n"
			compiled, err := ast.CompileModulesWithOpt(modules, ast.CompileOpts{ParserOptions: ast.ParserOptions{RegoVersion: ast.RegoV1}})
			require.NoError(t, err)
			eval, err := rule.CompileEngine(ctx, compiled, nil, rule.Policy{Source: rule.SourceBundle})
			require.NoError(t, err)
			d, err := rule.Evaluate(ctx, eval, rule.Input{Review: review})
			if tc.want == "" {
				require.NoError(t, err)
				assert.Equal(t, rule.ReasonUnjudgeable, d.Reason)
				return
			}
			assert.ErrorContains(t, err, tc.want)
		})
	}
}
