package enforcement_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/enforcer/enforcement"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]enforcement.Action{"": enforcement.Deny, "deny": enforcement.Deny, "warn": enforcement.Warn, "dryrun": enforcement.DryRun} {
		got, err := enforcement.Parse(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got)
	}
	_, err := enforcement.Parse("Warn")
	assert.ErrorContains(t, err, "want deny, warn or dryrun")
}

// A Cluster's annotation overrides the default; a misspelt one keeps the
// default and says so.
func TestOf(t *testing.T) {
	a, err := enforcement.Of(nil, enforcement.Warn)
	require.NoError(t, err)
	assert.Equal(t, enforcement.Warn, a)
	a, err = enforcement.Of(map[string]string{enforcement.Annotation: "dryrun"}, enforcement.Deny)
	require.NoError(t, err)
	assert.Equal(t, enforcement.DryRun, a)
	a, err = enforcement.Of(map[string]string{enforcement.Annotation: "audit"}, enforcement.Deny)
	assert.Error(t, err)
	assert.Equal(t, enforcement.Deny, a)
	assert.True(t, enforcement.Deny.Enforced())
	assert.False(t, enforcement.Warn.Enforced())
}
