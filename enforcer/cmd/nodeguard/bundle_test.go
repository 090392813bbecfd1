package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/internal/testbundle"
	"github.com/nodeguard/nodeguard/policies"
)

func TestCheckWithASignedBundle(t *testing.T) {
	key := testbundle.NewKey(t)
	other := testbundle.NewKey(t)
	dir := t.TempDir()
	signed := testbundle.Nodeguard(t, "0.1.1+test", key.Private)
	custom := testbundle.Sources(t)
	custom["nodeguard/decision.rego"] = testbundle.AllowAll
	broken := testbundle.Sources(t)
	broken["nodeguard/decision.rego"] = "package nodeguard\n\ndecision := no_such_function(input)\n"
	check := []string{"check", "--node", "dev-md-0-x7k2p-abcde", "-f", "../../../examples/capd-v1beta2", "--bundle-verification-key", key.PublicKeyFile}

	t.Run("accepted: decides like the embedded rule", func(t *testing.T) {
		code, out, errOut := nodeguard(t, append(check, "--bundle", testbundle.WriteFile(t, dir, "ok.tar.gz", signed))...)
		assert.Equal(t, 2, code, errOut)
		assert.Contains(t, out, "DockerMachine default/dev-md-0-x7k2p-abcde")
	})
	t.Run("accepted: a customized policy decides", func(t *testing.T) {
		code, out, errOut := nodeguard(t, append(check, "--bundle", testbundle.WriteFile(t, dir, "custom.tar.gz", testbundle.Signed(t, custom, "c1", key.Private)))...)
		assert.Equal(t, 0, code, errOut)
		assert.Contains(t, out, "ALLOWED")
	})
	for name, tc := range map[string]struct {
		bundle []byte
		want   string
	}{
		"unsigned":         {testbundle.Nodeguard(t, "r", ""), "bundle missing .signatures.json"},
		"tampered":         {testbundle.Tamper(t, signed), "digest mismatch"},
		"wrong key":        {testbundle.Nodeguard(t, "r", other.Private), "verification error"},
		"does not compile": {testbundle.Signed(t, broken, "r", key.Private), "undefined function"},
	} {
		t.Run("refused: "+name, func(t *testing.T) {
			code, out, errOut := nodeguard(t, append(check, "--bundle", testbundle.WriteFile(t, dir, "bad.tar.gz", tc.bundle))...)
			assert.Equal(t, 1, code)
			assert.Empty(t, out, "no decision is printed")
			assert.Contains(t, errOut, tc.want)
		})
	}
	t.Run("refused: no verification key", func(t *testing.T) {
		code, _, errOut := nodeguard(t, "check", "--node", "x", "-f", "../../../examples/capd-v1beta2", "--bundle", filepath.Join(dir, "ok.tar.gz"))
		assert.Equal(t, 1, code)
		assert.Contains(t, errOut, "--bundle-verification-key is required")
	})
}

// `nodeguard orphans` judges with the bundle too, as serve --bundle's reaper
// does: a policy that finds no orphans finds none, a tampered one is refused.
func TestOrphansWithASignedBundle(t *testing.T) {
	key := testbundle.NewKey(t)
	dir := t.TempDir()
	orphans := []string{"orphans", "-f", "../../nodes/testdata", "--now", "2026-11-30T12:00:00Z", "--bundle-verification-key", key.PublicKeyFile}
	code, out, errOut := nodeguard(t, orphans[:5]...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "dev-md-0-left", "the embedded rule finds the orphan")

	signed := testbundle.Nodeguard(t, "0.1.1+test", key.Private)
	code, out, errOut = nodeguard(t, append(orphans, "--bundle", testbundle.WriteFile(t, dir, "ok.tar.gz", signed))...)
	assert.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "dev-md-0-left", "the same rule in a bundle finds it too")

	none := testbundle.Sources(t)
	none["nodeguard/verdicts.rego"] = strings.Replace(none["nodeguard/verdicts.rego"],
		"orphan := orphans.verdict(", "orphan := object.union(orphans.verdict(", 1)
	none["nodeguard/verdicts.rego"] = strings.Replace(none["nodeguard/verdicts.rego"],
		"\tobject.get(input, \"tombstone\", null),\n)", "\tobject.get(input, \"tombstone\", null),\n), {\"orphan\": false, \"kept\": [\"a policy that keeps every Node\"]})", 1)
	code, out, errOut = nodeguard(t, append(orphans, "--bundle", testbundle.WriteFile(t, dir, "none.tar.gz", testbundle.Signed(t, none, "n1", key.Private)))...)
	assert.Equal(t, 0, code, errOut)
	assert.NotContains(t, out, "ORPHAN", "the bundle's policy decides")
	assert.Contains(t, out, "a policy that keeps every Node")

	code, out, errOut = nodeguard(t, append(orphans, "--bundle", testbundle.WriteFile(t, dir, "bad.tar.gz", testbundle.Tamper(t, signed)))...)
	assert.Equal(t, 1, code)
	assert.Empty(t, out)
	assert.Contains(t, errOut, "digest mismatch")
}

func TestVersion(t *testing.T) {
	code, out, errOut := nodeguard(t, "version", "-o", "json")
	require.Equal(t, 0, code, errOut)
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	v, err := policies.TemplateVersion()
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"source": "embedded", "version": v}, got["policy"])
	assert.NotEmpty(t, got["goVersion"])

	key := testbundle.NewKey(t)
	path := testbundle.WriteFile(t, t.TempDir(), "b.tar.gz", testbundle.Nodeguard(t, "0.1.1+abc", key.Private))
	code, out, errOut = nodeguard(t, "version", "--bundle", path, "--bundle-verification-key", key.PublicKeyFile)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, `policy:  bundle, revision "0.1.1+abc"`)
}

// kubectl finds kubectl-nodeguard on PATH and runs it with the rest of the
// command line; the binary then names itself "kubectl nodeguard".
func TestRunsAsAKubectlPlugin(t *testing.T) {
	assert.Equal(t, "kubectl nodeguard", kubectlPluginName("/usr/local/bin/kubectl-nodeguard"))
	assert.Equal(t, "", kubectlPluginName("nodeguard"))

	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not installed: the plugin is checked by name only")
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(bin, "kubectl-nodeguard"), ".")
	build.Stderr = os.Stderr
	require.NoError(t, build.Run())
	cmd := exec.Command(kubectl, "nodeguard", "check", "--node", "dev-md-0-x7k2p-abcde", "-f", "../../../examples/capd-v1beta2")
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, string(out))
	assert.Equal(t, 2, exit.ExitCode(), "kubectl passes the plugin's exit code on")
	assert.Contains(t, string(out), `DENIED: Node "dev-md-0-x7k2p-abcde"`)

	cmd = exec.Command(kubectl, "nodeguard", "--help")
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	assert.Contains(t, string(out), "kubectl nodeguard [command]")

	// kubectl hands --kubeconfig and --context to the plugin untouched.
	kubeconfig := filepath.Join(bin, "kubeconfig")
	require.NoError(t, os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: here, context: {cluster: c, user: u}}]
current-context: here
`), 0o600))
	cmd = exec.Command(kubectl, "nodeguard", "check", "--node", "n", "--kubeconfig", kubeconfig, "--context", "elsewhere")
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err = cmd.CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), `context "elsewhere" does not exist`)
}

func TestServeExitsOneOnATamperedBundle(t *testing.T) {
	key := testbundle.NewKey(t)
	dir := t.TempDir()
	path := testbundle.WriteFile(t, dir, "b.tar.gz", testbundle.Tamper(t, testbundle.Nodeguard(t, "r", key.Private)))
	kubeconfig := testbundle.WriteFile(t, dir, "kubeconfig", []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: here, context: {cluster: c, user: u}}]
current-context: here
`))
	code, _, errOut := nodeguard(t, "serve", "--kubeconfig", kubeconfig, "--listen-address", "127.0.0.1:0",
		"--tls-cert-file", "x", "--tls-private-key-file", "y", "--bundle", path, "--bundle-verification-key", key.PublicKeyFile)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "digest mismatch")
}
