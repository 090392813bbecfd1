package rule_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/enforcer/rule"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]rule.Action{"": rule.ActionDeny, "deny": rule.ActionDeny, "warn": rule.ActionWarn, "dryrun": rule.ActionDryRun} {
		got, err := rule.ParseAction(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got)
	}
	_, err := rule.ParseAction("Warn")
	assert.ErrorContains(t, err, "want deny, warn or dryrun")
}

// A Cluster's annotation overrides the default; a misspelt one keeps the
// default and says so.
func TestOf(t *testing.T) {
	a, err := rule.ActionOf(nil, rule.ActionWarn)
	require.NoError(t, err)
	assert.Equal(t, rule.ActionWarn, a)
	a, err = rule.ActionOf(map[string]string{rule.ActionAnnotation: "dryrun"}, rule.ActionDeny)
	require.NoError(t, err)
	assert.Equal(t, rule.ActionDryRun, a)
	a, err = rule.ActionOf(map[string]string{rule.ActionAnnotation: "audit"}, rule.ActionDeny)
	assert.Error(t, err)
	assert.Equal(t, rule.ActionDeny, a)
	assert.True(t, rule.ActionDeny.Enforced())
	assert.False(t, rule.ActionWarn.Enforced())
}
