package reaper

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
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// casLeases makes the fake clientset's Leases behave like the API server's:
// an update must carry the current resourceVersion, and bumps it. Without
// that, two candidates could both "win" an update race.
func casLeases(client *fake.Clientset) {
	var mu sync.Mutex
	gvr := schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}
	client.PrependReactor("*", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		// Create and update actions have the same methods: switch on the verb.
		switch a.GetVerb() {
		case "create":
			l := a.(k8stesting.CreateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
			l.ResourceVersion = "1"
			if err := client.Tracker().Create(gvr, l, l.Namespace); err != nil {
				return true, nil, err
			}
			return true, l, nil
		case "update":
			l := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
			cur, err := client.Tracker().Get(gvr, l.Namespace, l.Name)
			if err != nil {
				return true, nil, err
			}
			have := cur.(*coordinationv1.Lease).ResourceVersion
			if l.ResourceVersion != have {
				return true, nil, apierrors.NewConflict(gvr.GroupResource(), l.Name, fmt.Errorf("resourceVersion %s, have %s", l.ResourceVersion, have))
			}
			n, _ := strconv.Atoi(have)
			l.ResourceVersion = strconv.Itoa(n + 1)
			return true, l, client.Tracker().Update(gvr, l, l.Namespace)
		}
		return false, nil, nil
	})
}

func TestTwoReplicasNeverBothLead(t *testing.T) {
	client := fake.NewClientset()
	casLeases(client)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The Lease stores its duration in whole seconds.
	opts := func(id string) LeaseOptions {
		return LeaseOptions{Client: client, Namespace: "nodeguard-system", Identity: id,
			LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 50 * time.Millisecond}
	}
	ctxA, stopA := context.WithCancel(ctx)
	defer stopA()
	a, err := Elect(ctxA, opts("replica-a"))
	require.NoError(t, err)
	ctxB, stopB := context.WithCancel(ctx)
	defer stopB()
	b, err := Elect(ctxB, opts("replica-b"))
	require.NoError(t, err)

	// Sample both for a while (the window is what is tested): never both
	// leaders, and one of them leads.
	var led atomic.Bool
	require.Never(t, func() bool {
		la, lb := a(), b()
		if la || lb {
			led.Store(true)
		}
		return la && lb
	}, 2*time.Second, 5*time.Millisecond, "both replicas lead at once")
	require.True(t, led.Load(), "neither replica ever led")

	// The leader goes away (its Lease released on cancel): the other takes
	// over, and still never both.
	leader, other, stop := a, b, stopA
	if b() {
		leader, other, stop = b, a, stopB
	}
	require.True(t, leader(), "one replica leads")
	stop()
	assert.Eventually(t, other, 5*time.Second, 10*time.Millisecond, "the other replica takes over")
	assert.False(t, leader())
	require.Never(t, func() bool { return a() && b() }, time.Second, 5*time.Millisecond, "both replicas lead at once")
}
