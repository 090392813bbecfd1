package kube

import (
	"context"
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
)

// ObjectOptions name the one object an Object watches.
type ObjectOptions struct {
	Client    dynamic.Interface
	Resource  schema.GroupVersionResource
	Namespace string // "" for a cluster-scoped object
	Name      string
	// Changed, when set, is called on every add, update and delete, with the
	// object as it is now (nil: it does not exist). It runs on the watch's
	// own goroutine, one call at a time: it must not block for long.
	Changed func(obj *unstructured.Unstructured)
	// Failed, when set, is told of each failed list or watch; client-go's
	// reflector retries with its own backoff either way.
	Failed func(error)
}

// ObjectWatch watches one object by name (a field selector on metadata.name): the
// configurations nodeguard keeps, the Constraint it follows, a Lease. The
// cache holds that object alone, without its managed fields.
type ObjectWatch struct {
	opts     ObjectOptions
	informer cache.SharedIndexInformer
	key      string
}

// WatchObject returns the watch of one object; Run runs it.
func WatchObject(opts ObjectOptions) (*ObjectWatch, error) {
	if opts.Client == nil || opts.Name == "" {
		return nil, fmt.Errorf("watch %s: a client and a name are required", opts.Resource.Resource)
	}
	byName := func(o *metav1.ListOptions) { o.FieldSelector = "metadata.name=" + opts.Name }
	informer := dynamicinformer.NewFilteredDynamicInformer(opts.Client, opts.Resource, opts.Namespace, 0, cache.Indexers{}, byName).Informer()
	o := &ObjectWatch{opts: opts, informer: informer, key: opts.Name}
	if opts.Namespace != "" {
		o.key = opts.Namespace + "/" + opts.Name
	}
	var handlerErr error
	if opts.Changed != nil {
		_, handlerErr = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { opts.Changed(o.current()) },
			UpdateFunc: func(_, _ any) { opts.Changed(o.current()) },
			DeleteFunc: func(any) { opts.Changed(o.current()) },
		})
	}
	// Whoever needs to know reads Failed; client-go's own log line per
	// failure would repeat it for an unreachable cluster every backoff.
	failed := func(_ context.Context, _ *cache.Reflector, err error) {
		if opts.Failed != nil {
			opts.Failed(err)
		}
	}
	// These fail only on an informer already started: this one is not.
	if err := errors.Join(informer.SetTransform(dropManagedFields), handlerErr, informer.SetWatchErrorHandlerWithContext(failed)); err != nil {
		return nil, fmt.Errorf("watch %s %s: %w", opts.Resource.Resource, opts.Name, err)
	}
	return o, nil
}

// Run watches until ctx is done.
func (o *ObjectWatch) Run(ctx context.Context) { o.informer.RunWithContext(ctx) }

// Get is the object as last seen; false when it does not exist (or was not
// listed yet: see Synced).
func (o *ObjectWatch) Get() (*unstructured.Unstructured, bool) {
	obj, ok, _ := o.informer.GetStore().GetByKey(o.key)
	if !ok {
		return nil, false
	}
	u, ok := obj.(*unstructured.Unstructured)
	return u, ok
}

func (o *ObjectWatch) current() *unstructured.Unstructured {
	u, _ := o.Get()
	return u
}

// Synced says whether the first list is in: before, Get's false means
// nothing.
func (o *ObjectWatch) Synced() bool { return o.informer.HasSynced() }

// dropManagedFields keeps an object without its managedFields, which
// nothing here reads and which can be most of a small object.
func dropManagedFields(obj any) (any, error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		u.SetManagedFields(nil)
	}
	return obj, nil
}
