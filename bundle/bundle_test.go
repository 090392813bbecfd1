package bundle_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"

	opabundle "github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/bundle"
	"github.com/nodeguard/nodeguard/internal/testbundle"
	"github.com/nodeguard/nodeguard/policies"
)

func TestBuildUnsigned(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, bundle.Build(context.Background(), &buf, bundle.Options{Revision: "abc123"}))

	b, err := opabundle.NewReader(bytes.NewReader(buf.Bytes())).Read()
	require.NoError(t, err)
	assert.Equal(t, "abc123", b.Manifest.Revision)
	require.NotNil(t, b.Manifest.Roots)
	assert.ElementsMatch(t, []string{"lib/nodeguard", "nodeguard"}, *b.Manifest.Roots)
	require.NotNil(t, b.Manifest.RegoVersion)
	assert.Equal(t, 1, *b.Manifest.RegoVersion)
	var paths []string
	for _, m := range b.Modules {
		paths = append(paths, m.Path)
		assert.NotContains(t, m.Path, "_test.rego")
	}
	// Every non-test Rego file but Gatekeeper's entry point: the library
	// (rule, links, parameters), the orphan criteria and their entry points.
	files, err := policies.All()
	require.NoError(t, err)
	assert.Len(t, paths, len(files)-1, "library, orphan criteria and their entry points: %v", paths)
	for _, p := range paths {
		assert.NotContains(t, p, policies.GatekeeperEntry)
	}

	// The bundle alone decides: a DELETE of a Node whose DockerMachine exists.
	r := rego.New(rego.Query("data.nodeguard.decision.allowed"), rego.ParsedBundle("nodeguard", &b), rego.Input(capdInput()))
	rs, err := r.Eval(context.Background())
	require.NoError(t, err)
	require.Len(t, rs, 1)
	assert.Equal(t, false, rs[0].Expressions[0].Value)
}

func TestSignedBundleVerifiesAndTamperingIsRejected(t *testing.T) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	private := string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}))
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	require.NoError(t, err)
	public := string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}))

	var buf bytes.Buffer
	require.NoError(t, bundle.Build(context.Background(), &buf, bundle.Options{Revision: "r1", SigningKey: private}))
	signed := buf.Bytes()

	verify := func(tarball []byte) error {
		cfg := opabundle.NewVerificationConfig(map[string]*opabundle.KeyConfig{
			"nodeguard": {Key: public, Algorithm: "RS256"},
		}, "nodeguard", "", nil)
		_, err := opabundle.NewReader(bytes.NewReader(tarball)).WithBundleVerificationConfig(cfg).Read()
		return err
	}
	require.NoError(t, verify(signed))

	tampered := testbundle.Rewrite(t, signed, func(name string, body []byte) []byte {
		if strings.HasSuffix(name, "decide.rego") {
			return bytes.Replace(body, []byte(`"allowed": false`), []byte(`"allowed": true`), 1)
		}
		return body
	})
	assert.Error(t, verify(tampered), "a modified policy must fail verification")

	var unsigned bytes.Buffer
	require.NoError(t, bundle.Build(context.Background(), &unsigned, bundle.Options{Revision: "r1"}))
	assert.Error(t, verify(unsigned.Bytes()), "an unsigned bundle must fail verification")

	other, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	otherPEM := string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(other)}))
	var wrongKey bytes.Buffer
	require.NoError(t, bundle.Build(context.Background(), &wrongKey, bundle.Options{Revision: "r1", SigningKey: otherPEM}))
	assert.Error(t, verify(wrongKey.Bytes()), "a bundle signed by another key must fail verification")
}

func capdInput() map[string]any {
	node := map[string]any{
		"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": "dev-md-0-abcde"},
		"spec":     map[string]any{"providerID": "docker:////dev-md-0-abcde"},
	}
	infra := map[string]any{
		"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "DockerMachine",
		"metadata": map[string]any{"namespace": "default", "name": "dev-md-0-abcde"},
		"spec":     map[string]any{"providerID": "docker:////dev-md-0-abcde"},
	}
	return map[string]any{
		"review": map[string]any{
			"operation": "DELETE",
			"kind":      map[string]any{"group": "", "version": "v1", "kind": "Node"},
			"name":      "dev-md-0-abcde",
			"oldObject": node,
		},
		"inventory": map[string]any{"namespace": map[string]any{"default": map[string]any{
			"infrastructure.cluster.x-k8s.io/v1beta2": map[string]any{"DockerMachine": map[string]any{"dev-md-0-abcde": infra}},
		}}},
	}
}
