// This file writes the objects nodeguard owns in any cluster (the
// webhook configurations, Gatekeeper's Provider, the fleet's status) one
// way: server-side apply under one field manager, so `kubectl get
// --show-managed-fields` names nodeguard for every field it set and another
// manager's change to one of them is taken back on the next apply.

package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// FieldManager owns every field nodeguard writes.
const FieldManager = "nodeguard"

// ManagedByLabel marks an object as nodeguard's, and its value says which component
// keeps it.
const ManagedByLabel = "app.kubernetes.io/managed-by"

// Owned is what ApplyOwned writes: the resource and the object, cluster-scoped
// when it has no namespace.
type Owned struct {
	Resource schema.GroupVersionResource
	Object   *unstructured.Unstructured
}

// OwnedFrom converts a typed object (with its TypeMeta set) for ApplyOwned.
func OwnedFrom(gvr schema.GroupVersionResource, obj runtime.Object) (Owned, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return Owned{}, fmt.Errorf("convert %s: %w", gvr.Resource, err)
	}
	return Owned{Resource: gvr, Object: &unstructured.Unstructured{Object: m}}, nil
}

// client is o's resource; a namespace of "" addresses a cluster-scoped one.
func (o Owned) client(c dynamic.Interface) dynamic.ResourceInterface {
	return c.Resource(o.Resource).Namespace(o.Object.GetNamespace())
}

func (o Owned) String() string {
	if ns := o.Object.GetNamespace(); ns != "" {
		return fmt.Sprintf("%s %s/%s", o.Object.GetKind(), ns, o.Object.GetName())
	}
	return o.Object.GetKind() + " " + o.Object.GetName()
}

// ApplyOwned writes o with server-side apply, forcing nodeguard's ownership of
// the fields it sets, and returns the object as the API server stored it.
func ApplyOwned(ctx context.Context, c dynamic.Interface, o Owned) (*unstructured.Unstructured, error) {
	out, err := o.client(c).Apply(ctx, o.Object.GetName(), o.Object, metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	if err != nil {
		return nil, fmt.Errorf("apply %s: %w", o, err)
	}
	return out, nil
}

// CreateOwned writes o only if it does not exist yet (an apply cannot say so):
// the error is AlreadyExists (apierrors.IsAlreadyExists) when another writer
// created it first.
func CreateOwned(ctx context.Context, c dynamic.Interface, o Owned) (*unstructured.Unstructured, error) {
	out, err := o.client(c).Create(ctx, o.Object, metav1.CreateOptions{FieldManager: FieldManager})
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", o, err)
	}
	return out, nil
}

// RestoreOwned makes the object in the cluster hold what o says and nothing else
// in the fields o sets: an apply takes back the fields another manager
// changed, but it cannot remove a field another manager added (an
// objectSelector that would let Nodes pass, say), so where the applied
// object still differs from o, the object is replaced by o as a whole.
// It returns the stored object and whether it was replaced.
func RestoreOwned(ctx context.Context, c dynamic.Interface, o Owned, fields ...string) (*unstructured.Unstructured, bool, error) {
	out, err := ApplyOwned(ctx, c, o)
	if err != nil {
		return nil, false, err
	}
	if Holds(out, o.Object, fields...) {
		return out, false, nil
	}
	replace := o.Object.DeepCopy()
	replace.SetResourceVersion(out.GetResourceVersion())
	out, err = o.client(c).Update(ctx, replace, metav1.UpdateOptions{FieldManager: FieldManager})
	if err != nil {
		return nil, false, fmt.Errorf("replace %s: %w", o, err)
	}
	return out, true, nil
}

// Holds says whether have's fields (top-level keys, e.g. "webhooks") equal
// want's exactly, as JSON, and have carries every label of want's.
func Holds(have, want *unstructured.Unstructured, fields ...string) bool {
	if have == nil {
		return false
	}
	labels := have.GetLabels()
	for k, v := range want.GetLabels() {
		if labels[k] != v {
			return false
		}
	}
	for _, f := range fields {
		if !sameJSON(have.Object[f], want.Object[f]) {
			return false
		}
	}
	return true
}

// Sets says whether have's field (e.g. "spec") holds every key of want's
// with want's value, and have carries every label of want's: fields others
// set beside them do not count.
func Sets(have, want *unstructured.Unstructured, field string) bool {
	if have == nil || !Holds(have, want) {
		return false
	}
	h, _ := have.Object[field].(map[string]any)
	for k, v := range want.Object[field].(map[string]any) {
		if !sameJSON(h[k], v) {
			return false
		}
	}
	return true
}

// sameJSON compares two values as JSON: an int64 from the API server and an
// int32 from a typed object are the same number.
func sameJSON(a, b any) bool {
	norm := func(v any) any {
		raw, err := json.Marshal(v)
		if err != nil {
			return err.Error()
		}
		var out any
		_ = json.Unmarshal(raw, &out)
		return out
	}
	return reflect.DeepEqual(norm(a), norm(b))
}

// Owner is ManagedByLabel's value on what nodeguard keeps; an object whose ManagedByLabel
// says another manager (Helm, kustomize) is not nodeguard's to delete.
const Owner = "nodeguard"

// DeleteOwned removes the object name of gvr (in namespace, "" when
// cluster-scoped) if ManagedByLabel says nodeguard keeps it: one it does not own is
// left alone. A missing object is no error.
func DeleteOwned(ctx context.Context, c dynamic.Interface, gvr schema.GroupVersionResource, namespace, name string) (bool, error) {
	return DeleteOwnedIf(ctx, c, gvr, namespace, name, nil)
}

// DeleteOwnedIf is DeleteOwned of an object mine also says is this
// nodeguard's (nil: any nodeguard's), deleted only as it was read: one
// changed in between (another install took it over) fails with a conflict.
func DeleteOwnedIf(ctx context.Context, c dynamic.Interface, gvr schema.GroupVersionResource, namespace, name string,
	mine func(*unstructured.Unstructured) bool) (bool, error) {
	r := c.Resource(gvr).Namespace(namespace)
	have, err := r.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("get %s %s: %w", gvr.Resource, name, err)
	}
	if have.GetLabels()[ManagedByLabel] != Owner || (mine != nil && !mine(have)) {
		return false, nil
	}
	uid := have.GetUID()
	pre := &metav1.Preconditions{UID: &uid}
	if mine != nil {
		rv := have.GetResourceVersion()
		pre.ResourceVersion = &rv
	}
	err = r.Delete(ctx, name, metav1.DeleteOptions{Preconditions: pre})
	if err != nil && !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("delete %s %s: %w", gvr.Resource, name, err)
	}
	return err == nil, nil
}
