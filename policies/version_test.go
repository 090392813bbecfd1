package policies_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/internal/constraints"
	"github.com/nodeguard/nodeguard/policies"
)

// The binary reports the same version the generated template carries.
func TestTemplateVersionIsTheGeneratedTemplatesVersion(t *testing.T) {
	got, err := policies.TemplateVersion()
	require.NoError(t, err)
	info, err := constraints.LoadInfo()
	require.NoError(t, err)
	assert.Equal(t, info.Version, got)
	assert.Regexp(t, `^\d+\.\d+\.\d+$`, got)
}
