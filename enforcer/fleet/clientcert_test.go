package fleet

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/internal/testpki"
)

// The kubeconfig issued for a Cluster names its one user for the webhook's
// host:port (443 when the URL names none), and holds a client certificate
// of the CA whose common name is the Cluster's; it is current until a third
// of its life is left, and only for that Cluster.
func TestTheIssuedKubeconfigIsTheClusters(t *testing.T) {
	ca := testpki.New(t)
	i, err := NewIssuer(ca.CAFile(t), ca.KeyFile(t), "https://nodeguard.mgmt.example.com:8443/prefix", 9*time.Hour)
	require.NoError(t, err)
	now := time.Now()
	kc, err := i.Kubeconfig("fleet/prod-1", now)
	require.NoError(t, err)
	cfg, err := clientcmd.Load(kc)
	require.NoError(t, err)
	require.Len(t, cfg.AuthInfos, 1)
	user := cfg.AuthInfos["nodeguard.mgmt.example.com:8443"]
	require.NotNil(t, user, "named host:port, as kube-apiserver looks a webhook's credentials up")
	block, _ := pem.Decode(user.ClientCertificateData)
	cert, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	assert.Equal(t, admission.ClusterClientName("fleet/prod-1"), cert.Subject.CommonName)
	_, err = cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	assert.NoError(t, err)

	assert.True(t, i.current(kc, "fleet/prod-1", now))
	assert.False(t, i.current(kc, "fleet/prod-2", now), "another Cluster's")
	assert.True(t, i.current(kc, "fleet/prod-1", now.Add(5*time.Hour+50*time.Minute)), "more than a third of 9 hours left")
	assert.False(t, i.current(kc, "fleet/prod-1", now.Add(6*time.Hour+10*time.Minute)), "renewed with less than a third left")
	other, err := NewIssuer(testpki.New(t).CAFile(t), ca.KeyFile(t), "https://ng.example.com", 0)
	require.NoError(t, err)
	assert.Equal(t, "ng.example.com:443", other.user)
	assert.False(t, other.current(kc, "fleet/prod-1", now), "another CA's")

	_, err = NewIssuer(filepath.Join(t.TempDir(), "missing"), ca.KeyFile(t), "https://x", 0)
	assert.ErrorContains(t, err, "webhook client CA")
	leaf := filepath.Join(t.TempDir(), "leaf.crt")
	certPEM, _ := ca.Issue(t, 3, x509.ExtKeyUsageClientAuth)
	require.NoError(t, os.WriteFile(leaf, certPEM, 0o600))
	_, err = NewIssuer(leaf, ca.KeyFile(t), "https://x", 0)
	assert.ErrorContains(t, err, "not a CA certificate")
}

// The Secret is written, owned by its Cluster, when missing or not current,
// and left alone while current.
func TestClientCertSecretsAreKept(t *testing.T) {
	ca := testpki.New(t)
	i, err := NewIssuer(ca.CAFile(t), ca.KeyFile(t), "https://ng.example.com:8443", 0)
	require.NoError(t, err)
	secrets := k8sfake.NewClientset()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{{Version: "v1", Resource: "secrets"}: "SecretList"})
	var applied []*unstructured.Unstructured
	// The fake has no server-side apply: store what is applied where the
	// typed client reads.
	dyn.PrependReactor("patch", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		var u unstructured.Unstructured
		require.NoError(t, u.UnmarshalJSON(a.(k8stesting.PatchAction).GetPatch()))
		applied = append(applied, &u)
		var sec corev1.Secret
		require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &sec))
		gvr := schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
		_ = secrets.Tracker().Delete(gvr, sec.Namespace, sec.Name)
		return true, &u, secrets.Tracker().Add(&sec)
	})
	c := &ClientCerts{Issuer: i, Secrets: secrets, Writer: dyn}
	meta := kube.ClusterMeta{APIVersion: "cluster.x-k8s.io/v1beta2", UID: types.UID("uid-1")}
	ctx := context.Background()
	wrote, err := c.keep(ctx, "fleet/prod-1", meta)
	require.NoError(t, err)
	assert.True(t, wrote)
	require.Len(t, applied, 1)
	assert.Equal(t, "prod-1-nodeguard-webhook-client", applied[0].GetName())
	assert.Equal(t, []metav1.OwnerReference{{APIVersion: "cluster.x-k8s.io/v1beta2", Kind: "Cluster", Name: "prod-1", UID: "uid-1"}},
		applied[0].GetOwnerReferences(), "it goes with its Cluster")
	wrote, err = c.keep(ctx, "fleet/prod-1", meta)
	require.NoError(t, err)
	assert.False(t, wrote, "current: left alone")
	assert.Len(t, applied, 1)
}
