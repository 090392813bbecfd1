package policies_test

import (
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/policies"
)

// Regal's missing-metadata rule checks that annotations exist; reviewers
// (and docs/policy.md) need a title and a description on each.
func TestEveryPackageAndPublicRuleHasTitleAndDescription(t *testing.T) {
	c, err := policies.Compile()
	require.NoError(t, err)
	as := c.GetAnnotationSet()
	complete := func(a *ast.Annotations) bool { return a != nil && a.Title != "" && a.Description != "" }
	for file, m := range c.Modules {
		assert.True(t, complete(as.GetPackageScope(m.Package)), "%s: package %s needs METADATA with title and description", file, m.Package.Path)
		for _, r := range m.Rules {
			name := r.Head.Ref().String()
			if strings.HasPrefix(name, "_") {
				continue
			}
			ok := complete(as.GetDocumentScope(r.Ref().GroundPrefix()))
			for _, a := range as.GetRuleScope(r) {
				ok = ok || complete(a)
			}
			assert.True(t, ok, "%s:%d: rule %s needs METADATA with title and description", file, r.Location.Row, name)
		}
	}
}
