package fleet

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// ModeAdmissionPolicy has the workload API server decide Node deletes itself,
// with a ValidatingAdmissionPolicy that reads the Nodes nodeguard released
// (admission.BuildPolicy): no network path to nodeguard, and with
// nodeguard down what was released stays deletable and nothing else is.
const ModeAdmissionPolicy = "admission-policy"

// Removal of a policy waits for the API server to stop applying its binding
// before the released Nodes go (without them an applied binding denies every
// Node delete): seen by a dry run when a Node that is not released exists,
// else taken as done bindingApplyTime after the delete (kube-apiserver
// refreshes its policies every second), and given up waiting for after
// removalMaxWait.
const (
	bindingApplyTime = 3 * time.Second
	removalMaxWait   = 30 * time.Second
)

// servesPolicies says whether the workload API server serves
// ValidatingAdmissionPolicy at v1 (GA in Kubernetes 1.30).
func servesPolicies(s *session) (bool, error) {
	list, err := s.kube.Discovery().ServerResourcesForGroupVersion(admission.PolicyGVR.GroupVersion().String())
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(list.APIResources, func(res metav1.APIResource) bool { return res.Name == admission.PolicyGVR.Resource }), nil
}

// enroll has the released Nodes of a Cluster published (by the leader),
// through its connection as it is at each write.
func (r *Reconciler) enroll(key string) {
	if r.opts.Releases.Enrolled(key) {
		return
	}
	r.opts.Releases.Enroll(key, func(ctx context.Context, cm *corev1.ConfigMap) error {
		c, ok := r.opts.Clusters.Get(key)
		if !ok {
			return fmt.Errorf("no connection to workload cluster %s", key)
		}
		o, err := kube.OwnedFrom(admission.ParamsGVR, cm)
		if err != nil {
			return err
		}
		_, err = kube.ApplyOwned(ctx, c.Dynamic, o)
		return err
	})
}

// guardPolicy keeps mode admission-policy: the released Nodes published
// first, then the policy and its binding installed where missing or
// different, proven, and only then the webhook configuration of mode
// webhook removed.
func (r *Reconciler) guardPolicy(ctx context.Context, key string, s *session, t *tracked, st State, action rule.Action) outcome {
	if !s.synced() {
		return r.unsynced(t, st)
	}
	if s.servesPolicies == nil {
		ok, err := servesPolicies(s)
		if err != nil {
			return unguarded(st, failure(err, ReasonNotInstalled), "discover ValidatingAdmissionPolicy: "+err.Error()+r.repaired(ctx, key, s, err), retryUnguarded)
		}
		s.servesPolicies = &ok
	}
	if !*s.servesPolicies {
		return unguarded(st, ReasonModeUnsupported, "the workload API server does not serve admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (Kubernetes 1.30 or later)", 0)
	}
	r.enroll(key)
	t.removing = time.Time{}
	_, bound := s.binding.Get()
	if _, ok := s.params.Get(); !ok {
		// Not published yet, or deleted there: written at the next flush.
		r.opts.Releases.Rewrite(key)
		if !bound {
			// Entering the mode: the policy waits for the released Nodes,
			// else it would deny every Node delete until they are written.
			if t.entering.IsZero() {
				t.entering = time.Now()
			}
			st.Reason, st.Message = ReasonNotInstalled, "the released Nodes ("+admission.ParamsNamespace+"/"+admission.ParamsName+
				") are not published there yet (every Node is judged first); the policy is installed once they are"
			return outcome{state: st, settling: time.Since(t.entering) < publishWait, after: r.opts.SettleRetry}
		}
		st.Reason, st.Message = ReasonNotInstalled, "the released Nodes ("+admission.ParamsNamespace+"/"+admission.ParamsName+
			") are not there: every Node delete is denied until they are written again"
		return outcome{state: st, after: r.opts.SettleRetry}
	}
	t.entering = time.Time{}
	r.mu.Lock()
	opts := r.policy
	r.mu.Unlock()
	opts.Action = action
	policy, binding, err := admission.BuildPolicy(r.policyInfo, opts)
	if err != nil {
		return unguarded(st, ReasonNotInstalled, err.Error(), 0)
	}
	applied := false
	for _, want := range []struct {
		watch *kube.ObjectWatch
		gvr   schema.GroupVersionResource
		obj   runtime.Object
	}{{s.policy, admission.PolicyGVR, policy}, {s.binding, admission.BindingGVR, binding}} {
		o, err := kube.OwnedFrom(want.gvr, want.obj)
		if err != nil {
			return unguarded(st, ReasonNotInstalled, err.Error(), 0)
		}
		have, _ := want.watch.Get()
		if kube.Holds(have, o.Object, "spec") {
			continue
		}
		if _, _, err := kube.RestoreOwned(ctx, s.c.Dynamic, o, "spec"); err != nil {
			return unguarded(st, failure(err, ReasonNotInstalled), fmt.Sprintf("install %s: %v%s", o, err, r.repaired(ctx, key, s, err)), retryUnguarded)
		}
		applied = true
	}
	if applied {
		t.wrote()
		r.opts.Log.Info("fleet: nodeguard's admission policy installed", "cluster", key, "action", string(action))
	}
	st.Wired, st.CACurrent = true, true // no CA in this mode: nothing to go stale
	t.expecting(fmt.Sprintf("%s/%s/%q/%q", ModeAdmissionPolicy, action, opts.ExemptUsers, opts.ExemptGroups))
	o := r.proven(t, st)
	if r.proofDue(t) {
		var found proof
		if o, found = r.provePolicy(ctx, key, s, t, st, action); !found.matched {
			return o
		}
	}
	// Proven: the webhook configuration of mode webhook can go.
	if _, ok := s.vwc.Get(); ok {
		if _, err := r.delete(ctx, s, admission.WebhookConfigGVR, "", admission.Name); err != nil {
			r.opts.Log.Warn("fleet: cannot remove the webhook configuration of mode webhook; trying again", "cluster", key, "error", err.Error())
			o.after = min(o.after, retryUnguarded)
		}
	}
	return o
}

// provePolicy makes a dry-run delete of a Node that is not released, as
// nodeguard: it finds what was written when the policy answers with the
// binding's action (deny: denied; warn: its warning; dryrun: admitted).
func (r *Reconciler) provePolicy(ctx context.Context, key string, s *session, t *tracked, st State, action rule.Action) (outcome, proof) {
	node, err := s.unreleased(ctx)
	if err != nil {
		return unguarded(st, failure(err, ReasonUnreachable), "list Nodes: "+err.Error()+r.repaired(ctx, key, s, err), retryUnguarded), proof{}
	}
	if node == nil {
		return unguarded(st, ReasonNoNodes, "the workload cluster has no Node that is not released to prove the policy on", retryUnguarded), proof{}
	}
	warnings, err := r.dryRun(ctx, s, node)
	found := rule.Action("")
	switch {
	case apierrors.IsForbidden(err) && r.policyDenied(err):
		found = rule.ActionDeny
	case err == nil && r.policyWarned(warnings):
		found = rule.ActionWarn
	case err == nil:
		found = rule.ActionDryRun
	}
	if found == action {
		return r.matched(t, st, action, "the policy's binding only audits (enforcement action dryrun): no Node delete is denied there")
	}
	p := proof{lag: true}
	switch found {
	case rule.ActionDeny, rule.ActionWarn:
		// Guarded, though not as written (the API server still applies the
		// binding before it): true, and proven again soon.
		st.Guarded, st.Reason, st.Message = true, "", ""
	case rule.ActionDryRun:
		st.Reason, st.Message = ReasonReviewNotReceived, fmt.Sprintf("a dry-run delete of Node %s, which nodeguard has not released, was admitted: the policy does not decide there (yet)", node.Name)
	default:
		st.Reason, st.Message = failure(err, ReasonReviewNotReceived), fmt.Sprintf("dry-run delete of Node %s: %v", node.Name, err)
		p.lag = false
	}
	o := r.settle(t, st, p)
	if st.Guarded {
		o.after = min(o.after, retryUnguarded)
	}
	return o, p
}

// released is the Nodes the published ConfigMap releases there, by name
// (their UIDs), as last seen.
func (s *session) released() map[string]string {
	if s.params == nil {
		return nil
	}
	obj, ok := s.params.Get()
	if !ok {
		return nil
	}
	data, _, _ := unstructured.NestedStringMap(obj.Object, "data")
	return data
}

// unreleased is a Node the published ConfigMap does not release (nil: none
// of the first 100).
func (s *session) unreleased(ctx context.Context) (*corev1.Node, error) {
	nodes, err := s.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: 100})
	if err != nil {
		return nil, err
	}
	released := s.released()
	for i := range nodes.Items {
		if uid, ok := released[nodes.Items[i].Name]; !ok || uid != string(nodes.Items[i].UID) {
			return &nodes.Items[i], nil
		}
	}
	return nil, nil
}

// policyObject is one of the objects the fleet keeps in a workload cluster
// (watch: its watch there, if any).
type policyObject struct {
	gvr             schema.GroupVersionResource
	namespace, name string
	watch           *kube.ObjectWatch
}

func (r *Reconciler) policyObjects(s *session) (binding, policy, params policyObject) {
	return policyObject{admission.BindingGVR, "", r.policyInfo.Name, s.binding},
		policyObject{admission.PolicyGVR, "", r.policyInfo.Name, s.policy},
		policyObject{admission.ParamsGVR, admission.ParamsNamespace, admission.ParamsName, s.params}
}

// present says whether a policy object is there: from its watch, or,
// without one (no --fleet-admission-policy: nodeguard's identity may not
// read it), read with the kubeconfig's credentials.
func (s *session) present(ctx context.Context, o policyObject) (bool, error) {
	if o.watch != nil {
		_, ok := o.watch.Get()
		return ok, nil
	}
	have, err := s.c.Admin.Resource(o.gvr).Namespace(o.namespace).Get(ctx, o.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || (err != nil && isNotServed(err)) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return have.GetLabels()[kube.ManagedByLabel] == kube.Owner, nil
}

// policyLeft says whether objects of mode admission-policy are (or may be)
// there. Without the watches they are looked for once a connection.
func (r *Reconciler) policyLeft(ctx context.Context, s *session) bool {
	if s.binding == nil && s.leftoversChecked {
		return false
	}
	binding, policy, params := r.policyObjects(s)
	for _, o := range []policyObject{binding, policy, params} {
		ok, err := s.present(ctx, o)
		if err != nil || ok {
			return true // unknown: looked for again
		}
	}
	s.leftoversChecked = true
	return false
}

// delete removes an object nodeguard keeps there (where its label says so):
// with its own identity, or, where that may not, with the kubeconfig's
// credentials.
func (r *Reconciler) delete(ctx context.Context, s *session, gvr schema.GroupVersionResource, namespace, name string) (bool, error) {
	deleted, err := kube.DeleteOwned(ctx, s.c.Dynamic, gvr, namespace, name)
	if err != nil && (apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err)) && s.c.Admin != nil {
		deleted, err = kube.DeleteOwned(ctx, s.c.Admin, gvr, namespace, name)
	}
	if err != nil && isNotServed(err) {
		return false, nil
	}
	return deleted, err
}

// removePolicy removes the guard of mode admission-policy from a cluster
// that left the mode, opted out or was deselected, in the order that never
// denies a released Node: the binding; once the API server no longer
// applies it, the policy and the released Nodes. It says whether nothing is
// left.
func (r *Reconciler) removePolicy(ctx context.Context, key string, s *session, t *tracked) bool {
	if r.opts.Releases != nil {
		r.opts.Releases.Remove(key)
	}
	binding, policy, params := r.policyObjects(s)
	bound, err := s.present(ctx, binding)
	if err != nil {
		r.opts.Log.Warn("fleet: cannot read nodeguard's admission policy binding; trying again", "cluster", key, "error", err.Error())
		return false
	}
	if bound {
		if _, err := r.delete(ctx, s, binding.gvr, "", binding.name); err != nil {
			r.opts.Log.Warn("fleet: cannot remove nodeguard's admission policy binding; trying again", "cluster", key, "error", err.Error())
			return false
		}
		r.opts.Log.Info("fleet: removed nodeguard's admission policy binding", "cluster", key)
		t.removing = time.Now()
		return false
	}
	left := false
	for _, o := range []policyObject{policy, params} {
		ok, err := s.present(ctx, o)
		left = left || ok || err != nil
	}
	if left {
		if t.removing.IsZero() {
			t.removing = time.Now() // gone before it was seen: wait as if just removed
		}
		if !r.bindingUnapplied(ctx, s, t) {
			return false
		}
		for _, o := range []policyObject{policy, params} {
			if _, err := r.delete(ctx, s, o.gvr, o.namespace, o.name); err != nil {
				r.opts.Log.Warn("fleet: cannot remove nodeguard's admission policy; trying again", "cluster", key, "error", err.Error())
				return false
			}
		}
		r.opts.Log.Info("fleet: removed nodeguard's admission policy and its released Nodes", "cluster", key,
			"waitedForTheBinding", time.Since(t.removing).Round(time.Millisecond).String())
	}
	t.removing = time.Time{}
	if s.binding == nil {
		s.leftoversChecked = true
	}
	return true
}

// bindingUnapplied says whether the API server no longer applies the
// binding removed at t.removing: a dry-run delete of a Node that is not
// released is not the policy's to answer any more.
func (r *Reconciler) bindingUnapplied(ctx context.Context, s *session, t *tracked) bool {
	since := time.Since(t.removing)
	if since >= removalMaxWait {
		return true
	}
	node, err := s.unreleased(ctx)
	if err != nil || node == nil {
		return since >= bindingApplyTime
	}
	warnings, err := r.dryRun(ctx, s, node)
	return !r.policyWarned(warnings) && !r.policyDenied(err)
}

// removeAll removes everything the fleet keeps in a cluster nodeguard is to
// stay out of; it returns when to look again (0: nothing left to do, or no
// way to now: a change queues the Cluster).
func (r *Reconciler) removeAll(ctx context.Context, key string, s *session, t *tracked) time.Duration {
	if r.opts.Releases != nil {
		r.opts.Releases.Remove(key)
	}
	if s == nil || !s.synced() {
		return 0
	}
	if h := r.opts.Clusters.Health(key); h.Checked && !h.Reachable {
		return 0 // its return is told
	}
	if _, ok := s.vwc.Get(); ok {
		deleted, err := r.delete(ctx, s, admission.WebhookConfigGVR, "", admission.Name)
		if err != nil {
			r.opts.Log.Warn("fleet: cannot remove nodeguard's configuration; trying again", "cluster", key, "error", err.Error())
			return retryUnguarded
		}
		if deleted {
			r.opts.Log.Info("fleet: removed nodeguard's configuration", "cluster", key)
		}
	}
	if !r.policyLeft(ctx, s) {
		return 0
	}
	if !r.removePolicy(ctx, key, s, t) {
		return r.opts.SettleRetry
	}
	return 0
}

// isNotServed is the answer of an API server that has no such resource.
func isNotServed(err error) bool {
	return strings.Contains(err.Error(), "the server could not find the requested resource")
}
