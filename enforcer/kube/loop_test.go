package kube

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A key is looked at again when its reconcile says: after the time asked
// for, or after a backoff that doubles while it fails and resets once it
// does not.
func TestTheLoopLooksAgainWhenAsked(t *testing.T) {
	var mu sync.Mutex
	seen := map[string][]time.Time{}
	fail := atomic.Int64{}
	fail.Store(3)
	l := NewLoop(LoopOptions{Name: "test", Workers: 2, BaseBackoff: 20 * time.Millisecond, MaxBackoff: time.Second},
		func(_ context.Context, key string) Result {
			mu.Lock()
			seen[key] = append(seen[key], time.Now())
			n := len(seen[key])
			mu.Unlock()
			switch key {
			case "failing":
				if fail.Add(-1) >= 0 {
					return Result{Retry: true}
				}
				return Result{}
			case "due":
				if n < 3 {
					return Result{After: 100 * time.Millisecond}
				}
			}
			return Result{}
		})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	l.Add("failing")
	l.Add("due")
	l.Add("once")
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen["failing"]) == 4 && len(seen["due"]) == 3
	}, 5*time.Second, 5*time.Millisecond)
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	f := seen["failing"]
	gaps := []time.Duration{f[1].Sub(f[0]), f[2].Sub(f[1]), f[3].Sub(f[2])}
	assert.GreaterOrEqual(t, gaps[0], 20*time.Millisecond, "first retry after the base backoff")
	assert.GreaterOrEqual(t, gaps[2], 80*time.Millisecond, "the backoff doubles: %v", gaps)
	assert.Zero(t, l.Failures("failing"), "a success forgets the failures")
	d := seen["due"]
	assert.GreaterOrEqual(t, d[1].Sub(d[0]), 100*time.Millisecond)
	assert.GreaterOrEqual(t, d[2].Sub(d[1]), 100*time.Millisecond)
	assert.Len(t, seen["once"], 1, "a key that asks nothing is not looked at again")
}

// Run returns only once the reconciles under way have returned: a write in
// flight when serve stops is finished, not cut.
func TestRunWaitsForTheReconcilesUnderWay(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	var finished atomic.Bool
	l := NewLoop(LoopOptions{}, func(context.Context, string) Result {
		close(started)
		<-release
		finished.Store(true)
		return Result{}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	l.Add("k")
	<-started
	cancel()
	select {
	case <-done:
		t.Fatal("Run returned while a reconcile was under way")
	case <-time.After(50 * time.Millisecond): // time under test: Run must still be waiting
	}
	close(release)
	<-done
	assert.True(t, finished.Load())
}
