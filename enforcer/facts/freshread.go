// This file reads single objects straight from the API server, so a
// decision never rests on a lagging informer cache.

package facts

import (
	"context"
	"fmt"

	"golang.org/x/sync/singleflight"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/nodeguard/nodeguard/enforcer/kube"
)

// FreshReader implements guard.FreshReader with a dynamic client.
type FreshReader struct {
	client dynamic.Interface
	mapper meta.RESTMapper
	// reads lets concurrent Gets of one object share one GET (a burst of
	// reviews of Nodes of one pool, or a flood naming one Machine). A read
	// is shared only while it is in flight: nothing is cached.
	reads singleflight.Group
}

// NewFreshReader returns a FreshReader; the mapper turns kinds into resources.
func NewFreshReader(client dynamic.Interface, mapper meta.RESTMapper) *FreshReader {
	return &FreshReader{client: client, mapper: mapper}
}

// Get returns the object, or nil when it does not exist. Concurrent callers
// of the same object may receive the same *Unstructured: do not modify it.
func (r *FreshReader) Get(ctx context.Context, gvk schema.GroupVersionKind, namespace, name string) (*unstructured.Unstructured, error) {
	key := gvk.String() + "|" + namespace + "/" + name
	ch := r.reads.DoChan(key, func() (any, error) {
		// The first caller's deadline bounds the shared GET; its
		// cancellation alone must not fail the callers that joined it.
		rctx := context.WithoutCancel(ctx)
		if deadline, ok := ctx.Deadline(); ok {
			var cancel context.CancelFunc
			rctx, cancel = context.WithDeadline(rctx, deadline)
			defer cancel()
		}
		return r.get(rctx, gvk, namespace, name)
	})
	select {
	case res := <-ch:
		if res.Err != nil {
			return nil, res.Err
		}
		return res.Val.(*unstructured.Unstructured), nil
	case <-ctx.Done():
		return nil, fmt.Errorf("get %s %s/%s: %w", gvk.Kind, namespace, name, ctx.Err())
	}
}

func (r *FreshReader) get(ctx context.Context, gvk schema.GroupVersionKind, namespace, name string) (*unstructured.Unstructured, error) {
	mapping, err := kube.RESTMapping(r.mapper, gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("map %s to a resource: %w", gvk, err)
	}
	obj, err := r.client.Resource(mapping.Resource).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return obj, err
}
