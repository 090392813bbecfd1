package facts

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/nodeguard/nodeguard/enforcer/record"
)

// A cache is trusted to hold every object of its kind from its first sync
// until a list or watch of the kind fails, or a watch reports an error (the
// API server restarted, the connection broke, 410 Gone): objects created or
// changed meanwhile may be missing. client-go's reflector resumes or relists
// on its own, but says nothing when it has caught up, so the cache is
// trusted again only once a LIST of the kind, made after a watch is back, is
// found in it (every listed object, as the rule reads it). Until then the
// cache can still show what exists; it cannot prove an absence.

// health is one kind's trust in its cache.
type health struct {
	mu sync.Mutex
	// broken: since when the cache may miss objects; zero while trusted.
	broken time.Time
	// why is the first failure since then.
	why error
	// failures counts them all, so a check knows whether one came while it
	// ran.
	failures uint64
	// verifying is set while a check runs, so one runs at a time.
	verifying bool
}

func (h *health) fail(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failures++
	if h.broken.IsZero() {
		h.broken, h.why = time.Now(), err
	}
}

// err says why the cache may miss objects, or nil.
func (h *health) err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.broken.IsZero() {
		return nil
	}
	return fmt.Errorf("since %s (%v)", h.broken.Format(time.RFC3339), h.why)
}

// startVerify reports whether a check should start now (broken, and none
// running), and the failures it covers.
func (h *health) startVerify() (uint64, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.broken.IsZero() || h.verifying {
		return 0, false
	}
	h.verifying = true
	return h.failures, true
}

// verified ends a check that began after failures; ok trusts the cache
// again, unless another failure came meanwhile. It reports whether the cache
// is trusted.
func (h *health) verified(ok bool, failures uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.verifying = false
	if ok && h.failures == failures {
		h.broken, h.why = time.Time{}, nil
	}
	return h.broken.IsZero()
}

// watchedLW lists and watches a kind (a ListWatch over its methods): it
// tells h when a list or watch fails, and starts a check of the cache when a
// watch is back after that. It can also make the reflector relist
// (forceRelist), for a check that finds the cache behind.
type watchedLW struct {
	inner  cache.ListerWatcherWithContext
	h      *health
	verify func()

	mu      sync.Mutex
	current watch.Interface // the watch being read, to end it
	relist  bool            // the next watch fails as expired: the reflector relists
}

func (lw *watchedLW) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	obj, err := lw.inner.ListWithContext(ctx, opts)
	if err != nil && ctx.Err() == nil {
		lw.h.fail(fmt.Errorf("list: %w", err))
	}
	return obj, err
}

func (lw *watchedLW) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	lw.mu.Lock()
	relist := lw.relist
	lw.relist = false
	lw.mu.Unlock()
	if relist {
		// Not retriable: the reflector ends its ListAndWatch and lists anew.
		return nil, apierrors.NewResourceExpired("nodeguard relists to catch up after a broken watch")
	}
	if opts.SendInitialEvents != nil && *opts.SendInitialEvents && lw.h.err() != nil {
		// A streaming list fills the store only at its end, which can come
		// well after the stream opened (an API server whose watch cache is
		// still starting): a check could find the old store whole and trust
		// it while new objects wait in the stream. Refused, the reflector
		// lists (the store is replaced before the watch opens) and watches.
		return nil, errors.New("nodeguard lists, not streams, while its cache catches up")
	}
	w, err := lw.inner.WatchWithContext(ctx, opts)
	if err != nil {
		if ctx.Err() == nil {
			lw.h.fail(fmt.Errorf("watch: %w", err))
		}
		return nil, err
	}
	var lasts time.Duration
	if opts.TimeoutSeconds != nil {
		lasts = time.Duration(*opts.TimeoutSeconds) * time.Second
	}
	w = observe(w, lasts, lw.h.fail)
	lw.mu.Lock()
	lw.current = w
	lw.mu.Unlock()
	lw.verify()
	return w, nil
}

// observedWatch passes a watch's events on and reports what means events may
// have been lost: an error event (410 Gone, an internal error), and an end
// the watch was not asked for before its timeout (the API server shut down,
// the connection broke: the reflector resumes after a backoff, and may make
// no request that fails in between).
type observedWatch struct {
	inner   watch.Interface
	out     chan watch.Event
	stopped chan struct{}
	once    sync.Once
}

func observe(inner watch.Interface, lasts time.Duration, fail func(error)) watch.Interface {
	w := &observedWatch{inner: inner, out: make(chan watch.Event), stopped: make(chan struct{})}
	start := time.Now()
	go func() {
		defer close(w.out)
		for e := range inner.ResultChan() {
			if e.Type == watch.Error {
				fail(fmt.Errorf("watch: %w", apierrors.FromObject(e.Object)))
			}
			select {
			case w.out <- e:
			case <-w.stopped:
				return
			}
		}
		select {
		case <-w.stopped:
		default:
			// A server ends a watch at its timeout; 90% of it is early.
			if took := time.Since(start); lasts == 0 || took < lasts*9/10 {
				fail(fmt.Errorf("watch ended after %s", took.Round(time.Millisecond)))
			}
		}
	}()
	return w
}

func (w *observedWatch) ResultChan() <-chan watch.Event { return w.out }

func (w *observedWatch) Stop() {
	w.once.Do(func() { close(w.stopped) })
	w.inner.Stop()
}

// forceRelist ends the current watch and fails the next one as expired, so
// the reflector lists the kind anew.
func (lw *watchedLW) forceRelist() {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	lw.relist = true
	if lw.current != nil {
		lw.current.Stop()
		lw.current = nil
	}
}

// verifyPage is how many objects a check lists at a time: its memory is a
// page, not the kind.
const verifyPage = 500

// verifyTimeout is how long a check waits for a listed page to show in the
// cache before it lists again.
const verifyTimeout = 3 * time.Second

// verifyCache lists the kind, page by page, and returns nil once every
// listed object is in store as the rule reads it (reduce).
func verifyCache(ctx context.Context, list func(context.Context, metav1.ListOptions) (runtime.Object, error),
	store cache.Indexer, reduce func(*unstructured.Unstructured) *record.Record) error {
	opts := metav1.ListOptions{Limit: verifyPage}
	for {
		obj, err := list(ctx, opts)
		if err != nil {
			return fmt.Errorf("list: %w", err)
		}
		page, ok := obj.(*unstructured.UnstructuredList)
		if !ok {
			return fmt.Errorf("list: got %T", obj)
		}
		if err := waitFor(ctx, page.Items, store, reduce); err != nil {
			return err
		}
		if opts.Continue = page.GetContinue(); opts.Continue == "" {
			return nil
		}
	}
}

// waitFor waits until store holds every item as the rule reads it.
func waitFor(ctx context.Context, items []unstructured.Unstructured, store cache.Indexer, reduce func(*unstructured.Unstructured) *record.Record) error {
	deadline := time.Now().Add(verifyTimeout)
	for i := 0; i < len(items); {
		want, key := reduce(&items[i]), cache.MetaObjectToName(&items[i]).String()
		have, ok, _ := store.GetByKey(key)
		if r, isRecord := have.(*record.Record); ok && isRecord && r.Equal(want) {
			i++
			continue
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s %s is not in the cache as listed", items[i].GetKind(), key)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}
