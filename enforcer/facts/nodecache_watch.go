package facts

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/nodeguard/nodeguard/enforcer/record"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// nodesGVR is core Nodes, for a dynamic client.
var nodesGVR = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}

// NodeWatchOptions configure a NodeWatch.
type NodeWatchOptions struct {
	Shape *record.Shape
	// Kube watches Nodes through the typed client (protobuf when its config
	// asks for it: a Node decodes several times faster than as JSON); when
	// nil, Dynamic does, as unstructured JSON.
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
	// OnChange is called with the name of each Node added, deleted, or
	// changed in what the criteria read.
	OnChange func(name string)
	// OnVerdict, when set, is called instead of OnChange for a Node whose
	// change is only in Verdicts (nodeguard's verdicts on it, which no
	// criterion reads): knowing what it carries needs no judgment.
	Verdicts  []rule.Path
	OnVerdict func(name string)
	// OnError is called with each failed list or watch request; the informer
	// retries with client-go's backoff (at most about every 30 s) either way.
	OnError func(err error)
}

// NodeWatch is a Nodes cache filled by an informer: one list (or, on an API
// server that streams it, one watch) and then watch events, never a list per
// pass. Each Node is reduced as it arrives, so the cache holds only Nodes.
type NodeWatch struct {
	*Nodes
	informer cache.SharedIndexInformer
}

// NewNodeWatch builds the informer; Run starts it.
func NewNodeWatch(opts NodeWatchOptions) (*NodeWatch, error) {
	var (
		list    func(context.Context, metav1.ListOptions) (runtime.Object, error)
		watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)
		client  any
		example runtime.Object
	)
	switch {
	case opts.Kube != nil:
		nodes := opts.Kube.CoreV1().Nodes()
		list = func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return nodes.List(ctx, o) }
		watchFn = nodes.Watch
		client, example = opts.Kube, &corev1.Node{}
	case opts.Dynamic != nil:
		nodes := opts.Dynamic.Resource(nodesGVR)
		list = func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return nodes.List(ctx, o) }
		watchFn = nodes.Watch
		client, example = opts.Dynamic, &unstructured.Unstructured{}
	default:
		return nil, fmt.Errorf("nodecache: a Node watch needs a client")
	}
	report := func(err error) {
		if opts.OnError != nil && err != nil {
			opts.OnError(err)
		}
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			obj, err := list(ctx, o)
			report(err)
			return obj, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			w, err := watchFn(ctx, o)
			report(err)
			if err != nil && o.SendInitialEvents != nil && utilnet.IsConnectionRefused(err) {
				// client-go retries a refused streaming list by itself, in a
				// backoff (up to 30 s) that stopping does not interrupt; fail it
				// (%v drops the error's type) so the reflector lists instead,
				// which stops at once.
				return nil, fmt.Errorf("stream the Nodes: %v", err)
			}
			return w, err
		},
	}
	shape := opts.Shape
	informer := cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, client), example,
		cache.SharedIndexInformerOptions{ObjectDescription: "Nodes (orphan criteria)", Indexers: shape.Indexers()})
	if err := informer.SetTransform(func(obj any) (any, error) {
		switch obj.(type) {
		case *record.Record, cache.DeletedFinalStateUnknown:
			return obj, nil
		}
		return shape.Reduce(obj)
	}); err != nil {
		return nil, fmt.Errorf("nodecache: set transform: %w", err)
	}
	// Failures are reported where they happen (above); the informer's own
	// handler would log each through klog too.
	if err := informer.SetWatchErrorHandlerWithContext(func(context.Context, *cache.Reflector, error) {}); err != nil {
		return nil, fmt.Errorf("nodecache: set watch error handler: %w", err)
	}
	w := &NodeWatch{Nodes: NewNodes(shape, informer.GetIndexer(), opts.OnChange), informer: informer}
	w.verdicts, w.onVerdict = opts.Verdicts, opts.OnVerdict
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if n := asRecord(obj); n != nil {
				w.counted(n, 1)
			}
		},
		UpdateFunc: func(old, obj any) {
			if o, n := asRecord(old), asRecord(obj); o != nil && n != nil {
				w.updated(o, n)
			}
		},
		DeleteFunc: func(obj any) {
			if n := asRecord(obj); n != nil {
				w.counted(n, -1)
			}
		},
	}); err != nil {
		return nil, fmt.Errorf("nodecache: add event handler: %w", err)
	}
	return w, nil
}

// Run runs the informer until ctx is done; nothing of it outlives the call.
func (w *NodeWatch) Run(ctx context.Context) { w.informer.RunWithContext(ctx) }

// HasSynced reports whether the first list (or streamed watch) is in.
func (w *NodeWatch) HasSynced() bool { return w.informer.HasSynced() }
