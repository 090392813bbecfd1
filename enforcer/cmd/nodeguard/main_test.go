package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/internal/testpki"
)

func nodeguard(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestCheckDeniesTheCAPDExample(t *testing.T) {
	code, out, _ := nodeguard(t, "check", "--node", "dev-md-0-x7k2p-abcde", "-f", "../../../examples/capd-v1beta2")
	assert.Equal(t, 2, code)
	assert.Contains(t, out, `DENIED: Node "dev-md-0-x7k2p-abcde" may not be deleted yet.`)
	assert.Contains(t, out, "DockerMachine default/dev-md-0-x7k2p-abcde")
}

func TestCheckJSONShape(t *testing.T) {
	code, out, _ := nodeguard(t, "check", "--node", "ip-10-0-1-17.ec2.internal", "-f", "../../../examples/capa-v1beta1/all.yaml", "-o", "json")
	assert.Equal(t, 2, code)
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	assert.Equal(t, false, got["allowed"])
	blockers := got["blockers"].([]any)
	require.Len(t, blockers, 1)
	b := blockers[0].(map[string]any)
	for _, k := range []string{"group", "version", "kind", "namespace", "name", "deleting", "links"} {
		assert.Contains(t, b, k)
	}
	assert.Equal(t, "AWSMachine", b["kind"])
	assert.Equal(t, true, b["deleting"])
	assert.Len(t, got["messages"], 1)
	assert.Equal(t, []any{}, got["warnings"])
}

func TestCheckAllowsWhenTheInfraMachineIsGone(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"node.yaml"} {
		b, err := os.ReadFile(filepath.Join("../../../examples/capd-v1beta2", f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o644))
	}
	code, out, _ := nodeguard(t, "check", "--node", "dev-md-0-x7k2p-abcde", "-f", dir)
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "ALLOWED")
}

func TestCheckExemptGroupFromConstraint(t *testing.T) {
	code, out, _ := nodeguard(t, "check", "--node", "dev-md-0-abcde", "-f", "../../../constraints/tests/capd-objects.yaml",
		"-f", "../../../constraints/tests/node-capd.yaml", "--constraint", "../../../constraints/tests/constraint-exempt.yaml",
		"--user", "oncall", "--group", "nodeguard:break-glass")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, `warning: nodeguard: group "nodeguard:break-glass" is exempt`)
}

func TestCheckErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("apiVersion: v1\nkind: Node\nmetadata:\n  name: [x\n"), 0o644))
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"missing node flag": {[]string{"check", "-f", bad}, `required flag(s) "node" not set`},
		"bad file":          {[]string{"check", "--node", "x", "-f", bad}, "bad.yaml:4:"},
		"node not found":    {[]string{"check", "--node", "nope", "-f", "../../../examples/capd-v1beta2"}, `node "nope" not found`},
		"bad output":        {[]string{"check", "--node", "x", "-f", bad, "-o", "yaml"}, `-o "yaml": want text or json`},
		"bad cluster":       {[]string{"check", "--node", "dev-md-0-x7k2p-abcde", "-f", "../../../examples/capd-v1beta2", "--cluster", "x"}, "want NAMESPACE/NAME"},
		"bad constraint":    {[]string{"check", "--node", "x", "-f", bad, "--constraint", "../../../constraints/syncset.yaml"}, "want exactly one K8sNodeGuard"},
		"unknown command":   {[]string{"frobnicate"}, "unknown command"},
	} {
		t.Run(name, func(t *testing.T) {
			code, _, errOut := nodeguard(t, tc.args...)
			assert.Equal(t, 1, code)
			assert.Contains(t, errOut, tc.want)
		})
	}
}

func TestWebhookConfigPrintsTheConfiguration(t *testing.T) {
	ca := testpki.New(t).CAFile(t)
	code, out, errOut := nodeguard(t, "webhook-config", "--url", "https://nodeguard.example.com", "--ca-bundle-file", ca, "--cluster", "fleet/prod-1")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "url: https://nodeguard.example.com/validate/clusters/fleet/prod-1")
	assert.Contains(t, out, "- DELETE")

	code, _, errOut = nodeguard(t, "webhook-config", "--url", "https://nodeguard.example.com")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "--ca-bundle-file is required")
}

// serve's flags for bursts and hostile input keep the names Kubernetes
// components use, with the defaults the README documents.
func TestServeFlags(t *testing.T) {
	code, out, errOut := nodeguard(t, "serve", "--help")
	require.Equal(t, 0, code, errOut)
	for _, want := range []string{
		"--kube-api-qps float32", "(default 100)",
		"--kube-api-burst int", "(default 200)",
		"--max-concurrent-decisions int", "(default 16)",
		`--metrics-bind-address string`, `(default ":8080")`,
		`--health-probe-bind-address string`, `(default ":8081")`,
		`--tls-min-version string`, `(default "VersionTLS12")`,
		"--tls-cipher-suites strings", "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
	} {
		assert.Contains(t, out, want)
	}
	assert.NotContains(t, out, "CBC")
}
