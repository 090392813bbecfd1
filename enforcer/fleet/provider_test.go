package fleet

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/nodeguard/nodeguard/enforcer/admission"
)

// The Provider is written the moment Gatekeeper's Provider CRD is
// established (Gatekeeper installed after nodeguard), not at the next poll,
// and again with a renewed CA.
func TestProviderIsWrittenWhenGatekeeperArrivesAndTheCAChanges(t *testing.T) {
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	first := caPEM(t)
	require.NoError(t, os.WriteFile(caFile, first, 0o600))
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		admission.ProviderGVR: "ProviderList", crds: "CustomResourceDefinitionList"})
	var mu sync.Mutex
	var applied []string // each apply's caBundle
	client.PrependReactor("patch", "providers", func(a clienttesting.Action) (bool, runtime.Object, error) {
		var p unstructured.Unstructured
		if err := p.UnmarshalJSON(a.(clienttesting.PatchAction).GetPatch()); err != nil {
			return true, nil, err
		}
		ca, _, _ := unstructured.NestedString(p.Object, "spec", "caBundle")
		mu.Lock()
		applied = append(applied, ca)
		mu.Unlock()
		return true, &p, nil
	})
	writes := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), applied...)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	k := &ProviderKeeper{Client: client, Name: "nodeguard", Options: admission.WebhookConfigOptions{URL: "https://127.0.0.1:8443"},
		CAFiles: []string{caFile}, CAInterval: 20 * time.Millisecond}
	go func() { done <- k.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	// No Gatekeeper yet: nothing to write.
	crd := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": providerCRD}}}
	require.Never(t, func() bool { return len(writes()) > 0 }, 200*time.Millisecond, 20*time.Millisecond)
	_, err := client.Resource(crds).Create(ctx, crd, metav1.CreateOptions{})
	require.NoError(t, err)
	require.Never(t, func() bool { return len(writes()) > 0 }, 200*time.Millisecond, 20*time.Millisecond, "not established yet")
	require.NoError(t, unstructured.SetNestedSlice(crd.Object, []any{map[string]any{"type": "Established", "status": "True"}}, "status", "conditions"))
	_, err = client.Resource(crds).Update(ctx, crd, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(writes()) > 0 }, 5*time.Second, 10*time.Millisecond, "written once Gatekeeper's CRD is served")
	assert.Equal(t, base64.StdEncoding.EncodeToString(first), writes()[0])

	renewed := caPEM(t)
	require.NoError(t, os.WriteFile(caFile, renewed, 0o600))
	require.Eventually(t, func() bool {
		w := writes()
		return w[len(w)-1] == base64.StdEncoding.EncodeToString(renewed)
	}, 5*time.Second, 10*time.Millisecond, "the renewed CA reaches the Provider")
}
