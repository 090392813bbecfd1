package fleet

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/nodeguard/nodeguard/enforcer/kube"
)

// writes records what the Status sends: "status" for a status apply,
// "object" for the object's, "delete".
type writes struct {
	mu  sync.Mutex
	got []string
}

func (w *writes) add(s string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.got = append(w.got, s)
}

func (w *writes) list() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.got...)
}

// A ClusterGuard is written when a verdict changes, not for every proof;
// created (object, then status) when it does not exist; written afresh by
// a new leader; deleted when its Cluster goes.
func TestStatusWritesWhatChanged(t *testing.T) {
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{ClusterGuards: "ClusterGuardList"})
	w := &writes{}
	exists := false
	client.PrependReactor("patch", "clusterguards", func(a k8stesting.Action) (bool, runtime.Object, error) {
		p := a.(k8stesting.PatchAction)
		obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": Group + "/" + Version, "kind": ClusterGuardKind,
			"metadata": map[string]any{"namespace": "ns", "name": "dev", "generation": int64(1),
				"ownerReferences": []any{map[string]any{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "name": "dev", "uid": "u-1"}}}}}
		if p.GetSubresource() == "status" {
			if !exists {
				w.add("status-not-found")
				return true, nil, notFound()
			}
			w.add("status")
			return true, obj, nil
		}
		exists = true
		w.add("object")
		return true, obj, nil
	})
	client.PrependReactor("get", "clusterguards", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, &unstructured.Unstructured{Object: map[string]any{"apiVersion": Group + "/" + Version, "kind": ClusterGuardKind,
			"metadata": map[string]any{"namespace": "ns", "name": "dev", "uid": "cg-1", "labels": map[string]any{kube.ManagedByLabel: kube.Owner}}}}, nil
	})
	client.PrependReactor("delete", "clusterguards", func(k8stesting.Action) (bool, runtime.Object, error) {
		w.add("delete")
		return true, nil, nil
	})
	leading := true
	var mu sync.Mutex
	s := &Status{Client: client, ProofRefresh: time.Hour,
		Owner: func(string) (kube.ClusterMeta, bool) {
			return kube.ClusterMeta{APIVersion: "cluster.x-k8s.io/v1beta2", UID: "u-1"}, true
		},
		Leading: func() bool { mu.Lock(); defer mu.Unlock(); return leading }}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Run(ctx)
	settle := func(want ...string) {
		t.Helper()
		assert.EventuallyWithT(t, func(c *assert.CollectT) { assert.Equal(c, want, w.list()) }, 5*time.Second, 10*time.Millisecond)
		time.Sleep(100 * time.Millisecond) // nothing more comes
		require.Equal(t, want, w.list())
	}
	now := time.Now()
	guarded := State{Cluster: "ns/dev", Mode: ModeWebhook, Guarded: true, Wired: true, CACurrent: true, LastProof: now, Since: now}
	s.Report(guarded)
	settle("status-not-found", "object", "status")
	proven := guarded
	proven.LastProof = now.Add(time.Minute)
	s.Report(proven)
	settle("status-not-found", "object", "status") // a newer proof alone waits for ProofRefresh
	cut := proven
	cut.Guarded, cut.Reason, cut.Message = false, ReasonReviewNotReceived, "cut"
	s.Report(cut)
	settle("status-not-found", "object", "status", "status")
	s.Lead()
	s.Report(cut)
	settle("status-not-found", "object", "status", "status", "status") // another leader may have written since
	mu.Lock()
	leading = false
	mu.Unlock()
	s.Report(guarded)
	s.Forget("ns/dev")
	settle("status-not-found", "object", "status", "status", "status") // a standby writes nothing
	mu.Lock()
	leading = true
	mu.Unlock()
	s.Forget("ns/dev")
	settle("status-not-found", "object", "status", "status", "status", "delete")
}

func notFound() error {
	return apierrors.NewNotFound(ClusterGuards.GroupResource(), "dev")
}
