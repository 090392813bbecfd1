package facts_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/internal/testcluster"
)

var machineGVK = testcluster.MachineGVK

// Concurrent reads of one object share one GET while it is in flight; a read
// after it returns makes a GET of its own (nothing is cached).
func TestConcurrentReadsOfOneObjectShareOneGet(t *testing.T) {
	// In a bubble: synctest.Wait returns once every reader is blocked, the
	// first in its GET and the others waiting for it, with no sleep.
	synctest.Test(t, concurrentReads)
}

func concurrentReads(t *testing.T) {
	client, mapper := testcluster.Serve([]testcluster.Kind{{GVK: machineGVK, Resource: "machines"}},
		testcluster.Object(machineGVK, "default", "m1", nil))
	var gets atomic.Int64
	release := make(chan struct{})
	client.PrependReactor("get", "machines", func(k8stesting.Action) (bool, runtime.Object, error) {
		gets.Add(1)
		<-release
		return false, nil, nil // on to the tracker
	})
	r := facts.NewFreshReader(client, mapper)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	results := make([]*unstructured.Unstructured, 8)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			obj, err := r.Get(ctx, machineGVK, "default", "m1")
			assert.NoError(t, err)
			results[i] = obj
		}()
	}
	synctest.Wait()
	require.EqualValues(t, 1, gets.Load(), "one GET in flight, the other readers waiting for it")
	close(release)
	wg.Wait()
	assert.EqualValues(t, 1, gets.Load())
	for _, obj := range results {
		require.NotNil(t, obj)
		assert.Equal(t, "m1", obj.GetName())
	}
	_, err := r.Get(ctx, machineGVK, "default", "m1")
	require.NoError(t, err)
	assert.EqualValues(t, 2, gets.Load())

	// A caller stops waiting at its deadline, even when the GET hangs.
	short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelShort()
	block := make(chan struct{})
	client.PrependReactor("get", "machines", func(k8stesting.Action) (bool, runtime.Object, error) {
		<-block
		return false, nil, nil
	})
	_, err = r.Get(short, machineGVK, "default", "m1")
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	close(block)
}
