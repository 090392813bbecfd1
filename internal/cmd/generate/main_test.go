package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/internal/policydoc"
)

const repo = "../../.."

func TestCommittedFilesAreGenerated(t *testing.T) {
	require.NoError(t, run(context.Background(), repo, true))
}

// A decision that differs from the committed snapshot under the same version
// fails the check, naming the scenario. The Rego cannot be changed under a
// test (it is embedded), so the committed side changes instead: a copy of the
// repository whose ledger and snapshot say the current version decided
// otherwise.
func TestChangedDecisionWithoutVersionBumpFailsNamingTheScenario(t *testing.T) {
	root := t.TempDir()
	for _, dir := range []string{"constraints", "examples", "docs"} {
		require.NoError(t, os.CopyFS(filepath.Join(root, dir), os.DirFS(filepath.Join(repo, dir))))
	}
	for _, file := range []string{"CHANGELOG.md", "versions.yaml"} {
		raw, err := os.ReadFile(filepath.Join(repo, file))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(root, file), raw, 0o600))
	}

	snapshot := filepath.Join(root, "docs", "decisions.md")
	raw, err := os.ReadFile(snapshot)
	require.NoError(t, err)
	row := "| `suite/default-constraint/capi-order-infra-gone-is-allowed` | allowed | no-link | - |"
	require.Contains(t, string(raw), row)
	require.NoError(t, os.WriteFile(snapshot, []byte(strings.Replace(string(raw), row,
		"| `suite/default-constraint/capi-order-infra-gone-is-allowed` | denied | blocked | DockerMachine default/x via infraProviderID |", 1)), 0o600))
	ledger := filepath.Join(root, "versions.yaml")
	raw, err = os.ReadFile(ledger)
	require.NoError(t, err)
	entries, err := policydoc.ParseLedger(raw)
	require.NoError(t, err)
	current := &entries[len(entries)-1] // oldest first: the last entry is the current version
	current.Decisions = strings.Replace(current.Decisions, "sha256:", "sha256:0", 1)
	raw, err = entries.Render("K8sNodeGuard")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(ledger, raw, 0o600))

	for _, check := range []bool{true, false} {
		err := run(context.Background(), root, check)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "decisions changed for suite/default-constraint/capi-order-infra-gone-is-allowed, but version "+current.Version+" ")
	}
	after, err := os.ReadFile(snapshot)
	require.NoError(t, err)
	assert.Contains(t, string(after), "| denied | blocked | DockerMachine default/x", "a refused generate writes nothing")
}

// generate writes files; Gatekeeper's engine (internal/gatekeeper, with the
// frameworks client and gator) is for tests only and stays out of its build.
func TestGenerateDoesNotLinkTheEngine(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	require.NoError(t, err)
	for _, pkg := range strings.Fields(string(out)) {
		assert.NotEqual(t, "github.com/nodeguard/nodeguard/internal/gatekeeper", pkg)
		assert.NotEqual(t, "github.com/open-policy-agent/frameworks/constraint/pkg/client", pkg)
	}
}
