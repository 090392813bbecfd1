package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
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
	assert.Contains(t, out, `ALLOWED only because of an exemption: Node "dev-md-0-abcde" would be denied to anyone not exempt.`)
	assert.NotContains(t, out, "no InfraMachine linked to it still exists", "a DockerMachine is linked and exists")
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

	// Gatekeeper's Provider instead, for the K8sNodeGuardExternal template.
	code, out, errOut = nodeguard(t, "webhook-config", "--gatekeeper-provider", "--url", "https://nodeguard.example.com", "--ca-bundle-file", ca,
		"--cluster", "fleet/prod-1")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "kind: Provider")
	assert.Contains(t, out, "name: nodeguard")
	assert.Contains(t, out, "url: https://nodeguard.example.com/externaldata/clusters/fleet/prod-1")
}

// The webhook's settings are flags; a wrong one fails before anything is
// printed.
func TestWebhookConfigSettings(t *testing.T) {
	ca := testpki.New(t).CAFile(t)
	code, out, errOut := nodeguard(t, "webhook-config", "--url", "https://nodeguard.example.com", "--ca-bundle-file", ca,
		"--failure-policy", "Ignore", "--timeout-seconds", "3", "--object-selector", "tier=worker",
		"--match-condition", "not-ops=request.userInfo.username != 'ops'", "--match-condition", "any=1 == 1")
	require.Equal(t, 0, code, errOut)
	for _, want := range []string{"failurePolicy: Ignore", "timeoutSeconds: 3", "tier: worker", "name: not-ops",
		"expression: request.userInfo.username != 'ops'", "name: any"} {
		assert.Contains(t, out, want)
	}
	code, _, errOut = nodeguard(t, "webhook-config", "--url", "https://nodeguard.example.com", "--ca-bundle-file", ca, "--failure-policy", "Never")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "want Fail or Ignore")
	code, _, errOut = nodeguard(t, "webhook-config", "--url", "https://nodeguard.example.com", "--ca-bundle-file", ca, "--match-condition", "no-expression")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "want NAME=CEL")
}

func TestOrphansOfflineText(t *testing.T) {
	code, out, errOut := nodeguard(t, "orphans", "-f", "../../guard/testdata", "--now", "2026-11-30T12:00:00Z")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, `ORPHAN: Node "dev-md-0-left": Machine default/dev-md-0-left is gone`)
	assert.Contains(t, out, `kept: Node "dev-md-0-ready": its Ready condition is True.`)
	assert.Contains(t, out, "1 orphan Node(s), 4 CAPI-managed Node(s) kept.")
	assert.NotContains(t, out, "dev-md-0-unannotated")
}

func TestOrphansOfflineJSONShape(t *testing.T) {
	code, out, errOut := nodeguard(t, "orphans", "-f", "../../guard/testdata", "--now", "2026-11-30T12:00:00Z", "--match-provider-id", "-o", "json")
	require.Equal(t, 0, code, errOut)
	var got struct {
		Orphans []map[string]string `json:"orphans"`
		Kept    []map[string]string `json:"kept"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	require.Len(t, got.Orphans, 2)
	assert.Equal(t, map[string]string{
		"node": "dev-md-0-left", "cluster": "default/dev", "machine": "default/dev-md-0-left", "notReadySince": "2026-11-30T11:00:00Z",
		"reason": "Machine default/dev-md-0-left is gone, nothing links an InfraMachine to the Node, and it has not been Ready since 2026-11-30T11:00:00Z (grace 5m0s)",
	}, got.Orphans[0])
	assert.Equal(t, "dev-md-0-unannotated", got.Orphans[1]["node"])
	why := map[string]string{}
	for _, k := range got.Kept {
		why[k["node"]] = k["why"]
	}
	assert.Equal(t, map[string]string{
		"dev-md-0-ready":    "its Ready condition is True",
		"dev-md-0-deleting": "Machine default/dev-md-0-deleting is being deleted but still exists (linked by machineNodeRef, machineProviderID, nodeAnnotation); DockerMachine default/dev-md-0-deleting is being deleted but still exists",
		"dev-md-0-infra":    "DockerMachine default/dev-md-0-infra still exists",
		"dev-md-0-recent":   "it has been not Ready only since 2026-11-30T11:58:00Z, less than the grace period 5m0s before 2026-11-30T12:00:00Z",
	}, why)
}

func TestOrphansGraceAndScope(t *testing.T) {
	// A grace longer than the hour dev-md-0-left has been NotReady keeps it.
	code, out, _ := nodeguard(t, "orphans", "-f", "../../guard/testdata", "--now", "2026-11-30T12:00:00Z", "--grace", "2h")
	require.Equal(t, 0, code)
	assert.Contains(t, out, "0 orphan Node(s), 5 CAPI-managed Node(s) kept.")
	// Judged for another Cluster, this cluster's Nodes are not its to judge.
	code, out, _ = nodeguard(t, "orphans", "-f", "../../guard/testdata", "--now", "2026-11-30T12:00:00Z", "--cluster", "default/other")
	require.Equal(t, 0, code)
	assert.Contains(t, out, "0 orphan Node(s), 5 CAPI-managed Node(s) kept.")
	assert.Contains(t, out, `kept: Node "dev-md-0-left": it belongs to Cluster default/dev, not to the Cluster judged;`)
}

func TestOrphansErrors(t *testing.T) {
	for name, args := range map[string][]string{
		"delete offline": {"orphans", "-f", "../../guard/testdata", "--delete"},
		"bad now":        {"orphans", "-f", "../../guard/testdata", "--now", "noon"},
		"bad output":     {"orphans", "-f", "../../guard/testdata", "-o", "yaml"},
		"missing file":   {"orphans", "-f", "does-not-exist"},
		"bad cluster":    {"orphans", "-f", "../../guard/testdata", "--cluster", "dev"},
	} {
		code, _, errOut := nodeguard(t, args...)
		assert.Equal(t, 1, code, name)
		assert.NotEmpty(t, errOut, name)
	}
}

// serve's flags for bursts and hostile input keep the names Kubernetes
// components use, with the defaults docs/operate.md documents.
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

// pflag takes a back-quoted word in a usage string as the flag's value name
// (`--bundle make bundle`): no usage may hold one.
func TestNoFlagTakesItsValueNameFromItsUsage(t *testing.T) {
	code := 0
	var walk func(cmd *cobra.Command)
	walk = func(cmd *cobra.Command) {
		cmd.Flags().VisitAll(func(f *pflag.Flag) {
			name, _ := pflag.UnquoteUsage(f)
			assert.NotContains(t, f.Usage, "`", "%s --%s shows as --%s %s", cmd.CommandPath(), f.Name, f.Name, name)
		})
		for _, sub := range cmd.Commands() {
			walk(sub)
		}
	}
	walk(rootCommand(&code, io.Discard))
}

// serve's flags have one polarity: --fresh-reads and --denial-events are on
// by default and take =false; the old --no-fresh-reads, deprecated, sets the
// same option.
func TestServeFlagsHaveOnePolarity(t *testing.T) {
	value := func(args []string, name string) string {
		cmd := serveCommand(io.Discard)
		require.NoError(t, cmd.ParseFlags(args))
		return cmd.Flags().Lookup(name).Value.String()
	}
	assert.Equal(t, "true", value(nil, "fresh-reads"))
	assert.Equal(t, "false", value([]string{"--fresh-reads=false"}, "fresh-reads"))
	assert.Equal(t, "true", value([]string{"--fresh-reads=false"}, "no-fresh-reads"), "one option under both names")
	assert.Equal(t, "false", value([]string{"--no-fresh-reads"}, "fresh-reads"))
	assert.Equal(t, "true", value([]string{"--fresh-reads"}, "fresh-reads"))
	assert.Equal(t, "true", value(nil, "denial-events"))
	assert.Equal(t, "false", value([]string{"--denial-events=false"}, "denial-events"))
	assert.Error(t, serveCommand(io.Discard).ParseFlags([]string{"--fresh-reads=maybe"}))
	assert.NotEmpty(t, serveCommand(io.Discard).Flags().Lookup("no-fresh-reads").Deprecated)
}
