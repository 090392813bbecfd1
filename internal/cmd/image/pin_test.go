package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// -pin writes one reference into the chart and the kustomization, keeps
// their comments, and both then render that image.
func TestPinPointsChartAndKustomizationAtOneImage(t *testing.T) {
	repo, err := filepath.Abs("../../..")
	require.NoError(t, err)
	root := t.TempDir()
	require.NoError(t, os.CopyFS(filepath.Join(root, "charts/nodeguard"), os.DirFS(filepath.Join(repo, "charts/nodeguard"))))
	require.NoError(t, os.CopyFS(filepath.Join(root, "enforcer/deploy"), os.DirFS(filepath.Join(repo, "enforcer/deploy"))))

	digest := "sha256:" + strings.Repeat("ab", 32)
	require.NoError(t, pin(root, "registry.example.com/team/nodeguard", "v1.2.3", digest))
	want := "registry.example.com/team/nodeguard:v1.2.3@" + digest

	// Only the image lines change: comments and layout stay.
	for file, changed := range map[string]int{chartValues: 3, kustomization: 3} {
		before, err := os.ReadFile(filepath.Join(repo, file))
		require.NoError(t, err)
		after, err := os.ReadFile(filepath.Join(root, file))
		require.NoError(t, err)
		b, a := strings.Split(string(before), "\n"), strings.Split(string(after), "\n")
		diff := 0
		for i := range a {
			if i >= len(b) || a[i] != b[i] {
				diff++
			}
		}
		assert.LessOrEqual(t, diff, changed+len(a)-len(b), "%s:\n%s", file, after)
		assert.GreaterOrEqual(t, len(a), len(b), file)
	}

	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(root, "enforcer/deploy"))
	require.NoError(t, err)
	k, err := m.AsYaml()
	require.NoError(t, err)
	assert.Contains(t, string(k), "image: "+want)

	cmd := exec.Command("go", "tool", "-modfile=tools/helm/go.mod", "helm", "template", "x", filepath.Join(root, "charts/nodeguard"))
	cmd.Dir = repo
	h, err := cmd.CombinedOutput()
	require.NoError(t, err, string(h))
	assert.Contains(t, string(h), "image: "+want)
}
