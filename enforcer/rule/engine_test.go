package rule_test

import (
	"context"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/policies"
)

func TestKindsTakeTheRulesDefaultsForWhatIsNotGiven(t *testing.T) {
	eval, err := rule.NewEngine(context.Background())
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

// compile compiles the embedded policies with edit applied to their sources.
func compile(t *testing.T, edit func(modules map[string]string)) *ast.Compiler {
	t.Helper()
	files, err := policies.All()
	require.NoError(t, err)
	modules := map[string]string{}
	for _, f := range files {
		modules[f.Path] = f.Source
	}
	edit(modules)
	c, err := ast.CompileModulesWithOpt(modules, ast.CompileOpts{ParserOptions: ast.ParserOptions{RegoVersion: ast.RegoV1}})
	require.NoError(t, err)
	return c
}

// The orphan criteria come whole or not at all: a policy with some of them
// is a broken one, said at start.
func TestAPolicyWithPartOfTheOrphanCriteriaIsRefused(t *testing.T) {
	c := compile(t, func(modules map[string]string) {
		src := modules["nodeguard/verdicts.rego"]
		require.Contains(t, src, "\norphan_screen := {")
		modules["nodeguard/verdicts.rego"] = strings.Replace(src, "\norphan_screen := {", "\nnot_the_screen := {", 1)
	})
	_, err := rule.CompileEngine(context.Background(), c, nil, rule.Policy{Source: rule.SourceBundle})
	assert.ErrorContains(t, err, "the policy has orphan criteria but no [data.nodeguard.orphan_screen]")
}

// Every entry point's answer is decoded into its Go type; an answer of
// another shape is an error, never a zero value taken for an answer.
func TestAnAnswerOfAnotherShapeIsAnError(t *testing.T) {
	ctx := context.Background()
	c := compile(t, func(modules map[string]string) {
		src := modules["nodeguard/verdicts.rego"]
		require.Contains(t, src, `"recheckAt": orphans.recheck_at(`)
		modules["nodeguard/verdicts.rego"] = strings.Replace(src, `"recheckAt": orphans.recheck_at(`, `"recheckAt": 7, "was": orphans.recheck_at(`, 1)
	})
	e, err := rule.CompileEngine(ctx, c, nil, rule.Policy{Source: rule.SourceBundle})
	require.NoError(t, err)
	input := map[string]any{"node": map[string]any{"metadata": map[string]any{"name": "n"}}, "now": "2026-11-30T12:00:00Z"}
	_, err = rule.Run[struct {
		Passes    bool   `json:"passes"`
		RecheckAt string `json:"recheckAt"`
	}](ctx, e, rule.ScreenEntry, input)
	assert.ErrorContains(t, err, `evaluate data.nodeguard.orphan_screen: field "recheckAt": want a string, got number`)
	_, err = rule.Run[struct {
		Passes bool   `json:"passes"`
		Other  string `json:"other"`
	}](ctx, e, rule.ScreenEntry, input)
	assert.ErrorContains(t, err, `field "other" is missing`)
}
