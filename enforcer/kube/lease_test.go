package kube

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// casLeases makes the fake clientset's Leases behave like the API server's
// (an update must carry the current resourceVersion, and bumps it; without
// that two candidates could both win an update race) and mirrors each write
// into dyn, where the Lease is watched.
func casLeases(t *testing.T, client *fake.Clientset, dyn *dynamicfake.FakeDynamicClient) {
	var mu sync.Mutex
	mirror := func(l *coordinationv1.Lease, create bool) error {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(l)
		require.NoError(t, err)
		u := &unstructured.Unstructured{Object: m}
		u.SetAPIVersion("coordination.k8s.io/v1")
		u.SetKind("Lease")
		if create {
			return dyn.Tracker().Create(leases, u, l.Namespace)
		}
		return dyn.Tracker().Update(leases, u, l.Namespace)
	}
	client.PrependReactor("*", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		switch a.GetVerb() {
		case "create":
			l := a.(k8stesting.CreateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
			l.ResourceVersion = "1"
			if err := client.Tracker().Create(leases, l, l.Namespace); err != nil {
				return true, nil, err
			}
			return true, l, mirror(l, true)
		case "update":
			l := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
			cur, err := client.Tracker().Get(leases, l.Namespace, l.Name)
			if err != nil {
				return true, nil, err
			}
			have := cur.(*coordinationv1.Lease).ResourceVersion
			if l.ResourceVersion != have {
				return true, nil, apierrors.NewConflict(leases.GroupResource(), l.Name, fmt.Errorf("resourceVersion %s, have %s", l.ResourceVersion, have))
			}
			n, _ := strconv.Atoi(have)
			l.ResourceVersion = strconv.Itoa(n + 1)
			if err := client.Tracker().Update(leases, l, l.Namespace); err != nil {
				return true, nil, err
			}
			return true, l, mirror(l, false)
		}
		return false, nil, nil
	})
}

func electionClients(t *testing.T) (*fake.Clientset, *dynamicfake.FakeDynamicClient) {
	client := fake.NewClientset()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{leases: "LeaseList"})
	casLeases(t, client, dyn)
	return client, dyn
}

// Two replicas never lead at once; when the leader stops, it gives the Lease
// up before Done closes, and the standby, watching the Lease, takes it at
// once rather than at its next retry.
func TestAStoppedLeaderHandsOverAtOnce(t *testing.T) {
	client, dyn := electionClients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Retries a second apart (up to 2.2 s with client-go's jitter): a
	// handover within 500 ms can only come from the watch.
	opts := func(id string) LeaseOptions {
		return LeaseOptions{Client: client, Watch: dyn, Namespace: "nodeguard-system", Name: "test", Identity: id, Purpose: "test",
			LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: time.Second}
	}
	ctxA, stopA := context.WithCancel(ctx)
	defer stopA()
	a, err := Elect(ctxA, opts("replica-a"))
	require.NoError(t, err)
	require.Eventually(t, a.Leading, 5*time.Second, 5*time.Millisecond, "the first replica leads")
	var changes atomic.Int64
	ctxB, stopB := context.WithCancel(ctx)
	defer stopB()
	b, err := Elect(ctxB, opts("replica-b"))
	require.NoError(t, err)
	b.Notify(func(bool) { changes.Add(1) })
	require.Never(t, func() bool { return a.Leading() && b.Leading() }, 1500*time.Millisecond, 5*time.Millisecond,
		"both replicas lead at once")
	require.False(t, b.Leading(), "the standby waits")

	stopA()
	stopped := time.Now()
	select {
	case <-a.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the stopped leader's election did not end")
	}
	lease, err := client.CoordinationV1().Leases("nodeguard-system").Get(ctx, "test", metav1.GetOptions{})
	require.NoError(t, err)
	if lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity == "replica-a" {
		t.Fatalf("Done closed before the Lease was given up: %+v", lease.Spec)
	}
	require.Eventually(t, b.Leading, 5*time.Second, 5*time.Millisecond, "the standby takes over")
	took := time.Since(stopped)
	assert.Less(t, took, 500*time.Millisecond, "taken at once, not at the next retry")
	assert.False(t, a.Leading())
	assert.Equal(t, int64(1), changes.Load(), "the standby was told once, when it started leading")
	t.Logf("handover %s after the leader stopped", took.Round(time.Millisecond))
}
