package policydoc

import (
	"context"
	"regexp"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/policies"
)

// The links table is prose in the library's METADATA; it must name exactly
// the link types the rule produces.
func TestLinksTableNamesTheRulesLinkTypes(t *testing.T) {
	c, err := policies.Compile()
	require.NoError(t, err)
	_, links, semantics, err := libCustom(c)
	require.NoError(t, err)
	assert.NotEmpty(t, semantics)
	var documented []string
	for _, l := range links {
		documented = append(documented, l.Type)
		assert.NotEmpty(t, l.When, l.Type)
		assert.NotEmpty(t, l.Blocks, l.Type)
	}
	lib, err := policies.Read("lib/nodeguard/nodeguard.rego")
	require.NoError(t, err)
	// Link types are the quoted camelCase words the rule builds links from;
	// parameter names (infraMachineKinds, ...) look alike and are left out.
	params, err := policies.DefaultParameters(context.Background(), c)
	require.NoError(t, err)
	used := map[string]bool{}
	for _, m := range regexp.MustCompile(`"((?:machine|node|infra|pool)[A-Z][A-Za-z]+)"`).FindAllStringSubmatch(lib.Source, -1) {
		if _, isParam := params[m[1]]; !isParam {
			used[m[1]] = true
		}
	}
	var inRule []string
	for k := range used {
		inRule = append(inRule, k)
	}
	sort.Strings(inRule)
	sort.Strings(documented)
	assert.Equal(t, inRule, documented)
}

func TestPolicyPageHasEverySection(t *testing.T) {
	page, err := RenderPolicy(context.Background())
	require.NoError(t, err)
	for _, h := range []string{"## The rule in plain words", "## Links", "## Parameters", "## Decision semantics", "## Orphan Nodes", "Wider match (opt-in, off by default)", "## Adding a provider kind", "`lib.nodeguard.decide`", "`nodeguard.orphans.verdict`"} {
		assert.Contains(t, string(page), h)
	}
}
