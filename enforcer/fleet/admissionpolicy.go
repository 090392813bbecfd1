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
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// ModeAdmissionPolicy has the workload API server decide Node deletes itself,
// with a ValidatingAdmissionPolicy that reads the verdict nodeguard writes on
// each Node (admission.BuildPolicies): no network path to nodeguard, and
// with nodeguard down what was released stays deletable and nothing else is.
const ModeAdmissionPolicy = "admission-policy"

// Removal of a policy waits for the API server to stop applying its binding
// before the policy goes: seen by a dry run when a Node that is not released
// exists, else taken as done bindingApplyTime after the delete
// (kube-apiserver refreshes its policies every second), and given up waiting
// for after removalMaxWait. The same wait separates writing the delete
// binding from removing the binding nodeguard 0.3 left.
const (
	bindingApplyTime = 3 * time.Second
	removalMaxWait   = 30 * time.Second
)

// servesPolicies says whether the workload API server serves
// ValidatingAdmissionPolicy at v1 (GA in Kubernetes 1.30), asked once a
// connection: an API server upgraded in place is connected to again.
func (s *session) servesPolicies() (bool, error) {
	if s.served != nil {
		return *s.served, nil
	}
	list, err := s.disco.ServerResourcesForGroupVersion(admission.PolicyGVR.GroupVersion().String())
	if apierrors.IsNotFound(err) {
		list, err = &metav1.APIResourceList{}, nil
	}
	if err != nil {
		return false, err
	}
	served := slices.ContainsFunc(list.APIResources, func(res metav1.APIResource) bool { return res.Name == admission.PolicyGVR.Resource })
	s.served = &served
	return served, nil
}

// enroll has the verdicts on a Cluster's Nodes written (by the leader),
// through its connection as it is at each write.
func (r *Reconciler) enroll(key string) {
	if r.opts.Releases.Enrolled(key) {
		return
	}
	info := r.policyInfo
	r.opts.Releases.Enroll(key, func(ctx context.Context, node string, v admission.ReleaseVerdict) error {
		c, ok := r.opts.Clusters.Get(key)
		if !ok {
			return fmt.Errorf("no connection to workload cluster %s", key)
		}
		patch, err := admission.VerdictPatch(info, v)
		if err != nil {
			return err
		}
		_, err = c.Dynamic.Resource(nodeGVR).Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: kube.Owner})
		if apierrors.IsNotFound(err) {
			return nil // gone: nothing to decide on
		}
		if err != nil {
			return fmt.Errorf("write the verdict on Node %s: %w", node, err)
		}
		return nil
	})
}

var nodeGVR = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}

// guardPolicy keeps mode admission-policy: the verdicts written on the
// Nodes, the guard policy that keeps them nodeguard's installed, the delete
// policy installed and bound once every Node carries its verdict, proven;
// then the webhook configuration of mode webhook and what nodeguard 0.3's
// policy left removed.
func (r *Reconciler) guardPolicy(ctx context.Context, key string, s *session, t *tracked, st State, action rule.Action) outcome {
	if !s.synced() {
		return r.unsynced(t, st)
	}
	served, err := s.servesPolicies()
	if err != nil {
		return unguarded(st, failure(err, ReasonNotInstalled), "discover ValidatingAdmissionPolicy: "+err.Error()+r.repaired(ctx, key, s, err), retryUnguarded)
	}
	if !served {
		return unguarded(st, ReasonModeUnsupported, "the workload API server does not serve admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (Kubernetes 1.30 or later)", 0)
	}
	r.enroll(key)
	t.removing = time.Time{}
	r.mu.Lock()
	opts := r.policy
	r.mu.Unlock()
	opts.Action = action
	want, err := admission.BuildPolicies(r.policyInfo, opts)
	if err != nil {
		return unguarded(st, ReasonNotInstalled, err.Error(), 0)
	}
	if s.static == nil {
		static, err := r.staticPolicy(ctx, s)
		if err != nil {
			return unguarded(st, failure(err, ReasonUnreachable), "look for a static policy: "+err.Error()+r.repaired(ctx, key, s, err), retryUnguarded)
		}
		s.static = &static
		if static {
			r.opts.Log.Info("fleet: the workload API server loads nodeguard's policies from its static manifests; only the verdicts are written there", "cluster", key)
		}
	}
	if *s.static {
		return r.guardStatic(ctx, key, s, t, st, action, opts)
	}
	_, bound := s.binding.Get()
	applied := false
	for _, w := range []struct {
		watch *kube.ObjectWatch
		gvr   schema.GroupVersionResource
		obj   runtime.Object
	}{{s.guard, admission.PolicyGVR, want.Guard}, {s.guardBinding, admission.BindingGVR, want.GuardBinding},
		{s.policy, admission.PolicyGVR, want.Delete}, {s.binding, admission.BindingGVR, want.DeleteBinding}} {
		if w.obj == want.DeleteBinding && !bound && !r.opts.Releases.Settled(key) {
			// Entering the mode: the binding waits for the verdicts, else
			// it would deny every Node delete until they are written.
			if t.entering.IsZero() {
				t.entering = time.Now()
			}
			st.Reason, st.Message = ReasonNotInstalled, "the verdicts are not written on every Node there yet (each Node is judged first); "+
				"the delete policy is bound once they are"
			return outcome{state: st, settling: time.Since(t.entering) < publishWait, after: r.opts.SettleRetry}
		}
		o, err := kube.OwnedFrom(w.gvr, w.obj)
		if err != nil {
			return unguarded(st, ReasonNotInstalled, err.Error(), 0)
		}
		have, _ := w.watch.Get()
		if kube.Holds(have, o.Object, "spec") {
			continue
		}
		if _, _, err := kube.RestoreOwned(ctx, s.c.Dynamic, o, "spec"); err != nil {
			return unguarded(st, failure(err, ReasonNotInstalled), fmt.Sprintf("install %s: %v%s", o, err, r.repaired(ctx, key, s, err)), retryUnguarded)
		}
		applied = true
	}
	t.entering = time.Time{}
	if applied {
		t.wrote()
		r.opts.Log.Info("fleet: nodeguard's admission policies installed", "cluster", key, "action", string(action))
	}
	st.Wired, st.CACurrent = true, true // no CA in this mode: nothing to go stale
	t.expecting(fmt.Sprintf("%s/%s/%q/%q", ModeAdmissionPolicy, action, opts.ExemptUsers, opts.ExemptGroups))
	// nodeguard 0.3's binding goes once the delete binding applies
	// (bindingApplyTime after the last write), its policy once the API
	// server stopped applying it: the Cluster is looked at again until then,
	// however soon it is proven.
	var legacy time.Duration
	if !s.leftoversChecked {
		if wait := bindingApplyTime - time.Since(t.changed); wait > 0 {
			legacy = wait
		} else if !r.removeLegacy(ctx, key, s, t) {
			legacy = r.opts.SettleRetry
		}
	}
	o := r.proven(t, st)
	if r.proofDue(t) {
		var found proof
		if o, found = r.provePolicy(ctx, key, s, t, st, action); !found.matched {
			return o.within(legacy)
		}
	}
	// Proven: the webhook configuration of mode webhook can go.
	if _, ok := s.vwc.Get(); ok {
		if _, err := r.delete(ctx, s, admission.WebhookConfigGVR, "", admission.Name); err != nil {
			r.opts.Log.Warn("fleet: cannot remove the webhook configuration of mode webhook; trying again", "cluster", key, "error", err.Error())
			o.after = min(o.after, retryUnguarded)
		}
	}
	return o.within(legacy)
}

// within has the Cluster looked at again within d at the latest (d 0:
// as o says).
func (o outcome) within(d time.Duration) outcome {
	if d > 0 && (o.after <= 0 || d < o.after) {
		o.after = d
	}
	return o
}

// provePolicy makes a dry-run delete of a Node that is not released, as
// nodeguard: it finds what was written when the policy answers with the
// binding's action (deny: denied; warn: its warning; dryrun: admitted).
func (r *Reconciler) provePolicy(ctx context.Context, key string, s *session, t *tracked, st State, action rule.Action) (outcome, proof) {
	node, _, err := r.nodeWhere(ctx, s, "", false)
	if err != nil {
		return unguarded(st, failure(err, ReasonUnreachable), "list Nodes: "+err.Error()+r.repaired(ctx, key, s, err), retryUnguarded), proof{}
	}
	if node == nil {
		return unguarded(st, ReasonNoNodes, "the workload cluster has no Node that is not released to prove the policy on", retryUnguarded), proof{}
	}
	warnings, err := r.dryRun(ctx, s, node)
	found := rule.Action("")
	switch {
	case apierrors.IsForbidden(err) && r.policyDenied(err, r.policyInfo.Name, r.policyInfo.Static().Name):
		found = rule.ActionDeny
	case err == nil && r.policyWarned(warnings, r.policyInfo.Name, r.policyInfo.Static().Name):
		found = rule.ActionWarn
	case err == nil:
		found = rule.ActionDryRun
	}
	if found == action {
		return r.matched(t, st, action, "the policy's binding only audits (enforcement action dryrun): no Node delete is denied there")
	}
	p := proof{lag: true}
	switch {
	case found == rule.ActionDeny || found == rule.ActionWarn || r.policyDenied(err, admission.LegacyPolicyName):
		// Guarded, though not as written (the API server still applies the
		// binding before it, or nodeguard 0.3's denies first): true, and
		// proven again soon.
		st.Guarded, st.Reason, st.Message = true, "", ""
	case found == rule.ActionDryRun:
		st.Reason, st.Message = ReasonReviewNotReceived, fmt.Sprintf("a dry-run delete of Node %s, which nodeguard has not released, was admitted: the policy does not decide there (yet)", node.Name)
	default:
		st.Reason, st.Message = failure(err, ReasonReviewNotReceived), fmt.Sprintf("dry-run delete of Node %s: %v", node.Name, err)
		p.lag = false
	}
	o := r.settle(t, st, p)
	if st.Guarded {
		o.after = min(o.after, r.opts.SettleRetry)
	}
	return o, p
}

// staticPolicy says whether the workload API server applies nodeguard's
// delete policy from its static manifests (kube-apiserver 1.37,
// constraints/admission-policy/static/): not visible through the API, it is
// seen by a dry-run delete of a Node that is not released. Looked at once a
// connection; with no such Node to try, taken as not.
func (r *Reconciler) staticPolicy(ctx context.Context, s *session) (bool, error) {
	node, _, err := r.nodeWhere(ctx, s, "", false)
	if err != nil || node == nil {
		return false, err
	}
	warnings, err := r.dryRun(ctx, s, node)
	static := r.policyInfo.Static().Name
	return r.policyDenied(err, static) || r.policyWarned(warnings, static), nil
}

// guardStatic keeps mode admission-policy where the policies are the API
// server's own (static manifests: no one can change or delete them through
// the API): the verdicts written, the policies nodeguard wrote there before
// removed, the cluster proven. The enforcement action is the manifests'.
func (r *Reconciler) guardStatic(ctx context.Context, key string, s *session, t *tracked, st State, action rule.Action, opts admission.PolicyOptions) outcome {
	bindings, rest := r.policyObjects(s)
	// The static policy answers a dry run first: only time says when the
	// bindings written through the API no longer apply.
	if !r.removeObjects(ctx, key, s, &t.removing, bindings[:2], rest[:2]) || !r.removeLegacy(ctx, key, s, t) {
		return outcome{state: st, settling: true, after: r.opts.SettleRetry}
	}
	st.Wired, st.CACurrent = true, true
	t.expecting(fmt.Sprintf("%s/static/%s/%q/%q", ModeAdmissionPolicy, action, opts.ExemptUsers, opts.ExemptGroups))
	o := r.proven(t, st)
	if r.proofDue(t) {
		var found proof
		if o, found = r.provePolicy(ctx, key, s, t, st, action); !found.matched {
			return o
		}
	}
	if _, ok := s.vwc.Get(); ok {
		if _, err := r.delete(ctx, s, admission.WebhookConfigGVR, "", admission.Name); err != nil {
			o.after = min(o.after, retryUnguarded)
		}
	}
	return o
}

// nodeWhere is the first of the first 100 Nodes (of selector) whose
// verdict releases it, or with released false does not (nil: none), and
// the Nodes listed.
func (r *Reconciler) nodeWhere(ctx context.Context, s *session, selector string, released bool) (*corev1.Node, []corev1.Node, error) {
	nodes, err := s.core.Nodes().List(ctx, metav1.ListOptions{Limit: 100, LabelSelector: selector})
	if err != nil {
		return nil, nil, err
	}
	for i := range nodes.Items {
		if (admission.VerdictOf(r.policyInfo, nodes.Items[i].Annotations).UID == string(nodes.Items[i].UID)) == released {
			return &nodes.Items[i], nodes.Items, nil
		}
	}
	return nil, nodes.Items, nil
}

// policyObject is one of the objects the fleet keeps in a workload cluster
// (watch: its watch there; nil for what nodeguard 0.3 left, looked for once
// a connection, and for all without --fleet-admission-policy).
type policyObject struct {
	gvr             schema.GroupVersionResource
	namespace, name string
	watch           *kube.ObjectWatch
}

// policyObjects are the bindings of mode admission-policy, then what goes
// once the API server no longer applies them.
func (r *Reconciler) policyObjects(s *session) (bindings, rest []policyObject) {
	info := r.policyInfo
	legacyBindings, legacyRest := legacyObjects()
	return append([]policyObject{{admission.BindingGVR, "", info.Name, s.binding}, {admission.BindingGVR, "", info.Guard, s.guardBinding}}, legacyBindings...),
		append([]policyObject{{admission.PolicyGVR, "", info.Name, s.policy}, {admission.PolicyGVR, "", info.Guard, s.guard}}, legacyRest...)
}

// legacyObjects are what nodeguard 0.3's mode admission-policy left: its
// binding, then its policy and its ConfigMap of released Nodes.
func legacyObjects() (bindings, rest []policyObject) {
	return []policyObject{{admission.BindingGVR, "", admission.LegacyPolicyName, nil}},
		[]policyObject{{admission.PolicyGVR, "", admission.LegacyPolicyName, nil},
			{admission.ParamsGVR, admission.LegacyParamsNamespace, admission.LegacyParamsName, nil}}
}

// present says whether a policy object nodeguard keeps is there: from its
// watch, or read with nodeguard's identity or, where it may not (no
// --fleet-admission-policy), the kubeconfig's credentials. An object
// without a watch is not looked for once the session found them all gone.
func (s *session) present(ctx context.Context, o policyObject) (bool, error) {
	if o.watch != nil {
		_, ok := o.watch.Get()
		return ok, nil
	}
	if s.leftoversChecked {
		return false, nil
	}
	have, err := s.c.Dynamic.Resource(o.gvr).Namespace(o.namespace).Get(ctx, o.name, metav1.GetOptions{})
	if (apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err)) && s.c.Admin != nil {
		have, err = s.c.Admin.Resource(o.gvr).Namespace(o.namespace).Get(ctx, o.name, metav1.GetOptions{})
	}
	if apierrors.IsNotFound(err) || (err != nil && isNotServed(err)) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return have.GetLabels()[kube.ManagedByLabel] == kube.Owner, nil
}

// anyPresent says whether one of objs is (or may be) there.
func (s *session) anyPresent(ctx context.Context, objs ...[]policyObject) bool {
	for _, list := range objs {
		for _, o := range list {
			if ok, err := s.present(ctx, o); ok || err != nil {
				return true
			}
		}
	}
	return false
}

// policyLeft says whether objects of mode admission-policy are (or may be)
// there; what has no watch is looked for once a connection.
func (r *Reconciler) policyLeft(ctx context.Context, s *session) bool {
	bindings, rest := r.policyObjects(s)
	if s.anyPresent(ctx, bindings, rest) {
		return true
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
// denies a released Node. It says whether nothing is left. The verdicts stay
// on the Nodes: nothing reads them then, and a return to the mode revokes
// what no longer holds before the delete policy is bound again.
func (r *Reconciler) removePolicy(ctx context.Context, key string, s *session, t *tracked) bool {
	if r.opts.Releases != nil {
		r.opts.Releases.Remove(key)
	}
	bindings, rest := r.policyObjects(s)
	if !r.removeObjects(ctx, key, s, &t.removing, bindings, rest, r.policyInfo.Name, admission.LegacyPolicyName) {
		return false
	}
	s.leftoversChecked = true // every object without a watch was among them
	return true
}

// removeLegacy removes what nodeguard 0.3's mode left (once a connection
// finds it gone, it is not looked for again); it says whether nothing is
// left.
func (r *Reconciler) removeLegacy(ctx context.Context, key string, s *session, t *tracked) bool {
	bindings, rest := legacyObjects()
	// Today's delete policy may answer a dry run first: only time says
	// when 0.3's binding no longer applies.
	if !r.removeObjects(ctx, key, s, &t.removingLegacy, bindings, rest) {
		return false
	}
	s.leftoversChecked = true // with the watches, these are all that have none
	return true
}

// removeObjects removes bindings, then, once the API server no longer applies
// them (the policies named answer no dry run; with none named, or no Node to
// try, bindingApplyTime after their delete), rest: a binding still applied
// without its policy or params could deny a released Node. since marks when
// the bindings went. It says whether nothing is left.
func (r *Reconciler) removeObjects(ctx context.Context, key string, s *session, since *time.Time, bindings, rest []policyObject, names ...string) bool {
	for _, o := range bindings {
		ok, err := s.present(ctx, o)
		if err != nil {
			r.opts.Log.Warn("fleet: cannot read an admission policy binding of nodeguard's; trying again", "cluster", key, "binding", o.name, "error", err.Error())
			return false
		}
		if !ok {
			continue
		}
		if _, err := r.delete(ctx, s, o.gvr, "", o.name); err != nil {
			r.opts.Log.Warn("fleet: cannot remove an admission policy binding of nodeguard's; trying again", "cluster", key, "binding", o.name, "error", err.Error())
			return false
		}
		r.opts.Log.Info("fleet: removed an admission policy binding of nodeguard's", "cluster", key, "binding", o.name)
		*since = time.Now()
	}
	if s.anyPresent(ctx, rest) {
		if since.IsZero() {
			*since = time.Now() // unbound before it was seen: wait as if just removed
		}
		if !r.bindingUnapplied(ctx, s, *since, names) {
			return false
		}
		for _, o := range rest {
			if _, err := r.delete(ctx, s, o.gvr, o.namespace, o.name); err != nil {
				r.opts.Log.Warn("fleet: cannot remove an admission policy of nodeguard's; trying again", "cluster", key, "object", o.name, "error", err.Error())
				return false
			}
		}
		r.opts.Log.Info("fleet: removed nodeguard's admission policies", "cluster", key, "names", strings.Join(names, ","),
			"waitedForTheBinding", time.Since(*since).Round(time.Millisecond).String())
	}
	*since = time.Time{}
	return true
}

// bindingUnapplied says whether the API server no longer applies the
// bindings of the policies named, removed at since: a dry-run delete of a
// Node that is not released is not theirs to answer any more.
func (r *Reconciler) bindingUnapplied(ctx context.Context, s *session, since time.Time, names []string) bool {
	waited := time.Since(since)
	if waited >= removalMaxWait || len(names) == 0 {
		return waited >= min(removalMaxWait, bindingApplyTime)
	}
	node, _, err := r.nodeWhere(ctx, s, "", false)
	if err != nil || node == nil {
		return waited >= bindingApplyTime
	}
	warnings, err := r.dryRun(ctx, s, node)
	return !r.policyWarned(warnings, names...) && !r.policyDenied(err, names...)
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
