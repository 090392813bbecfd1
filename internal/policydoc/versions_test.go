package policydoc_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/internal/policydoc"
)

func TestVersioningRules(t *testing.T) {
	v1 := policydoc.Entry{Version: "0.1.0", Decisions: "sha256:a", Sync: []string{"g/A"}}
	ledger := policydoc.Ledger{v1}
	changed := []string{"suite/x/case-1"}

	same, err := ledger.Record("k8snodeguard/src.rego", v1, nil)
	require.NoError(t, err)
	assert.Equal(t, ledger, same, "nothing changed: nothing to record")

	_, err = ledger.Record("k8snodeguard/src.rego", policydoc.Entry{Version: "0.1.0", Decisions: "sha256:b", Sync: v1.Sync}, changed)
	assert.ErrorContains(t, err, "decisions changed for suite/x/case-1, but version 0.1.0 already decided otherwise")

	_, err = ledger.Record("k8snodeguard/src.rego", policydoc.Entry{Version: "0.1.1", Decisions: "sha256:b", Sync: v1.Sync}, changed)
	assert.ErrorContains(t, err, "a patch bump (0.1.1) is not enough")

	minor, err := ledger.Record("k8snodeguard/src.rego", policydoc.Entry{Version: "0.2.0", Decisions: "sha256:b", Sync: v1.Sync}, changed)
	require.NoError(t, err)
	assert.Len(t, minor, 2)

	_, err = ledger.Record("k8snodeguard/src.rego", policydoc.Entry{Version: "0.2.0", Decisions: "sha256:a", Sync: []string{"g/A", "g/B"}}, nil)
	assert.ErrorContains(t, err, "syncs g/B, which 0.1.0 did not: requiring more synced data is a major bump")

	_, err = ledger.Record("k8snodeguard/src.rego", policydoc.Entry{Version: "1.0.0", Decisions: "sha256:a", Sync: []string{"g/A", "g/B"}}, nil)
	assert.NoError(t, err)

	_, err = ledger.Record("k8snodeguard/src.rego", policydoc.Entry{Version: "0.0.9", Decisions: "sha256:a", Sync: v1.Sync}, nil)
	assert.ErrorContains(t, err, "not above the last recorded version")

	_, err = ledger.Record("k8snodeguard/src.rego", policydoc.Entry{Version: "one", Decisions: "sha256:a"}, nil)
	assert.ErrorContains(t, err, "not semver")

	patch, err := ledger.Record("k8snodeguard/src.rego", policydoc.Entry{Version: "0.1.1", Decisions: "sha256:a", Sync: v1.Sync}, nil)
	require.NoError(t, err, "a patch bump with the same decisions is fine")
	raw, err := patch.Render("K8sNodeGuard")
	require.NoError(t, err)
	back, err := policydoc.ParseLedger(raw)
	require.NoError(t, err)
	assert.Equal(t, patch, back)
}

func TestChangelogNeedsTheVersion(t *testing.T) {
	assert.NoError(t, policydoc.CheckChangelog([]byte("# Changelog\n\n## K8sNodeGuard 0.2.0\n\n- x\n"), "K8sNodeGuard", "0.2.0"))
	assert.NoError(t, policydoc.CheckChangelog([]byte("## K8sNodeGuard [0.2.0] - 2026-11-29\n"), "K8sNodeGuard", "0.2.0"))
	assert.ErrorContains(t, policydoc.CheckChangelog([]byte("## K8sNodeGuard 0.1.0\n"), "K8sNodeGuard", "0.2.0"),
		"no `## K8sNodeGuard 0.2.0` section")
	// Each template's versions are its own.
	assert.ErrorContains(t, policydoc.CheckChangelog([]byte("## K8sNodeGuard 0.2.0\n"), "K8sNodeGuardExternal", "0.2.0"),
		"no `## K8sNodeGuardExternal 0.2.0` section")
}
