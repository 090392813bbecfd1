package inventory

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
)

// Record is what the inventory caches of one object: only the fields the rule
// reads, as plain strings. An Unstructured keeps each level in its own map
// (hundreds of bytes each); a Record costs a few hundred bytes in all.
// Fields the rule treats the same when empty or absent are kept as strings;
// the infrastructureRef keeps which keys were present, because the rule reads
// apiGroup only when it is there and drops a ref without kind or name.
type Record struct {
	apiVersion, kind  string
	namespace, name   string
	deletionTimestamp string
	clusterLabel      string // metadata.labels["cluster.x-k8s.io/cluster-name"]
	clusterName       string // spec.clusterName
	providerID        string
	providerIDList    []string
	nodeRefName       string // status.nodeRef.name
	infraRef          *recordRef
}

type recordRef struct {
	present                                     refKeys
	apiGroup, apiVersion, kind, name, namespace string
}

type refKeys uint8

const (
	hasAPIGroup refKeys = 1 << iota
	hasAPIVersion
	hasKind
	hasName
	hasNamespace
)

var (
	_ runtime.Object            = (*Record)(nil)
	_ metav1.ObjectMetaAccessor = (*Record)(nil)
)

// GetObjectKind lets a Record sit in an informer's store; the store does not
// read it.
func (r *Record) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject copies the record; its strings are immutable.
func (r *Record) DeepCopyObject() runtime.Object {
	out := *r
	out.providerIDList = append([]string(nil), r.providerIDList...)
	if r.infraRef != nil {
		ref := *r.infraRef
		out.infraRef = &ref
	}
	return &out
}

// GetObjectMeta gives client-go's key functions the namespace and name; it
// is built on demand so the record does not carry a whole ObjectMeta.
func (r *Record) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: r.namespace, Name: r.name}
}

// Namespace returns the object's namespace.
func (r *Record) Namespace() string { return r.namespace }

// Name returns the object's name.
func (r *Record) Name() string { return r.name }

// Kind returns the object's kind.
func (r *Record) Kind() string { return r.kind }

// Strip is the informer transform: it replaces an Unstructured with its
// Record. Records and tombstones pass through, so it is idempotent as
// client-go requires.
func Strip(obj any) (any, error) {
	return Transform(schema.GroupVersionKind{})(obj)
}

// Transform is Strip for the informer of one kind: objects of that kind share
// its apiVersion and kind strings instead of keeping their own.
func Transform(gvk schema.GroupVersionKind) cache.TransformFunc {
	apiVersion := gvk.GroupVersion().String()
	return func(obj any) (any, error) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return obj, nil
		}
		r := NewRecord(u)
		if gvk.Kind != "" && r.kind == gvk.Kind && r.apiVersion == apiVersion {
			r.apiVersion, r.kind = apiVersion, gvk.Kind
		}
		return r, nil
	}
}

// NewRecord keeps what the rule reads of u.
func NewRecord(u *unstructured.Unstructured) *Record {
	o := u.Object
	str := func(fields ...string) string {
		s, _, _ := unstructured.NestedString(o, fields...)
		return s
	}
	r := &Record{
		apiVersion:        u.GetAPIVersion(),
		kind:              u.GetKind(),
		namespace:         u.GetNamespace(),
		name:              u.GetName(),
		deletionTimestamp: str("metadata", "deletionTimestamp"),
		clusterLabel:      str("metadata", "labels", "cluster.x-k8s.io/cluster-name"),
		clusterName:       str("spec", "clusterName"),
		providerID:        str("spec", "providerID"),
		nodeRefName:       str("status", "nodeRef", "name"),
	}
	if list, ok, _ := unstructured.NestedStringSlice(o, "spec", "providerIDList"); ok && len(list) > 0 {
		r.providerIDList = list
	}
	if ref, ok, _ := unstructured.NestedMap(o, "spec", "infrastructureRef"); ok {
		r.infraRef = &recordRef{}
		for _, f := range []struct {
			key  string
			bit  refKeys
			dest *string
		}{
			{"apiGroup", hasAPIGroup, &r.infraRef.apiGroup},
			{"apiVersion", hasAPIVersion, &r.infraRef.apiVersion},
			{"kind", hasKind, &r.infraRef.kind},
			{"name", hasName, &r.infraRef.name},
			{"namespace", hasNamespace, &r.infraRef.namespace},
		} {
			if s, ok := ref[f.key].(string); ok {
				r.infraRef.present |= f.bit
				*f.dest = s
			}
		}
	}
	return r
}

// Unstructured rebuilds the object as the rule sees it: Gatekeeper's shape,
// with only the fields the record kept.
func (r *Record) Unstructured() *unstructured.Unstructured {
	meta := map[string]any{"name": r.name}
	if r.namespace != "" {
		meta["namespace"] = r.namespace
	}
	if r.deletionTimestamp != "" {
		meta["deletionTimestamp"] = r.deletionTimestamp
	}
	if r.clusterLabel != "" {
		meta["labels"] = map[string]any{"cluster.x-k8s.io/cluster-name": r.clusterLabel}
	}
	out := map[string]any{"apiVersion": r.apiVersion, "kind": r.kind, "metadata": meta}
	spec := map[string]any{}
	for k, v := range map[string]string{"providerID": r.providerID, "clusterName": r.clusterName} {
		if v != "" {
			spec[k] = v
		}
	}
	if len(r.providerIDList) > 0 {
		list := make([]any, len(r.providerIDList))
		for i, id := range r.providerIDList {
			list[i] = id
		}
		spec["providerIDList"] = list
	}
	if ref := r.infraRef; ref != nil {
		m := map[string]any{}
		for _, f := range []struct {
			key string
			bit refKeys
			val string
		}{
			{"apiGroup", hasAPIGroup, ref.apiGroup},
			{"apiVersion", hasAPIVersion, ref.apiVersion},
			{"kind", hasKind, ref.kind},
			{"name", hasName, ref.name},
			{"namespace", hasNamespace, ref.namespace},
		} {
			if ref.present&f.bit != 0 {
				m[f.key] = f.val
			}
		}
		spec["infrastructureRef"] = m
	}
	if len(spec) > 0 {
		out["spec"] = spec
	}
	if r.nodeRefName != "" {
		out["status"] = map[string]any{"nodeRef": map[string]any{"name": r.nodeRefName}}
	}
	return &unstructured.Unstructured{Object: out}
}

// InfraRef is the Machine's spec.infrastructureRef; see InfraRef.
func (r *Record) InfraRef() (Ref, bool) {
	ref := r.infraRef
	if ref == nil || ref.kind == "" || ref.name == "" {
		return Ref{}, false
	}
	gvk := schema.GroupVersionKind{Kind: ref.kind}
	if ref.present&hasAPIGroup != 0 {
		gvk.Group = ref.apiGroup
	} else if gv, err := schema.ParseGroupVersion(ref.apiVersion); err == nil {
		gvk.Group, gvk.Version = gv.Group, gv.Version
	}
	ns := ref.namespace
	if ns == "" {
		ns = r.namespace
	}
	return Ref{GVK: gvk, Namespace: ns, Name: ref.name}, true
}

// recordOf reads a stored object. Informers store Records; an Unstructured
// added without Strip is read the same way, at the cost of its memory.
func recordOf(obj any) (*Record, error) {
	switch o := obj.(type) {
	case *Record:
		return o, nil
	case *unstructured.Unstructured:
		return NewRecord(o), nil
	default:
		return nil, fmt.Errorf("inventory holds %T, want *inventory.Record", obj)
	}
}
