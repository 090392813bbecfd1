package policies_test

import (
	"context"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/policies"
)

// declared_parameters must stay one literal: a reference to another rule in
// it makes OPA build it on every decision (_complete reads it), which cost
// 7% more allocations per decision when tried (see parameters.rego).
func TestDeclaredParametersAreOneLiteral(t *testing.T) {
	c, err := policies.Compile()
	require.NoError(t, err)
	rules := c.GetRulesExact(ast.MustParseRef("data.lib.nodeguard.declared_parameters"))
	require.Len(t, rules, 1)
	r := rules[0]
	assert.True(t, r.Body.Equal(ast.NewBody(ast.NewExpr(ast.BooleanTerm(true)))), "declared_parameters has a body: %v", r.Body)
	ast.WalkRefs(r.Head.Value, func(ref ast.Ref) bool {
		t.Errorf("declared_parameters refers to %v; write the value in place", ref)
		return true
	})
	ast.WalkVars(r.Head.Value, func(v ast.Var) bool {
		t.Errorf("declared_parameters uses variable %v; write the value in place", v)
		return true
	})
}

func TestDeclaredParametersDecode(t *testing.T) {
	c, err := policies.Compile()
	require.NoError(t, err)
	declared, err := policies.DeclaredParameters(context.Background(), c)
	require.NoError(t, err)
	defaults, err := policies.DefaultParameters(context.Background(), c)
	require.NoError(t, err)
	require.Len(t, declared, len(defaults))
	for name, p := range declared {
		assert.Equal(t, defaults[name], p.Default, name)
		assert.NotEmpty(t, p.Schema["type"], name)
		assert.NotEmpty(t, p.Description, name)
	}
}
