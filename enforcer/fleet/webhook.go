package fleet

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/nodes"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// guardWebhook keeps mode webhook: the configuration installed where it is
// missing or differs, proven when a proof is due, and what mode
// admission-policy left there removed once the configuration is proven.
func (r *Reconciler) guardWebhook(ctx context.Context, key string, s *session, t *tracked, st State, ca []byte, registrations bool,
	clusterAction string) outcome {
	if !s.synced() {
		return r.unsynced(t, st)
	}
	cfg, err := admission.BuildWebhookConfig(admission.WebhookConfigOptions{URL: r.opts.URL, CABundle: ca, Cluster: key, Webhook: r.opts.Webhook,
		Registrations: registrations})
	if err != nil {
		return unguarded(st, ReasonNotInstalled, err.Error(), 0)
	}
	want, err := admission.WebhookConfigObject(cfg)
	if err != nil {
		return unguarded(st, ReasonNotInstalled, err.Error(), 0)
	}
	have, _ := s.vwc.Get()
	if other := claimedBy(have); other != "" && other != key {
		if m, ok := r.opts.Clusters.Meta(other); ok && !m.Deleting {
			// Two Clusters' kubeconfigs reach one API server: writing would
			// flap between them, and one of them is wrong.
			st.Reason, st.Message = ReasonNotInstalled, fmt.Sprintf("this API server holds nodeguard's configuration for Cluster %s, "+
				"which exists too: two Clusters' kubeconfig Secrets reach the same API server; fix the wrong one", other)
			return outcome{state: st, after: retryUnguarded}
		}
	}
	if !kube.Holds(have, want.Object, "webhooks") {
		if have != nil && have.GetResourceVersion() == s.written && kube.Holds(&unstructured.Unstructured{Object: s.wroteWanted}, want.Object, "webhooks") {
			st.Reason, st.Message = ReasonNotInstalled, "the API server stores nodeguard's configuration otherwise than written "+
				"(a field it defaults?); not writing it again"
			return outcome{state: st, after: retryUnguarded}
		}
		stored, replaced, err := kube.RestoreOwned(ctx, s.c.Dynamic, want, "webhooks")
		if err != nil {
			st.Reason, st.Message = failure(err, ReasonNotInstalled), err.Error()+r.repaired(ctx, key, s, err)
			st.CACurrent = have != nil && trusts(have, ca)
			if !st.CACurrent && have != nil && st.Reason == ReasonNotInstalled {
				st.Reason = ReasonStaleCABundle
			}
			return outcome{state: st, after: retryUnguarded}
		}
		s.written, s.wroteWanted = stored.GetResourceVersion(), want.Object.Object
		t.wrote()
		what := "installed"
		switch {
		case replaced:
			what = "replaced (another manager had added fields)"
		case t.state.Wired:
			what = "restored"
		}
		r.opts.Log.Info("fleet: nodeguard's configuration "+what, "cluster", key)
	}
	// The stored configuration holds want (it did, or the write made it),
	// and want carries ca.
	st.Wired, st.CACurrent = true, true
	t.expecting(ModeWebhook + "/" + clusterAction)
	leftover := r.policyLeft(ctx, s)
	o := r.proven(t, st)
	if r.proofDue(t) {
		var found proof
		o, found = r.proveWebhook(ctx, key, s, t, st)
		switch {
		case found.policyDecides && time.Since(t.changed) < publishWait:
			// The policy still guards: the webhook is proven once it is gone.
			o.settling, o.after = true, r.opts.SettleRetry
		case !found.matched:
			return o
		}
	}
	if leftover && (o.state.Guarded || o.state.Reason == ReasonDryRun || r.proofBlocked(t)) {
		// The webhook judges there: what mode admission-policy left goes,
		// binding first.
		if !r.removePolicy(ctx, key, s, t) {
			o.after = min(o.after, r.opts.SettleRetry)
		}
	}
	return o
}

// proofBlocked says whether a proof of the webhook cannot be made while an
// admission policy denies every Node first (none released): the
// configuration, written at least a settle window ago, is taken as
// applied (a webhook configuration applies within milliseconds).
func (r *Reconciler) proofBlocked(t *tracked) bool {
	return t.policyDecides && !r.settles(t)
}

// proven is the outcome of a cluster whose proof is not due: what its last
// proof found.
func (r *Reconciler) proven(t *tracked, st State) outcome {
	st.Guarded, st.Reason, st.Message, st.Action = t.state.Guarded, t.state.Reason, t.state.Message, t.state.Action
	return outcome{state: st, after: r.next(t, st)}
}

// unsynced is the outcome while a session's watches have not listed yet:
// nothing is known, so nothing is reported within the settle window.
func (r *Reconciler) unsynced(t *tracked, st State) outcome {
	st.Reason, st.Message = ReasonNotInstalled, "reading what nodeguard keeps there"
	return outcome{state: st, settling: r.settles(t), after: r.opts.SettleRetry}
}

// proof is what one dry-run Node delete found.
type proof struct {
	// matched: it found what was written (the route judged, or the policy
	// with the action written).
	matched bool
	// lag: what it found may be the API server's not having applied the
	// last write yet.
	lag bool
	// policyDecides: an admission policy denied the delete before the
	// webhook was asked (mode webhook while one is still there).
	policyDecides bool
}

// settle turns a proof that did not find what it should into an outcome:
// unreported within the settle window when it may be lag.
func (r *Reconciler) settle(t *tracked, st State, p proof) outcome {
	if !p.matched && p.lag && r.settles(t) {
		return outcome{state: st, settling: true, after: r.opts.SettleRetry}
	}
	return outcome{state: st, after: r.next(t, st)}
}

// proveWebhook makes a dry-run delete of one of the cluster's Nodes, as
// nodeguard: the cluster is guarded when the answer carries the warning of
// nodeguard's route for this Cluster, allowed or denied, under an
// enforcement action that denies.
func (r *Reconciler) proveWebhook(ctx context.Context, key string, s *session, t *tracked, st State) (outcome, proof) {
	t.policyDecides = false
	// While a policy of mode admission-policy is still there it decides
	// first: a Node it releases lets the webhook be asked. A Node the
	// webhook is sent: its object selector's.
	node, nodes, err := r.nodeWhere(ctx, s, r.opts.Webhook.ObjectSelector, true)
	if err != nil {
		return unguarded(st, failure(err, ReasonUnreachable), "list Nodes: "+err.Error()+r.repaired(ctx, key, s, err), retryUnguarded), proof{}
	}
	if len(nodes) == 0 {
		return unguarded(st, ReasonNoNodes, "the workload cluster has no Node to prove the guard on yet", retryUnguarded), proof{}
	}
	if node == nil {
		node = &nodes[0]
	}
	warnings, err := r.dryRun(ctx, s, node)
	mark := admission.DryRunWarning(key)
	if slices.Contains(warnings, mark) {
		return r.matched(t, st, admission.DryRunAction(warnings), "the route's enforcement action is dryrun: nodeguard judges every Node delete there and denies none")
	}
	p := proof{lag: true}
	switch {
	case err == nil:
		st.Reason, st.Message = ReasonReviewNotReceived,
			fmt.Sprintf("a dry-run delete of Node %s was admitted without nodeguard's answer: the API server does not send it to nodeguard's route", node.Name)
	case r.policyDenied(err, r.policyInfo.Name, admission.LegacyPolicyName):
		t.policyDecides, p.policyDecides = true, true
		st.Reason, st.Message = ReasonReviewNotReceived, "nodeguard's admission policy of mode "+ModeAdmissionPolicy+" still decides there"
	case isWebhookCallFailure(err) && isCertificateError(err):
		st.Reason, st.Message = ReasonStaleCABundle, "the API server does not trust nodeguard's certificate: "+err.Error()
	case isWebhookCallFailure(err):
		st.Reason, st.Message = ReasonReviewNotReceived, "the API server cannot reach nodeguard: "+err.Error()
	default:
		st.Reason, st.Message = failure(err, ReasonReviewNotReceived), fmt.Sprintf("dry-run delete of Node %s: %v", node.Name, err)
		p.lag = false
	}
	return r.settle(t, st, p), p
}

// matched records a proof that found what was written, under action: the
// cluster guarded, or, under dryrun, reported so (why says how).
func (r *Reconciler) matched(t *tracked, st State, action rule.Action, why string) (outcome, proof) {
	t.lastProof, t.proven = time.Now(), t.expect
	st.LastProof, st.Action = t.lastProof, string(action)
	if action == rule.ActionDryRun {
		st.Reason, st.Message = ReasonDryRun, why
	} else {
		st.Guarded, st.Reason, st.Message = true, "", ""
	}
	return outcome{state: st, after: r.next(t, st)}, proof{matched: true}
}

// dryRun dry-runs the delete of node as nodeguard and returns the answer's
// warnings.
func (r *Reconciler) dryRun(ctx context.Context, s *session, node *corev1.Node) ([]string, error) {
	if s.user == "" {
		s.user = whoAmI(ctx, s.auth)
	}
	var warnings []string
	uid := node.UID
	err := s.core.Nodes().Delete(withWarnings(ctx, &warnings), node.Name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll},
		Preconditions: &metav1.Preconditions{UID: &uid}})
	return warnings, err
}

// registrationsOf is the protection the configuration stored in a cluster
// carries out: deny when it has the registration webhook.
func registrationsOf(s *session) nodes.Protection {
	if have, ok := s.vwc.Get(); ok && hook(have, admission.RegistrationWebhookName) != nil {
		return nodes.ProtectionDeny
	}
	return nodes.ProtectionOff
}

// hook is the webhook name of a stored configuration, nil when it has none.
func hook(have *unstructured.Unstructured, name string) map[string]any {
	hooks, _, _ := unstructured.NestedSlice(have.Object, "webhooks")
	for _, h := range hooks {
		if m, _ := h.(map[string]any); m["name"] == name {
			return m
		}
	}
	return nil
}

// claimedBy is the Cluster a stored configuration routes to, "" when none.
func claimedBy(have *unstructured.Unstructured) string {
	if have == nil {
		return ""
	}
	return have.GetAnnotations()[admission.ClusterAnnotation]
}

// trusts says whether the stored configuration carries the CA bundle ca.
func trusts(have *unstructured.Unstructured, ca []byte) bool {
	var h admissionregistrationv1.ValidatingWebhook
	m := hook(have, admission.WebhookName)
	return m != nil && runtime.DefaultUnstructuredConverter.FromUnstructured(m, &h) == nil && string(h.ClientConfig.CABundle) == string(ca)
}

// policyDenied says whether err is the denial of one of nodeguard's
// admission policies named.
func (r *Reconciler) policyDenied(err error, names ...string) bool {
	return err != nil && slices.ContainsFunc(names, func(name string) bool { return strings.Contains(err.Error(), policyMark(name)) })
}

// policyWarned says whether warnings carry one of nodeguard's admission
// policies named.
func (r *Reconciler) policyWarned(warnings []string, names ...string) bool {
	return slices.ContainsFunc(warnings, func(w string) bool {
		return slices.ContainsFunc(names, func(name string) bool { return strings.Contains(w, policyMark(name)) })
	})
}

// policyMark is how the API server names a policy in its answers.
func policyMark(name string) string {
	return "ValidatingAdmissionPolicy '" + name + "'"
}

// unguarded is the outcome of a cluster not guarded for reason, looked at
// again after (0: when something changes).
func unguarded(st State, reason, message string, after time.Duration) outcome {
	st.Reason, st.Message = reason, message
	return outcome{state: st, after: after}
}
