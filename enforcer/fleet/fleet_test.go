package fleet

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/internal/testcluster"
	"github.com/nodeguard/nodeguard/internal/testpki"
)

var caPEM = testpki.CAPEM

// A CA that leaves the files stays in the bundle for the retention, so a
// replica still serving a certificate it signed stays trusted; a CA that
// comes back is current again.
func TestARetiredCAStaysForItsRetention(t *testing.T) {
	old, next := caPEM(t), caPEM(t)
	r := retainer{keep: time.Minute}
	t0 := time.Now()
	assert.Equal(t, joinCerts([][]byte{old}), r.bundle(t0, [][]byte{old}))
	both := joinCerts([][]byte{old, next})
	assert.Equal(t, both, r.bundle(t0.Add(time.Second), [][]byte{old, next}), "a rotation: both")
	assert.Equal(t, both, r.bundle(t0.Add(2*time.Second), [][]byte{next}), "the old CA left the files: retained")
	assert.Equal(t, both, r.bundle(t0.Add(61*time.Second), [][]byte{next}), "still within its minute")
	assert.Equal(t, joinCerts([][]byte{next}), r.bundle(t0.Add(62*time.Second), [][]byte{next}), "retention over")
	assert.Equal(t, joinCerts([][]byte{next}), r.bundle(t0.Add(63*time.Second), [][]byte{next}), "and gone for good")
}

func TestCAFilesMustHoldCertificates(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.crt")
	require.NoError(t, os.WriteFile(empty, []byte("no pem here"), 0o600))
	_, err := readCerts([]string{empty})
	assert.ErrorContains(t, err, "holds no PEM certificate")
	_, err = readCerts(nil)
	assert.ErrorContains(t, err, "no CA file")
	_, err = readCerts([]string{filepath.Join(dir, "missing.crt")})
	assert.ErrorContains(t, err, "read CA file")
	one := filepath.Join(dir, "one.crt")
	ca := caPEM(t)
	require.NoError(t, os.WriteFile(one, append(append([]byte{}, ca...), ca...), 0o600))
	certs, err := readCerts([]string{one, one})
	require.NoError(t, err)
	assert.Equal(t, ca, joinCerts(certs), "each certificate once")
}

// Twenty Clusters whose API servers cannot be reached are each reported
// unreachable, cost bounded backoff, and leave nothing running once their
// Clusters go.
func TestUnreachableClustersLeakNothing(t *testing.T) {
	dyn, mapper := testcluster.Serve([]testcluster.Kind{{GVK: testcluster.ClusterGVK, Resource: "clusters"}})
	secrets := fake.NewClientset()
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(caFile, caPEM(t), 0o600))
	var r *Reconciler
	set, err := kube.NewClusterSet(kube.ClusterSetOptions{Management: kube.Clients{Dynamic: dyn, Mapper: mapper}, Secrets: secrets,
		Start:   func(ctx context.Context, c *kube.Cluster) { r.Session(ctx, c) },
		Changed: func(key string) { r.Changed(key) }})
	require.NoError(t, err)
	r, err = New(Options{Clusters: set, URL: "https://nodeguard.example.com", CAFiles: []string{caFile}, ProofTimeout: 2 * time.Second})
	require.NoError(t, err)
	runtime.GC()
	baseline := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	setDone, recDone := make(chan error, 1), make(chan struct{})
	go func() { setDone <- set.Run(ctx) }()
	go func() { r.Run(ctx); close(recDone) }()

	gvr := testcluster.ClusterGVK.GroupVersion().WithResource("clusters")
	const n = 20
	for i := range n {
		name := fmt.Sprintf("gone-%d", i)
		_, err := secrets.CoreV1().Secrets("fleet").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "fleet", Name: name + "-kubeconfig"},
			Data: map[string][]byte{"value": testcluster.Kubeconfig(t, testcluster.ClosedPort(t))}}, metav1.CreateOptions{})
		require.NoError(t, err)
		_, err = dyn.Resource(gvr).Namespace("fleet").Create(ctx, testcluster.Object(testcluster.ClusterGVK, "fleet", name, nil), metav1.CreateOptions{})
		require.NoError(t, err)
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		states := r.States()
		assert.Len(c, states, n)
		for _, s := range states {
			assert.Equal(c, ReasonUnreachable, s.Reason, s.Cluster)
		}
	}, 30*time.Second, 50*time.Millisecond, "every cluster reported unreachable")
	for i := range n {
		require.NoError(t, dyn.Resource(gvr).Namespace("fleet").Delete(ctx, fmt.Sprintf("gone-%d", i), metav1.DeleteOptions{}))
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) { assert.Empty(c, r.States()) }, 30*time.Second, 50*time.Millisecond,
		"the states of deleted Clusters are forgotten")
	cancel()
	require.NoError(t, <-setDone)
	<-recDone
	// Nothing is left running. (Polled with wait, which runs its condition
	// on this goroutine, not with assert.Eventually, which starts goroutines
	// of its own; the assertion below reports a timeout.)
	_ = wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) { return runtime.NumGoroutine() <= baseline, nil })
	if !assert.LessOrEqual(t, runtime.NumGoroutine(), baseline, "goroutines left running") {
		var b bytes.Buffer
		_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
		t.Log(b.String())
	}
}

// `nodeguard clusters` prints a row per Cluster, and counts as faults only
// the Clusters unguarded for a reason that is not an opt-out.
func TestPrintAndUnguarded(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	states := []State{
		{Cluster: "fleet/a", Mode: ModeWebhook, Guarded: true, Wired: true, CACurrent: true, LastProof: now.Add(-41 * time.Second)},
		{Cluster: "fleet/b", Reason: ReasonOptedOut},
		{Cluster: "fleet/c", Mode: ModeWebhook, Wired: true, Reason: ReasonStaleCABundle},
	}
	var out bytes.Buffer
	require.NoError(t, Print(&out, states, "text", now))
	assert.Equal(t, `CLUSTER  MODE     GUARDED  WIRED  CA CURRENT  LAST PROOF  REASON
fleet/a  webhook  yes      yes    yes         41s ago     -
fleet/b  -        no       no     no          never       opted-out
fleet/c  webhook  no       yes    no          never       stale-ca-bundle
`, out.String())
	assert.Equal(t, 1, Unguarded(states), "only fleet/c is a fault")
	out.Reset()
	require.NoError(t, Print(&out, states, "json", now))
	assert.Contains(t, out.String(), `"reason": "stale-ca-bundle"`)
	assert.ErrorContains(t, Print(&out, states, "yaml", now), `want text or json`)
}
