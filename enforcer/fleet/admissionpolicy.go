package fleet

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/nodeguard/nodeguard/enforcer/admissionpolicy"
	"github.com/nodeguard/nodeguard/enforcer/enforcement"
	"github.com/nodeguard/nodeguard/enforcer/owned"
	"github.com/nodeguard/nodeguard/enforcer/webhookconfig"
)

// ModeAdmissionPolicy has the workload API server decide Node deletes itself,
// with a ValidatingAdmissionPolicy that reads the Nodes nodeguard released
// (package admissionpolicy): no network path to nodeguard, and with
// nodeguard down what was released stays deletable and nothing else is.
const ModeAdmissionPolicy = "admission-policy"

// policyWatch is what a session watches in mode admission-policy, started
// the first time the Cluster is in that mode.
type policyWatch struct {
	policy, binding, params cache.Store
	synced                  func() bool
}

// watchPolicy starts the watches of the policy, its binding and the
// released Nodes in w's cluster until the session ends.
func (r *Reconciler) watchPolicy(key string, w *watch) *policyWatch {
	if w.policy != nil {
		return w.policy
	}
	byName := func(name string) dynamicinformer.TweakListOptionsFunc {
		return func(o *metav1.ListOptions) { o.FieldSelector = "metadata.name=" + name }
	}
	cluster := dynamicinformer.NewFilteredDynamicSharedInformerFactory(w.dyn, 0, "", byName(r.policyInfo.Name))
	params := dynamicinformer.NewFilteredDynamicSharedInformerFactory(w.dyn, 0, admissionpolicy.ParamsNamespace, byName(admissionpolicy.ParamsName))
	queue := func(any) { r.queue.Add(key) }
	handler := cache.ResourceEventHandlerFuncs{AddFunc: queue, UpdateFunc: func(_, obj any) { queue(obj) }, DeleteFunc: queue}
	var informers []cache.SharedIndexInformer
	for _, i := range []cache.SharedIndexInformer{
		cluster.ForResource(admissionpolicy.PolicyGVR).Informer(),
		cluster.ForResource(admissionpolicy.BindingGVR).Informer(),
		params.ForResource(admissionpolicy.ParamsGVR).Informer(),
	} {
		_, _ = i.AddEventHandler(handler)
		// The reconcile reports what cannot be read; this only keeps the log quiet.
		_ = i.SetWatchErrorHandlerWithContext(func(context.Context, *cache.Reflector, error) {})
		informers = append(informers, i)
	}
	pw := &policyWatch{policy: informers[0].GetStore(), binding: informers[1].GetStore(), params: informers[2].GetStore(),
		synced: func() bool {
			for _, i := range informers {
				if !i.HasSynced() {
					return false
				}
			}
			return true
		}}
	cluster.Start(w.done)
	params.Start(w.done)
	w.policy = pw
	return pw
}

// servesPolicies says whether the workload API server serves
// ValidatingAdmissionPolicy at v1 (GA in Kubernetes 1.30).
func servesPolicies(w *watch) (bool, error) {
	list, err := w.kube.Discovery().ServerResourcesForGroupVersion(admissionpolicy.PolicyGVR.GroupVersion().String())
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for _, res := range list.APIResources {
		if res.Name == admissionpolicy.PolicyGVR.Resource {
			return true, nil
		}
	}
	return false, nil
}

// guardPolicy installs the policy and its binding where missing or
// different, has the released Nodes published, removes a webhook
// configuration left from mode webhook, and proves the cluster guarded.
func (r *Reconciler) guardPolicy(ctx context.Context, key string, w *watch, before State, st *State, action enforcement.Action) {
	if w.servesPolicies == nil {
		ok, err := servesPolicies(w)
		if err != nil {
			st.Reason, st.Message = failure(err, ReasonNotInstalled), "discover ValidatingAdmissionPolicy: "+err.Error()+r.repaired(ctx, key, w, err)
			return
		}
		w.servesPolicies = &ok
	}
	if !*w.servesPolicies {
		st.Reason, st.Message = ReasonModeUnsupported, "the workload API server does not serve admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (Kubernetes 1.30 or later)"
		return
	}
	if _, ok, _ := w.store.GetByKey(webhookconfig.Name); ok {
		if _, err := owned.Delete(ctx, w.dyn, webhookconfig.GVR, "", webhookconfig.Name); err != nil {
			st.Reason, st.Message = failure(err, ReasonNotInstalled), "remove the webhook configuration of mode webhook: "+err.Error()
			return
		}
	}
	pw := r.watchPolicy(key, w)
	if !r.opts.Releases.Enrolled(key) {
		r.opts.Releases.Enroll(key, func(ctx context.Context, cm *corev1.ConfigMap) error {
			o, err := owned.From(admissionpolicy.ParamsGVR, cm)
			if err != nil {
				return err
			}
			_, err = owned.Apply(ctx, w.dyn, o)
			return err
		})
	}
	if !pw.synced() {
		st.Reason, st.Message = ReasonNotInstalled, "reading the policy, its binding and the released Nodes there"
		return
	}
	opts := r.policyOptions()
	opts.Action = action
	policy, binding, err := admissionpolicy.Build(r.policyInfo, opts)
	if err != nil {
		st.Reason, st.Message = ReasonNotInstalled, err.Error()
		return
	}
	applied := false
	for _, want := range []struct {
		store cache.Store
		gvr   schema.GroupVersionResource
		obj   runtime.Object
	}{{pw.policy, admissionpolicy.PolicyGVR, policy}, {pw.binding, admissionpolicy.BindingGVR, binding}} {
		o, err := owned.From(want.gvr, want.obj)
		if err != nil {
			st.Reason, st.Message = ReasonNotInstalled, err.Error()
			return
		}
		var have *unstructured.Unstructured
		if obj, ok, _ := want.store.GetByKey(r.policyInfo.Name); ok {
			have, _ = obj.(*unstructured.Unstructured)
		}
		if owned.Holds(have, o.Object, "spec") {
			continue
		}
		if _, _, err := owned.Restore(ctx, w.dyn, o, "spec"); err != nil {
			st.Reason, st.Message = failure(err, ReasonNotInstalled), fmt.Sprintf("install %s: %v%s", o, err, r.repaired(ctx, key, w, err))
			return
		}
		applied = true
	}
	if applied {
		r.opts.Log.Info("fleet: nodeguard's admission policy installed", "cluster", key)
	}
	st.Wired, st.CACurrent = true, true // no CA in this mode: nothing to go stale
	if _, ok, _ := pw.params.GetByKey(admissionpolicy.ParamsNamespace + "/" + admissionpolicy.ParamsName); !ok {
		// Deleted there, or not written yet: every Node delete is denied
		// until the publisher writes it again.
		r.opts.Releases.Rewrite(key)
		st.Wired = false
		st.Reason, st.Message = ReasonNotInstalled, "the released Nodes ("+admissionpolicy.ParamsNamespace+"/"+admissionpolicy.ParamsName+
			") are not published there yet: every Node delete is denied until they are"
		return
	}
	due := applied || !before.Guarded || time.Since(before.LastProof) >= r.opts.ProofInterval
	if !due {
		st.Guarded, st.Reason, st.Message = true, "", ""
		return
	}
	r.provePolicy(ctx, key, w, pw, st, action)
}

// provePolicy makes a dry-run delete of a Node that is not released, as
// nodeguard: the cluster is guarded when the policy denies it.
func (r *Reconciler) provePolicy(ctx context.Context, key string, w *watch, pw *policyWatch, st *State, action enforcement.Action) {
	nodes, err := w.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: 100})
	if err != nil {
		st.Reason, st.Message = failure(err, ReasonUnreachable), "list Nodes: "+err.Error()+r.repaired(ctx, key, w, err)
		return
	}
	var released map[string]any
	if obj, ok, _ := pw.params.GetByKey(admissionpolicy.ParamsNamespace + "/" + admissionpolicy.ParamsName); ok {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			released, _, _ = unstructured.NestedMap(u.Object, "data")
		}
	}
	var node *corev1.Node
	for i := range nodes.Items {
		if uid, ok := released[nodes.Items[i].Name]; !ok || uid != string(nodes.Items[i].UID) {
			node = &nodes.Items[i]
			break
		}
	}
	if node == nil {
		st.Reason, st.Message = ReasonNoNodes, "the workload cluster has no Node that is not released to prove the policy on"
		return
	}
	if w.user == "" {
		w.user = whoAmI(ctx, w.kube)
		st.Identity = w.user
	}
	var warnings []string
	uid := node.UID
	err = w.kube.CoreV1().Nodes().Delete(withWarnings(ctx, &warnings), node.Name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll},
		Preconditions: &metav1.Preconditions{UID: &uid}})
	mark := "ValidatingAdmissionPolicy '" + r.policyInfo.Name + "'"
	if err != nil && apierrors.IsForbidden(err) && strings.Contains(err.Error(), mark) {
		st.Guarded, st.Reason, st.Message, st.LastProof = true, "", "", time.Now()
		return
	}
	for _, warning := range warnings {
		if strings.Contains(warning, mark) {
			st.Guarded, st.Reason, st.Message, st.LastProof = true, "", "", time.Now() // a warn rollout
			return
		}
	}
	if err == nil && action == enforcement.DryRun {
		st.Reason, st.Message = ReasonReviewNotReceived, "the policy's binding only audits (action dryrun): no Node delete is denied there"
		return
	}
	if err == nil {
		st.Reason, st.Message = ReasonReviewNotReceived, fmt.Sprintf("a dry-run delete of Node %s, which nodeguard has not released, was admitted: the policy does not decide there (yet)", node.Name)
		return
	}
	st.Reason, st.Message = failure(err, ReasonReviewNotReceived), fmt.Sprintf("dry-run delete of Node %s: %v", node.Name, err)
}

// removePolicy removes the guard of mode admission-policy from a cluster
// that left the mode, opted out or was deselected: once per session (the
// objects are not watched outside the mode).
func (r *Reconciler) removePolicy(ctx context.Context, key string, w *watch) error {
	if r.opts.Releases != nil {
		r.opts.Releases.Remove(key)
	}
	if w.policyRemoved {
		return nil
	}
	for _, o := range []struct {
		gvr       schema.GroupVersionResource
		namespace string
		name      string
	}{
		{admissionpolicy.BindingGVR, "", r.policyInfo.Name},
		{admissionpolicy.PolicyGVR, "", r.policyInfo.Name},
		{admissionpolicy.ParamsGVR, admissionpolicy.ParamsNamespace, admissionpolicy.ParamsName},
	} {
		var err error
		if o.namespace == "" {
			_, err = owned.Delete(ctx, w.dyn, o.gvr, "", o.name)
		} else {
			err = w.dyn.Resource(o.gvr).Namespace(o.namespace).Delete(ctx, o.name, metav1.DeleteOptions{})
			if apierrors.IsNotFound(err) {
				err = nil
			}
		}
		if err != nil && !apierrors.IsNotFound(err) && !isNotServed(err) {
			return fmt.Errorf("remove nodeguard's admission policy (%s %s): %w", o.gvr.Resource, o.name, err)
		}
	}
	w.policyRemoved = true
	return nil
}

// isNotServed is the answer of an API server that has no such resource.
func isNotServed(err error) bool {
	return strings.Contains(err.Error(), "the server could not find the requested resource")
}
