package admission_test

import (
	"context"
	"encoding/base64"
	"testing"

	"github.com/open-policy-agent/frameworks/constraint/pkg/apis/externaldata/unversioned"
	"github.com/open-policy-agent/frameworks/constraint/pkg/externaldata"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/nodeguard/nodeguard/enforcer/admission"
)

// The Provider is one Gatekeeper accepts (its own validation), for the name
// the template asks, at nodeguard's external data route.
func TestBuildProviderIsOneGatekeeperAccepts(t *testing.T) {
	ctx := context.Background()
	name, err := admission.ProviderName(ctx)
	require.NoError(t, err)
	assert.Equal(t, "nodeguard", name, "the name policies/lib/nodeguard/provider.rego declares")
	ca := caBundle(t)
	for want, opts := range map[string]admission.WebhookConfigOptions{
		"https://nodeguard.example.com:8443/externaldata/clusters/fleet/prod-1": {URL: "https://nodeguard.example.com:8443/", CABundle: ca, Cluster: "fleet/prod-1"},
		"https://nodeguard.nodeguard-system.svc/externaldata":                   {Service: "nodeguard-system/nodeguard", CABundle: ca},
	} {
		p, err := admission.BuildProvider(name, opts)
		require.NoError(t, err)
		var typed unversioned.Provider
		require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(p.Object, &typed))
		assert.Equal(t, want, typed.Spec.URL)
		assert.Equal(t, admission.ProviderTimeoutSeconds, typed.Spec.Timeout)
		assert.Equal(t, base64.StdEncoding.EncodeToString(ca), typed.Spec.CABundle)
		assert.NoError(t, externaldata.NewCache().Upsert(&typed), "Gatekeeper's own checks of a Provider")
		out, err := admission.ProviderYAML(p)
		require.NoError(t, err)
		assert.Contains(t, string(out), "kind: Provider")
	}
	for wantErr, opts := range map[string]admission.WebhookConfigOptions{
		"--ca-bundle-file is required": {URL: "https://x"},
		"want https://":                {URL: "http://x", CABundle: ca},
		"not both":                     {URL: "https://x", Service: "a/b", CABundle: ca},
		"want NAMESPACE/NAME":          {URL: "https://x", CABundle: ca, Cluster: "prod-1"},
		"--url (or --service)":         {CABundle: ca},
	} {
		_, err := admission.BuildProvider(name, opts)
		assert.ErrorContains(t, err, wantErr)
	}
}
