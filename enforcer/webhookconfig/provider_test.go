package webhookconfig_test

import (
	"context"
	"encoding/base64"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/open-policy-agent/frameworks/constraint/pkg/apis/externaldata/unversioned"
	"github.com/open-policy-agent/frameworks/constraint/pkg/externaldata"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/nodeguard/nodeguard/enforcer/webhookconfig"
)

// The Provider is one Gatekeeper accepts (its own validation), for the name
// the template asks, at nodeguard's external data route.
func TestBuildProviderIsOneGatekeeperAccepts(t *testing.T) {
	ctx := context.Background()
	name, err := webhookconfig.ProviderName(ctx)
	require.NoError(t, err)
	assert.Equal(t, "nodeguard", name, "the name policies/lib/nodeguard/provider.rego declares")
	ca := caBundle(t)
	for want, opts := range map[string]webhookconfig.Options{
		"https://nodeguard.example.com:8443/externaldata/clusters/fleet/prod-1": {URL: "https://nodeguard.example.com:8443/", CABundle: ca, Cluster: "fleet/prod-1"},
		"https://nodeguard.nodeguard-system.svc/externaldata":                   {Service: "nodeguard-system/nodeguard", CABundle: ca},
	} {
		p, err := webhookconfig.BuildProvider(name, opts)
		require.NoError(t, err)
		var typed unversioned.Provider
		require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(p.Object, &typed))
		assert.Equal(t, want, typed.Spec.URL)
		assert.Equal(t, webhookconfig.ProviderTimeoutSeconds, typed.Spec.Timeout)
		assert.Equal(t, base64.StdEncoding.EncodeToString(ca), typed.Spec.CABundle)
		assert.NoError(t, externaldata.NewCache().Upsert(&typed), "Gatekeeper's own checks of a Provider")
		out, err := webhookconfig.ProviderYAML(p)
		require.NoError(t, err)
		assert.Contains(t, string(out), "kind: Provider")
	}
	for wantErr, opts := range map[string]webhookconfig.Options{
		"--ca-bundle-file is required": {URL: "https://x"},
		"want https://":                {URL: "http://x", CABundle: ca},
		"not both":                     {URL: "https://x", Service: "a/b", CABundle: ca},
		"want NAMESPACE/NAME":          {URL: "https://x", CABundle: ca, Cluster: "prod-1"},
		"--url (or --service)":         {CABundle: ca},
	} {
		_, err := webhookconfig.BuildProvider(name, opts)
		assert.ErrorContains(t, err, wantErr)
	}
}

// KeepProvider applies the Provider at once, and again with the new CA when
// the file changes (a renewed self-signed certificate).
func TestKeepProviderFollowsTheCAFile(t *testing.T) {
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	first := caBundle(t)
	require.NoError(t, os.WriteFile(caFile, first, 0o600))
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{webhookconfig.ProviderGVR: "ProviderList"})
	var mu sync.Mutex
	var applied []string // each apply's caBundle
	client.PrependReactor("patch", "providers", func(a clienttesting.Action) (bool, runtime.Object, error) {
		patch := a.(clienttesting.PatchAction)
		var p unstructured.Unstructured
		if err := p.UnmarshalJSON(patch.GetPatch()); err != nil {
			return true, nil, err
		}
		ca, _, _ := unstructured.NestedString(p.Object, "spec", "caBundle")
		mu.Lock()
		applied = append(applied, ca)
		mu.Unlock()
		return true, &p, nil
	})
	last := func() string {
		mu.Lock()
		defer mu.Unlock()
		if len(applied) == 0 {
			return ""
		}
		return applied[len(applied)-1]
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		webhookconfig.KeepProvider(ctx, client, "nodeguard", webhookconfig.Options{URL: "https://127.0.0.1:8443"}, caFile, 20*time.Millisecond,
			slog.New(slog.DiscardHandler))
		close(done)
	}()
	defer func() { cancel(); <-done }()
	require.Eventually(t, func() bool { return last() == base64.StdEncoding.EncodeToString(first) }, 5*time.Second, 10*time.Millisecond)
	renewed := caBundle(t)
	require.NoError(t, os.WriteFile(caFile, renewed, 0o600))
	require.Eventually(t, func() bool { return last() == base64.StdEncoding.EncodeToString(renewed) }, 5*time.Second, 10*time.Millisecond,
		"the renewed CA reaches the Provider")
}
