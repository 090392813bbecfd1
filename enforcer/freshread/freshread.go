// Package freshread reads single objects straight from the API server, so a
// decision never rests on a lagging informer cache.
package freshread

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// Reader implements guard.FreshReader with a dynamic client.
type Reader struct {
	client dynamic.Interface
	mapper meta.RESTMapper
}

// New returns a Reader; the mapper turns kinds into resources.
func New(client dynamic.Interface, mapper meta.RESTMapper) *Reader {
	return &Reader{client: client, mapper: mapper}
}

// Get returns the object, or nil when it does not exist.
func (r *Reader) Get(ctx context.Context, gvk schema.GroupVersionKind, namespace, name string) (*unstructured.Unstructured, error) {
	mapping, err := r.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("map %s to a resource: %w", gvk, err)
	}
	obj, err := r.client.Resource(mapping.Resource).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return obj, nil
}
