package kube

import (
	"context"
	"sync"
	"time"

	"k8s.io/client-go/util/workqueue"
)

// Result is what one reconcile learned about when to look at its key again.
type Result struct {
	// After, when positive, looks again that long from now: a due proof, a
	// Secret to read again. The queue keeps the earliest time asked for, so
	// a reconcile run early by an event asks again for the same due time.
	After time.Duration
	// Retry looks again after the key's backoff (doubling from the loop's
	// base up to its max, reset by the first result without it): a failure
	// the next try may not have.
	Retry bool
}

// LoopOptions configure a Loop.
type LoopOptions struct {
	// Name names the workqueue (its metrics, if any are registered).
	Name string
	// Workers reconcile that many keys at once (default 1); one key is never
	// reconciled by two workers at once.
	Workers int
	// BaseBackoff and MaxBackoff bound a failing key's retries (defaults 1s
	// and 1m).
	BaseBackoff, MaxBackoff time.Duration
}

// SetDefault sets an option left 0 (or negative) to its default def.
func SetDefault[T ~int | ~int64 | ~float32 | ~float64](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// Loop reconciles keys from one client-go workqueue with per-item backoff,
// as controller-runtime's reconcilers do: events Add a key, a reconcile says
// when its key is due again. Every loop of nodeguard's is one of these.
type Loop[K comparable] struct {
	queue     workqueue.TypedRateLimitingInterface[K]
	reconcile func(context.Context, K) Result
	workers   int
}

// NewLoop returns a loop that runs reconcile for each key added.
func NewLoop[K comparable](opts LoopOptions, reconcile func(context.Context, K) Result) *Loop[K] {
	SetDefault(&opts.Workers, 1)
	SetDefault(&opts.BaseBackoff, time.Second)
	SetDefault(&opts.MaxBackoff, time.Minute)
	limiter := workqueue.NewTypedItemExponentialFailureRateLimiter[K](opts.BaseBackoff, opts.MaxBackoff)
	return &Loop[K]{
		queue:     workqueue.NewTypedRateLimitingQueueWithConfig(limiter, workqueue.TypedRateLimitingQueueConfig[K]{Name: opts.Name}),
		reconcile: reconcile,
		workers:   opts.Workers,
	}
}

// Add queues a key now. It never blocks.
func (l *Loop[K]) Add(key K) { l.queue.Add(key) }

// AddAfter queues a key after d.
func (l *Loop[K]) AddAfter(key K, d time.Duration) { l.queue.AddAfter(key, d) }

// Run reconciles until ctx is done, then waits for the reconciles under way
// (their writes finish) before it returns. A loop runs once.
func (l *Loop[K]) Run(ctx context.Context) {
	stop := context.AfterFunc(ctx, l.queue.ShutDown)
	defer stop()
	var wg sync.WaitGroup
	for range l.workers {
		wg.Go(func() {
			for l.next(ctx) {
			}
		})
	}
	wg.Wait()
}

func (l *Loop[K]) next(ctx context.Context) bool {
	key, shutdown := l.queue.Get()
	if shutdown {
		return false
	}
	defer l.queue.Done(key)
	r := l.reconcile(ctx, key)
	switch {
	case ctx.Err() != nil:
		l.queue.Forget(key)
	case r.Retry:
		l.queue.AddRateLimited(key)
	default:
		l.queue.Forget(key)
		if r.After > 0 {
			l.queue.AddAfter(key, r.After)
		}
	}
	return true
}

// Failures is how many times in a row key's reconcile asked to retry.
func (l *Loop[K]) Failures(key K) int { return l.queue.NumRequeues(key) }
