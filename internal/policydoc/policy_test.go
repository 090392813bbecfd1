package policydoc

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/policies"
)

// The links table is generated from the declaration the rule and the
// enforcer follow: every declared link is a row.
func TestLinksTableShowsEveryDeclaredLink(t *testing.T) {
	c, err := policies.Compile()
	require.NoError(t, err)
	_, semantics, err := libCustom(c)
	require.NoError(t, err)
	assert.NotEmpty(t, semantics)
	model, err := rule.LoadModel(context.Background(), c, nil)
	require.NoError(t, err)
	page, err := RenderPolicy(context.Background())
	require.NoError(t, err)
	require.NotEmpty(t, model.Links)
	for _, l := range model.Links {
		assert.Contains(t, string(page), "| `"+l.Type+"` | ")
	}
}

func TestPolicyPageHasEverySection(t *testing.T) {
	page, err := RenderPolicy(context.Background())
	require.NoError(t, err)
	for _, h := range []string{"## The rule in plain words", "## Links", "## Parameters", "## Decision semantics", "## Orphan Nodes", "Wider match (opt-in, off by default)", "## Adding a provider kind", "`lib.nodeguard.decide`", "`nodeguard.orphans.verdict`"} {
		assert.Contains(t, string(page), h)
	}
}
