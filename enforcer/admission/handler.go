// This file serves nodeguard as a Kubernetes validating admission
// webhook: AdmissionReview v1 in, a decision of the Guard out.
//
// controller-runtime's admission.Webhook answers a malformed request with HTTP
// 200 and an errored AdmissionReview; nodeguard answers with the HTTP status
// that names the fault (405, 415, 413, 400), so this handler is its own, small.

package admission

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodeguard/nodeguard/enforcer/events"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// Routes, also the values of the metrics' route label.
const (
	WebhookRouteSelf    = "/validate"
	WebhookRouteCluster = "/validate/clusters/{namespace}/{name}"
)

// Reasons of nodeguard_rejected_requests_total that are the review routes'
// own; intake's Reject* constants name the others.
const (
	RejectMalformed    = "malformed"
	RejectNotReview    = "not-admission-review"
	RejectNoRequest    = "no-request"
	RejectNoUID        = "no-uid"
	RejectBadOldObject = "bad-old-object"
	RejectBadObject    = "bad-object" // the registration routes'
)

// Decider judges one admission request with the rule; *guard.Guard is one.
// The handler reduces a review to what the rule reads before anything else:
// the Node to the fields of the Decider's link model, the user's groups to
// those KeepGroup keeps.
type Decider interface {
	Decide(ctx context.Context, req guard.Request) (rule.Decision, error)
	KeepGroup(group string) bool
	Model() *rule.Model
	// Policy is the policy its decisions are made with (their decision
	// log's bundle revision).
	Policy() rule.Policy
}

// WebhookOptions configure the handler.
type WebhookOptions struct {
	Decider Decider
	// DecisionLog, when set, gets every answer (OPA's decision logs).
	DecisionLog *rule.DecisionLog
	// Clusters, when set, is asked on the cluster route whether the
	// management cluster has the Cluster (one it does not know is a wrong
	// URL, and is denied), and for the enforcement action it sets.
	Clusters Clusters
	// Action is what a denial becomes on every route a Cluster does not
	// override (default rule.ActionDeny): warn and dryrun admit the
	// delete, warn with the denial as a warning. nodeguard's own identity's
	// dry-run-only rule is always enforced. It is asked on each review: the
	// Constraint's spec.enforcementAction may change while serving.
	Action func() rule.Action
	// ClientCAs, when set, is the CA whose client certificates the review
	// routes require (--client-ca-file).
	ClientCAs *x509.CertPool
	// ClusterIdentities, when set, is the CA of each workload API server's
	// own client certificate (fleet.Issuer): a cluster route then requires
	// one issued for its Cluster (common name ClusterClientName), whatever
	// ClusterClientCAs says, so no cluster's credentials speak for another.
	ClusterIdentities *x509.CertPool
	// ClusterClientCAs, when set, is the CA whose client certificates the
	// cluster routes require (--cluster-routes-client-ca-file) where
	// ClientCAs is not set: the routes exposed to workload API servers
	// authenticated, /validate left to the cluster's own API server, which
	// on a managed control plane cannot present one.
	ClusterClientCAs *x509.CertPool
	// Intake bounds the work of the review routes, shared with the other
	// routes of the port (and counts what it rejects); when nil, one of
	// the defaults, logging to Log. Its Timeout is each review's deadline:
	// keep it below the webhook's timeoutSeconds.
	Intake  *Intake
	Metrics *WebhookMetrics
	Log     *slog.Logger
	// Mux, when set, is where the routes are added (and what is returned):
	// the port's one mux, shared with the external data routes.
	Mux *http.ServeMux
	// SelfCluster, "namespace/name", scopes /validate to that CAPI Cluster's
	// Machines, as its cluster route is: for a management cluster that is
	// itself a CAPI Cluster, whose Node names other clusters reuse.
	SelfCluster string
	// DryRunOnlyUser, when set, may only dry-run Node deletes on a cluster
	// route: nodeguard's own identity in workload clusters while the
	// reaper is off there. RBAC cannot grant a dry-run delete without the
	// delete (the fleet's proofs are dry runs), so the webhook holds it.
	DryRunOnlyUser string
	// Denied, when set, is told of each denied Node delete that is not a
	// dry run, after its answer is written. It must not block: a
	// events.Recorder's Record only queues. A cluster route's denial
	// is told only when ClientCAs authenticated the caller: those routes are
	// the ones exposed beyond the cluster, where anyone reaching the port
	// could otherwise have Events written naming any Node and any user.
	Denied func(events.Denial)
	// Register, when set, judges what the registration routes are sent (a
	// Node CREATE or UPDATE): the ghost criteria, under the cluster's ghost
	// protection. An error allows (registrations fail open).
	Register func(ctx context.Context, r Registration) (RegistrationAnswer, error)
}

// Clusters reads the CAPI Clusters a cluster route names.
type Clusters interface {
	// Cluster says whether the management cluster has Cluster key
	// ("namespace/name", from the route), and the enforcement action its
	// annotation sets ("": none, the default holds).
	Cluster(ctx context.Context, key string) (exists bool, action rule.Action, err error)
}

// ClustersFunc is a func that is Clusters.
type ClustersFunc func(ctx context.Context, key string) (bool, rule.Action, error)

// Cluster calls f.
func (f ClustersFunc) Cluster(ctx context.Context, key string) (bool, rule.Action, error) {
	return f(ctx, key)
}

type handler struct {
	opts  WebhookOptions
	model *rule.Model
}

// NewWebhook returns the webhook's review routes: /validate and
// /validate/clusters/NS/NAME, and the registration routes /register and
// /register/clusters/NS/NAME. Probes and metrics are served apart (package
// probes), on ports a NetworkPolicy can keep from the API server's callers.
func NewWebhook(opts WebhookOptions) http.Handler {
	opts.Log = cmp.Or(opts.Log, slog.New(slog.DiscardHandler))
	if opts.Intake == nil {
		opts.Intake = NewIntake(IntakeOptions{Log: opts.Log})
	}
	h := &handler{opts: opts, model: opts.Decider.Model()}
	mux := opts.Mux
	if mux == nil {
		mux = http.NewServeMux()
	}
	mux.HandleFunc(WebhookRouteSelf, func(w http.ResponseWriter, r *http.Request) {
		h.validate(w, r, WebhookRouteSelf, opts.SelfCluster, DryRunWarning(""))
	})
	mux.HandleFunc(WebhookRouteCluster, func(w http.ResponseWriter, r *http.Request) {
		cluster := r.PathValue("namespace") + "/" + r.PathValue("name")
		h.validate(w, r, WebhookRouteCluster, cluster, DryRunWarning(cluster))
	})
	mux.HandleFunc(RouteRegister, func(w http.ResponseWriter, r *http.Request) {
		h.register(w, r, RouteRegister, opts.SelfCluster)
	})
	mux.HandleFunc(RouteRegisterCluster, func(w http.ResponseWriter, r *http.Request) {
		h.register(w, r, RouteRegisterCluster, r.PathValue("namespace")+"/"+r.PathValue("name"))
	})
	return mux
}

// validate answers one review on route, judged for cluster's Machines ("":
// all of them); a dry run's answer carries proof.
func (h *handler) validate(w http.ResponseWriter, r *http.Request, route, cluster, proof string) {
	start := time.Now()
	review, release, herr := h.read(w, r, route, cluster, false)
	if herr != nil {
		h.reject(w, herr, route, cluster, start)
		return
	}
	defer release()
	req, herr := request(&review.Request.admissionRequest, cluster)
	if herr != nil {
		h.reject(w, herr, route, cluster, start)
		return
	}
	dryRun := review.Request.DryRun != nil && *review.Request.DryRun
	var v verdict
	if route == WebhookRouteCluster && !dryRun && h.opts.DryRunOnlyUser != "" && req.UserInfo.Username == h.opts.DryRunOnlyUser && isNodeDelete(req) {
		v = verdict{Decision: rule.Denial(rule.ReasonDryRunOnly, fmt.Sprintf("Node %q cannot be deleted by %s: nodeguard's own identity "+
			"deletes workload Nodes only when its orphan reaper works there (--reap-orphan-nodes with --reap-workload-clusters); "+
			"it may dry-run deletes, which prove the cluster guarded.", req.Name, req.UserInfo.Username)), action: rule.ActionDeny}
	} else {
		v = h.decide(r.Context(), req, review.Request.UserInfo.Groups.digest())
	}
	d := v.Decision
	warnings := d.Warnings
	// What the answer is: the rule's, or, under warn or dryrun, a denial
	// admitted (warn says what would have been denied).
	allowed := d.Allowed || !v.action.Enforced()
	if !d.Allowed && v.action == rule.ActionWarn {
		warnings = append(slices.Clip(warnings), fmt.Sprintf("nodeguard (enforcement action warn, %s): this delete would be denied: %s",
			d.Reason, strings.Join(d.Messages, " ")))
	}
	if dryRun {
		// The fleet's proof that this cluster's reviews arrive, on any
		// replica; on a dry run a person sees which route judged too, and
		// under which action when it does not deny.
		warnings = append(slices.Clip(warnings), proof)
		if v.action != rule.ActionDeny {
			warnings = append(warnings, actionWarningPrefix+string(v.action))
		}
	}
	resp := &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: allowed, Warnings: warnings}
	if !allowed {
		code := int32(http.StatusForbidden)
		if d.Reason == rule.ReasonError || d.Reason == rule.ReasonBusy {
			code = http.StatusInternalServerError
		}
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: metav1.StatusReasonForbidden,
			Message: strings.Join(d.Messages, " ")}
	}
	id := h.logDecision(review, req, v, allowed, dryRun, route, cluster, start)
	if id != "" {
		resp.AuditAnnotations = map[string]string{DecisionIDAuditAnnotation: id}
	}
	elapsed := time.Since(start)
	h.opts.Metrics.observe(route, cluster, result(allowed), d.Reason, v.action, elapsed)
	h.opts.Log.Info("decision", "node", req.Name, "cluster", cluster, "user", req.UserInfo.Username,
		"allowed", allowed, "reason", d.Reason, "enforcementAction", v.action, "blockers", blockerNames(d), "duration", elapsed)
	answer(w, review, resp)
	// A dry run must have no side effects (the webhook says NoneOnDryRun).
	authenticated := h.clientCAs(route) != nil // intake refused any other caller
	// dryrun is silent: logged and counted, no Event.
	if !d.Allowed && v.action != rule.ActionDryRun && !dryRun && h.opts.Denied != nil && isNodeDelete(req) && (route == WebhookRouteSelf || authenticated) {
		where := cluster // the workload cluster the Node lives in; /validate's is this one
		if route == WebhookRouteSelf {
			where = ""
		}
		h.opts.Denied(events.Denial{Cluster: where, Node: req.Name, NodeUID: uidOf(review.Request.OldObject.bytes()), User: req.UserInfo.Username,
			Reason: d.Reason, Messages: d.Messages, Blockers: d.Blockers, Unverified: d.Unverified, Admitted: allowed, DecisionID: id})
	}
}

// DecisionIDAuditAnnotation is the audit annotation of an answer holding
// its decision_id; the API server's audit log records it prefixed with the
// webhook's name (node-delete.nodeguard.io/decision_id), so an audit event
// and its decision log event join.
const DecisionIDAuditAnnotation = "decision_id"

// logDecision hands the verdict to the decision log (none: "") and returns
// its decision_id: the rule's decision and what it read, the answer given,
// the route and the enforcement action.
func (h *handler) logDecision(review *admissionReview, req guard.Request, v verdict, allowed, dryRun bool, route, cluster string, start time.Time) string {
	if !h.opts.DecisionLog.Enabled() {
		return ""
	}
	input := v.Input
	if input == nil { // not the rule's (e.g. dry-run-only, a Cluster not read)
		input = map[string]any{"review": req.Review()}
	}
	id := rule.NewDecisionID()
	h.opts.DecisionLog.Log(rule.DecisionEvent{ID: id, Path: rule.DecisionEntry.Path(), Input: input, Result: v.Decision,
		Policy: h.opts.Decider.Policy(), Time: start, Custom: map[string]any{"route": route, "cluster": cluster, "uid": string(review.Request.UID),
			"allowed": allowed, "enforcementAction": string(v.action), "dryRun": dryRun}})
	return id
}

// DryRunWarning is the warning every dry-run review's answer carries: it
// names the route (and so the cluster) that judged it.
func DryRunWarning(cluster string) string {
	route := WebhookRouteSelf
	if cluster != "" {
		route += "/clusters/" + cluster
	}
	return "nodeguard: dry run judged on route " + route
}

// actionWarningPrefix starts the warning of a dry run judged under an
// enforcement action that does not deny.
const actionWarningPrefix = "nodeguard: enforcement action on this route: "

// DryRunAction is the enforcement action a dry run's warnings say the route
// answered under (deny when they say none).
func DryRunAction(warnings []string) rule.Action {
	for _, w := range warnings {
		if a, ok := strings.CutPrefix(w, actionWarningPrefix); ok {
			if action, err := rule.ParseAction(a); err == nil {
				return action
			}
		}
	}
	return rule.ActionDeny
}

// isNodeDelete says whether a request deletes a core Node: the only kind a
// denial Event is recorded on, whatever else the webhook is sent.
func isNodeDelete(req guard.Request) bool {
	return req.Operation == string(admissionv1.Delete) && req.Kind.Group == "" && req.Kind.Kind == "Node"
}

// uidOf reads the UID of the object being deleted, which `kubectl describe
// node` finds Events by; the reduced Node the rule reads does not keep it.
// Only denials pay for it, and little: the API server writes apiVersion,
// kind, then metadata with name and uid first, and the scan stops at uid.
func uidOf(raw []byte) types.UID {
	dec := json.NewDecoder(bytes.NewReader(raw))
	var uid string
	if !jsonField(dec, "metadata") || !jsonField(dec, "uid") || dec.Decode(&uid) != nil {
		return ""
	}
	return types.UID(uid)
}

// jsonField enters the JSON object dec is at and reads up to the value of
// key, skipping the others; false when the object has no such key.
func jsonField(dec *json.Decoder, key string) bool {
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return false
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return false
		}
		if k == key {
			return true
		}
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return false
		}
	}
	return false
}

// reject answers a request that cannot be judged with its HTTP error: the
// API server then applies the webhook's failurePolicy (Fail: denied).
func (h *handler) reject(w http.ResponseWriter, herr *IntakeError, route, cluster string, start time.Time) {
	h.opts.Intake.Reject(w, herr, "admission request", route, cluster)
	h.opts.Metrics.observe(route, cluster, "error", rule.ReasonBadRequest, h.action(""), time.Since(start))
}

// clientCAs is the CA whose client certificates route requires, or nil.
func (h *handler) clientCAs(route string) *x509.CertPool {
	cluster := route == WebhookRouteCluster || route == RouteRegisterCluster
	switch {
	case cluster && h.opts.ClusterIdentities != nil:
		return h.opts.ClusterIdentities
	case cluster && h.opts.ClientCAs == nil:
		return h.opts.ClusterClientCAs
	}
	return h.opts.ClientCAs
}

// RejectWrongCluster is the rejection of a client certificate issued for
// another Cluster than the route's.
const RejectWrongCluster = "wrong-cluster-certificate"

// ClusterClientName is the common name of the client certificate issued for
// the workload API server of Cluster key ("namespace/name").
func ClusterClientName(key string) string { return "nodeguard-workload-cluster:" + key }

// identified refuses, on a cluster route with per-Cluster identities, a
// client whose certificate (verified by the intake) was issued for another
// Cluster.
func (h *handler) identified(r *http.Request, route, cluster string) *IntakeError {
	if h.opts.ClusterIdentities == nil || (route != WebhookRouteCluster && route != RouteRegisterCluster) {
		return nil
	}
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 && r.TLS.PeerCertificates[0].Subject.CommonName == ClusterClientName(cluster) {
		return nil
	}
	return &IntakeError{Code: http.StatusUnauthorized, Reason: RejectWrongCluster,
		Msg: "the client certificate was not issued for Cluster " + cluster + ": this route answers only that Cluster's API server"}
}

// read checks the transport and decodes the AdmissionReview (its object
// too when asked: the registration routes); the caller runs the returned
// func once it has answered.
func (h *handler) read(w http.ResponseWriter, r *http.Request, route, cluster string, object bool) (*admissionReview, func(), *IntakeError) {
	if herr := h.identified(r, route, cluster); herr != nil {
		return nil, nil, herr
	}
	body, release, herr := h.opts.Intake.Read(w, r, h.clientCAs(route))
	if herr != nil {
		return nil, nil, herr
	}
	review, herr := h.decode(body, object)
	if herr != nil {
		release()
		return nil, nil, herr
	}
	return review, release, nil
}

func (h *handler) decode(body []byte, object bool) (*admissionReview, *IntakeError) {
	review, err := decodeReview(body, h.model, h.opts.Decider.KeepGroup, object)
	if err != nil {
		var bad *nodeError
		switch {
		case errors.As(err, &bad) && bad.field == "object":
			return nil, BadRequest(RejectBadObject, "object does not decode: %v", err)
		case errors.As(err, &bad):
			return nil, BadRequest(RejectBadOldObject, "oldObject does not decode: %v", err)
		}
		return nil, BadRequest(RejectMalformed, "malformed AdmissionReview JSON: %v", err)
	}
	if review.APIVersion != "admission.k8s.io/v1" || review.Kind != "AdmissionReview" {
		return nil, BadRequest(RejectNotReview, "want apiVersion admission.k8s.io/v1, kind AdmissionReview; got %q, %q", review.APIVersion, review.Kind)
	}
	if !review.Request.present {
		return nil, BadRequest(RejectNoRequest, "AdmissionReview has no request")
	}
	if review.Request.UID == "" {
		return nil, BadRequest(RejectNoUID, "AdmissionReview request has no uid")
	}
	return review, nil
}

// answer writes resp as the AdmissionReview answering review.
func answer(w http.ResponseWriter, review *admissionReview, resp *admissionv1.AdmissionResponse) {
	body, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: review.APIVersion, Kind: review.Kind}, Response: resp})
	if err != nil {
		http.Error(w, "nodeguard: encode response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

// request converts the AdmissionRequest, decoded into what the rule reads,
// into the Decider's request; the rule, not this, decides which requests it
// judges. Without an oldObject (the API server sends the Node there on
// DELETE), Node stays nil and the rule denies a Node delete it cannot judge.
func request(req *admissionRequest, cluster string) (guard.Request, *IntakeError) {
	out := guard.Request{Operation: req.Operation, Kind: req.Kind, Name: req.Name, Cluster: cluster}
	out.UserInfo.Username = req.UserInfo.Username
	if req.UserInfo.Groups != nil {
		out.UserInfo.Groups = req.UserInfo.Groups.kept
	}
	if req.OldObject == nil || req.OldObject.obj == nil {
		return out, nil
	}
	obj := req.OldObject.obj
	// The API server sends oldObject as a named object of the request's
	// kind and version; a review where they differ was forged, and the rule
	// would read one kind of object as another.
	apiVersion := schema.GroupVersion{Group: req.Kind.Group, Version: req.Kind.Version}.String()
	if obj.GetAPIVersion() != apiVersion || obj.GetKind() != req.Kind.Kind || obj.GetName() == "" {
		return guard.Request{}, BadRequest(RejectBadOldObject, "oldObject is %s %s %q, want a named %s %s (the request's kind)",
			obj.GetAPIVersion(), obj.GetKind(), obj.GetName(), apiVersion, req.Kind.Kind)
	}
	out.Node = obj
	out.Name = cmp.Or(out.Name, obj.GetName())
	return out, nil
}

// decide answers within the review's deadline. Concurrent reviews with the
// same input (route, request and Node as the rule reads them, user and
// groups) share one decision; at most the Intake's MaxConcurrent are made at
// once, the others queue for a slot until their deadline.
func (h *handler) decide(ctx context.Context, req guard.Request, groups []byte) verdict {
	key, err := flightKey(req, groups)
	if err != nil {
		return h.fallback(rule.Denial(rule.ReasonError, fmt.Sprintf("Node %q cannot be deleted: nodeguard could not decide (%v).", req.Name, err)))
	}
	busy := func() verdict {
		return h.fallback(rule.Denial(rule.ReasonBusy, fmt.Sprintf("Node %q cannot be deleted right now: nodeguard is answering as many reviews as it may at once "+
			"(--max-concurrent-decisions) and none finished in time; retry shortly.", req.Name)))
	}
	return Do(ctx, h.opts.Intake, key, busy, func(ctx context.Context) verdict { return h.decideNow(ctx, req) })
}

// verdict is a decision and the enforcement action it is answered under.
type verdict struct {
	rule.Decision
	action rule.Action
}

// fallback answers d under the default action: no Cluster was read.
func (h *handler) fallback(d rule.Decision) verdict {
	return verdict{Decision: d, action: h.action("")}
}

// action is a Cluster's action, else the default.
func (h *handler) action(cluster rule.Action) rule.Action {
	if cluster == "" && h.opts.Action != nil {
		cluster = h.opts.Action()
	}
	return cmp.Or(cluster, rule.ActionDeny)
}

// flightKey is everything a decision reads from the review, hashed: the
// reduced Node holds all the rule reads of it, so reviews of the same Node
// that differ elsewhere (status, labels, uid) still share; groups is the
// digest of all the user's groups (decodeReview), so users differing only in
// groups the rule does not read do not. Hashing keeps the key small whatever
// the review carries; each field is length-prefixed, so no two inputs write
// the same bytes.
func flightKey(req guard.Request, groups []byte) (string, error) {
	// No Node marshals as null, which is no Node's JSON: it cannot collide
	// with one.
	var obj map[string]any
	if req.Node != nil {
		obj = req.Node.Object
	}
	nodeJSON, err := json.Marshal(obj)
	if err != nil {
		return "", fmt.Errorf("key the review: %w", err)
	}
	h := sha256.New()
	field(h, req.Cluster)
	field(h, req.Operation)
	field(h, req.Kind.Group)
	field(h, req.Kind.Version)
	field(h, req.Kind.Kind)
	field(h, req.Name)
	field(h, string(nodeJSON))
	field(h, req.UserInfo.Username)
	field(h, string(groups))
	return string(h.Sum(nil)), nil
}

func (h *handler) decideNow(ctx context.Context, req guard.Request) verdict {
	var clusterAction rule.Action
	if req.Cluster != "" && h.opts.Clusters != nil {
		ok, a, err := h.opts.Clusters.Cluster(ctx, req.Cluster)
		if err != nil {
			return h.fallback(rule.Denial(rule.ReasonError, fmt.Sprintf("Node %q cannot be deleted right now: nodeguard could not read Cluster %s (%v); retry shortly.", req.Name, req.Cluster, err)))
		}
		if !ok {
			return h.fallback(rule.Denial(rule.ReasonError, fmt.Sprintf("Node %q cannot be deleted: this webhook's URL names Cluster %s, which the management cluster does not have; fix the ValidatingWebhookConfiguration (nodeguard webhook-config --cluster).", req.Name, req.Cluster)))
		}
		clusterAction = a
	}
	action := h.action(clusterAction)
	d, err := h.opts.Decider.Decide(ctx, req)
	if err != nil {
		d = rule.Denial(rule.ReasonError, fmt.Sprintf("Node %q cannot be deleted: nodeguard could not decide (%v).", req.Name, err))
	}
	return verdict{Decision: d, action: action}
}

func result(allowed bool) string {
	if allowed {
		return "allowed"
	}
	return "denied"
}

func blockerNames(d rule.Decision) []string {
	out := make([]string, 0, len(d.Blockers))
	for _, b := range d.Blockers {
		out = append(out, fmt.Sprintf("%s %s/%s", b.Kind, b.Namespace, b.Name))
	}
	return out
}
