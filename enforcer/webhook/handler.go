// Package webhook serves nodeguard as a Kubernetes validating admission
// webhook: AdmissionReview v1 in, a decision of the Guard out.
//
// controller-runtime's admission.Webhook answers a malformed request with HTTP
// 200 and an errored AdmissionReview; nodeguard answers with the HTTP status
// that names the fault (405, 415, 413, 400), so this handler is its own, small.
package webhook

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"
	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/nodeguard/nodeguard/enforcer/decision"
	"github.com/nodeguard/nodeguard/enforcer/denialevents"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/linkmodel"
)

// MaxBodyBytes bounds an AdmissionReview. On DELETE it carries the Node
// once (oldObject). A real Node is tens of KiB (kubelet reports at most 50
// images by default); the API server caps its annotations at 256 KiB, and its
// managed fields list their keys once more, so a legitimate Node stays well
// under 1 MiB (TestLargestRealNodeFits). Past the limit the answer is 413 and
// the failurePolicy (Fail) denies, so the limit keeps that headroom; memory
// per review is bounded by decoding only what the rule reads, not by this.
const MaxBodyBytes = 1 << 20

// inFlightBodyBytes bounds the review bytes being decoded and decided at
// once. A real review is a few KiB, so hundreds fit; ~1 MiB forged ones go
// four at a time: what a review costs while it is decoded (a user's groups
// become one string each) stays live until its answer, and with the
// deployment's GOGC=400 the heap grows to five times what is live.
const inFlightBodyBytes = 4 * MaxBodyBytes

// DefaultMaxConcurrentDecisions bounds the decisions evaluating at once: a
// decision is ~0.5 ms of CPU plus fresh reads that wait on the API server, so
// a few per core keep the cores busy while a flood of reviews queues instead
// of multiplying memory and API requests.
const DefaultMaxConcurrentDecisions = 16

// Routes, also the values of the metrics' route label.
const (
	RouteSelf    = "/validate"
	RouteCluster = "/validate/clusters/{namespace}/{name}"
)

// Reasons of nodeguard_rejected_requests_total: why a request got an HTTP
// error instead of an AdmissionReview answer.
const (
	RejectMethod       = "method"
	RejectClientCert   = "client-cert"
	RejectContentType  = "content-type"
	RejectTooLarge     = "too-large"
	RejectRead         = "read"
	RejectMalformed    = "malformed"
	RejectNotReview    = "not-admission-review"
	RejectNoRequest    = "no-request"
	RejectNoUID        = "no-uid"
	RejectBadOldObject = "bad-old-object"
	RejectBusy         = "busy" // large reviews waited past the deadline
)

// Decider judges one admission request with the rule; *guard.Guard is one.
type Decider interface {
	Decide(ctx context.Context, req guard.Request) (decision.Decision, error)
}

// Options configure the handler.
type Options struct {
	Decider Decider
	// Ready reports whether every needed informer has synced (/readyz).
	Ready func() error
	// ClusterExists, when set, is asked on the cluster route: a Cluster the
	// management cluster does not know is a wrong URL, and is denied.
	ClusterExists func(ctx context.Context, namespace, name string) (bool, error)
	// Timeout is each review's deadline; keep it below the webhook's
	// timeoutSeconds (default 4s).
	Timeout time.Duration
	// RequireClientCert rejects reviews over a connection without a verified
	// client certificate (set with --client-ca-file).
	RequireClientCert bool
	// MaxConcurrentDecisions bounds the decisions evaluating at once; the
	// others wait within their deadline (default
	// DefaultMaxConcurrentDecisions).
	MaxConcurrentDecisions int
	Metrics                *Metrics
	Log                    *slog.Logger
	// Model is the link model the Decider follows: a Node is reduced to
	// the fields it declares before anything else reads it. When nil, the
	// Decider's own (a *guard.Guard has one), else the embedded policy's.
	Model *linkmodel.Model
	// LogInterval is the least time between two log lines about rejected
	// requests (default 1s); the lines between are counted, not written.
	LogInterval time.Duration
	// Denied, when set, is told of each denied Node delete that is not a
	// dry run, after its answer is written. It must not block: a
	// denialevents.Recorder's Record only queues.
	Denied func(denialevents.Denial)
}

type handler struct {
	opts  Options
	model *linkmodel.Model
	// slots bounds concurrent decisions; its waiters are served in order.
	slots *semaphore.Weighted
	// bodies bounds the bytes of reviews being decoded and decided.
	bodies *semaphore.Weighted
	// flights lets concurrent reviews with the same input share one
	// decision. It holds a decision only while it is being made: a review
	// arriving after it was answered makes its own.
	flights singleflight.Group
	// rejectLog writes at most one line per LogInterval; rejected counts
	// the rejections since the last line.
	rejectLog rate.Sometimes
	rejected  atomic.Int64
}

// New returns the webhook's review routes: /validate and
// /validate/clusters/NS/NAME. Probes and metrics are served apart (Probes),
// on ports a NetworkPolicy can keep from the API server's callers.
func New(opts Options) http.Handler {
	if opts.Timeout == 0 {
		opts.Timeout = 4 * time.Second
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.MaxConcurrentDecisions <= 0 {
		opts.MaxConcurrentDecisions = DefaultMaxConcurrentDecisions
	}
	if opts.LogInterval <= 0 {
		opts.LogInterval = time.Second
	}
	h := &handler{opts: opts, model: nodeModel(opts), slots: semaphore.NewWeighted(int64(opts.MaxConcurrentDecisions)),
		bodies:    semaphore.NewWeighted(inFlightBodyBytes),
		rejectLog: rate.Sometimes{First: 1, Interval: opts.LogInterval}}
	mux := http.NewServeMux()
	mux.HandleFunc(RouteSelf, func(w http.ResponseWriter, r *http.Request) { h.validate(w, r, RouteSelf, "") })
	mux.HandleFunc(RouteCluster, func(w http.ResponseWriter, r *http.Request) {
		h.validate(w, r, RouteCluster, r.PathValue("namespace")+"/"+r.PathValue("name"))
	})
	return mux
}

// nodeModel is the link model the handler reduces Nodes with; see
// Options.Model.
func nodeModel(opts Options) *linkmodel.Model {
	if opts.Model != nil {
		return opts.Model
	}
	if d, ok := opts.Decider.(interface{ Model() *linkmodel.Model }); ok {
		return d.Model()
	}
	// The embedded policy compiles: its own tests and every build prove it.
	m, err := linkmodel.Embedded(context.Background())
	if err != nil {
		panic(fmt.Sprintf("nodeguard: the embedded link model does not load: %v", err))
	}
	return m
}

// Probes returns /healthz (the process answers) and /readyz (ready reports
// no error: every needed informer has synced).
func Probes(ready func() error) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ready != nil {
			if err := ready(); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	return mux
}

// httpError is a request nodeguard cannot judge: no AdmissionReview answer,
// so the API server applies the webhook's failurePolicy (Fail: denied).
type httpError struct {
	code   int
	reason string // a Reject* constant
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func badRequest(reason, format string, args ...any) *httpError {
	return &httpError{code: http.StatusBadRequest, reason: reason, msg: fmt.Sprintf(format, args...)}
}

func (h *handler) validate(w http.ResponseWriter, r *http.Request, route, cluster string) {
	start := time.Now()
	review, release, herr := h.read(w, r)
	if herr != nil {
		h.reject(w, herr, route, cluster, start)
		return
	}
	defer release()
	req, herr := request(h.model, review.Request, cluster)
	if herr != nil {
		h.reject(w, herr, route, cluster, start)
		return
	}
	d := h.decide(r.Context(), req)
	resp := &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: d.Allowed, Warnings: d.Warnings}
	if !d.Allowed {
		code := int32(http.StatusForbidden)
		if d.Reason == decision.ReasonError || d.Reason == decision.ReasonBusy {
			code = http.StatusInternalServerError
		}
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: metav1.StatusReasonForbidden,
			Message: strings.Join(d.Messages, " ")}
	}
	elapsed := time.Since(start)
	h.opts.Metrics.observe(route, result(d.Allowed), d.Reason, elapsed)
	h.opts.Log.Info("decision", "node", req.Name, "cluster", cluster, "user", req.UserInfo.Username,
		"allowed", d.Allowed, "reason", d.Reason, "blockers", blockerNames(d), "duration", elapsed)
	dryRun, oldObject := review.Request.DryRun != nil && *review.Request.DryRun, review.Request.OldObject.Raw
	review.Response, review.Request = resp, nil
	body, err := json.Marshal(review)
	if err != nil {
		http.Error(w, "nodeguard: encode response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
	// A dry run must have no side effects (the webhook says NoneOnDryRun).
	if !d.Allowed && !dryRun && h.opts.Denied != nil && isNodeDelete(req) {
		h.opts.Denied(denialevents.Denial{Cluster: cluster, Node: req.Name, NodeUID: uidOf(oldObject), User: req.UserInfo.Username,
			Reason: d.Reason, Messages: d.Messages, Blockers: d.Blockers, Unverified: d.Unverified})
	}
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
	if !field(dec, "metadata") || !field(dec, "uid") || dec.Decode(&uid) != nil {
		return ""
	}
	return types.UID(uid)
}

// field enters the JSON object dec is at and reads up to the value of key,
// skipping the others; false when the object has no such key.
func field(dec *json.Decoder, key string) bool {
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

// reject answers a request that cannot be judged with its HTTP error.
func (h *handler) reject(w http.ResponseWriter, herr *httpError, route, cluster string, start time.Time) {
	if herr.code == http.StatusMethodNotAllowed {
		w.Header().Set("Allow", http.MethodPost)
	}
	http.Error(w, "nodeguard: "+herr.msg, herr.code)
	h.opts.Metrics.observe(route, "error", decision.ReasonBadRequest, time.Since(start))
	h.opts.Metrics.rejectedRequest(herr.reason)
	// Anything that reaches the port can send these: a line per request
	// would let it flood the logs, so one line per interval says how many.
	h.rejected.Add(1)
	h.rejectLog.Do(func() {
		h.opts.Log.Warn("bad admission request", "route", route, "cluster", cluster, "status", herr.code,
			"reason", herr.reason, "error", herr.msg, "rejectedSinceLastLine", h.rejected.Swap(0))
	})
}

// read checks the transport and decodes the AdmissionReview; the caller runs
// the returned func once it has answered.
func (h *handler) read(w http.ResponseWriter, r *http.Request) (*admissionv1.AdmissionReview, func(), *httpError) {
	if r.Method != http.MethodPost {
		return nil, nil, &httpError{http.StatusMethodNotAllowed, RejectMethod, fmt.Sprintf("method %s not allowed: send the AdmissionReview with POST", r.Method)}
	}
	if h.opts.RequireClientCert && (r.TLS == nil || len(r.TLS.VerifiedChains) == 0) {
		return nil, nil, &httpError{http.StatusUnauthorized, RejectClientCert, "a client certificate signed by --client-ca-file is required"}
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return nil, nil, &httpError{http.StatusUnsupportedMediaType, RejectContentType, fmt.Sprintf("content type %q not supported: want application/json", r.Header.Get("Content-Type"))}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, nil, &httpError{http.StatusRequestEntityTooLarge, RejectTooLarge, fmt.Sprintf("body over %d bytes", MaxBodyBytes)}
		}
		return nil, nil, badRequest(RejectRead, "read body: %v", err)
	}
	// Held until the answer is written: the caller releases it.
	ctx, cancel := context.WithTimeout(r.Context(), h.opts.Timeout)
	defer cancel()
	if err := h.bodies.Acquire(ctx, int64(len(body))); err != nil {
		return nil, nil, &httpError{http.StatusServiceUnavailable, RejectBusy, "too many large reviews at once; retry"}
	}
	n := int64(len(body))
	done := func() { h.bodies.Release(n) }
	ok := false
	defer func() {
		if !ok {
			done()
		}
	}()
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil {
		return nil, nil, badRequest(RejectMalformed, "malformed AdmissionReview JSON: %v", err)
	}
	if review.APIVersion != "admission.k8s.io/v1" || review.Kind != "AdmissionReview" {
		return nil, nil, badRequest(RejectNotReview, "want apiVersion admission.k8s.io/v1, kind AdmissionReview; got %q, %q", review.APIVersion, review.Kind)
	}
	if review.Request == nil {
		return nil, nil, badRequest(RejectNoRequest, "AdmissionReview has no request")
	}
	if review.Request.UID == "" {
		return nil, nil, badRequest(RejectNoUID, "AdmissionReview request has no uid")
	}
	ok = true
	return &review, done, nil
}

// request converts the AdmissionRequest, once, into what the rule reads;
// the rule, not this, decides which requests it judges. The object being
// deleted (oldObject: the API server sends the Node there on DELETE) is
// decoded into only what the rule reads; without one, Node stays nil and
// the rule denies a Node delete it cannot judge.
func request(model *linkmodel.Model, req *admissionv1.AdmissionRequest, cluster string) (guard.Request, *httpError) {
	out := guard.Request{Operation: string(req.Operation), Kind: req.Kind, Name: req.Name, Cluster: cluster, UserInfo: req.UserInfo}
	if len(req.OldObject.Raw) == 0 {
		return out, nil
	}
	obj, err := model.NodeFromJSON(req.OldObject.Raw)
	if err != nil {
		return guard.Request{}, badRequest(RejectBadOldObject, "oldObject of %s %q does not decode: %v", req.Kind.Kind, req.Name, err)
	}
	// The API server sends oldObject as a named object of the request's
	// kind and version; a review where they differ was forged, and the rule
	// would read one kind of object as another.
	apiVersion := schema.GroupVersion{Group: req.Kind.Group, Version: req.Kind.Version}.String()
	if obj.GetAPIVersion() != apiVersion || obj.GetKind() != req.Kind.Kind || obj.GetName() == "" {
		return guard.Request{}, badRequest(RejectBadOldObject, "oldObject is %s %s %q, want a named %s %s (the request's kind)",
			obj.GetAPIVersion(), obj.GetKind(), obj.GetName(), apiVersion, req.Kind.Kind)
	}
	out.Node = obj
	if out.Name == "" {
		out.Name = obj.GetName()
	}
	return out, nil
}

// decide answers within the review's deadline. Concurrent reviews with the
// same input (route, request and Node as the rule reads them, user and
// groups) share one decision; at most MaxConcurrentDecisions are made at
// once, the others queue for a slot until their deadline.
func (h *handler) decide(ctx context.Context, req guard.Request) decision.Decision {
	ctx, cancel := context.WithTimeout(ctx, h.opts.Timeout)
	defer cancel()
	key, err := flightKey(req)
	if err != nil {
		return decision.Deny(decision.ReasonError, fmt.Sprintf("Node %q cannot be deleted: nodeguard could not decide (%v).", req.Name, err))
	}
	// Do, not DoChan: the first review's goroutine (a connection's, its stack
	// already grown) evaluates the rule; DoChan would start a goroutine per
	// decision and regrow a stack to OPA's depth each time (19% of the CPU
	// under load). Waiting needs no select: the shared decision ends before
	// any waiter's deadline (below).
	v, _, _ := h.flights.Do(key, func() (any, error) {
		// The first review's deadline bounds the shared decision: the
		// reviews joining later have later deadlines, so every one of them
		// is still waiting when it ends. It ends a little before, so the
		// answer says why rather than racing the deadline. The first
		// review's own cancellation (its caller gave up) must not fail the
		// others.
		deadline, _ := ctx.Deadline()
		fctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline.Add(-h.opts.Timeout/16))
		defer cancel()
		if err := h.slots.Acquire(fctx, 1); err != nil {
			return decision.Deny(decision.ReasonBusy, fmt.Sprintf("Node %q cannot be deleted right now: nodeguard is answering as many reviews as it may at once "+
				"(--max-concurrent-decisions) and none finished in time; retry shortly.", req.Name)), nil
		}
		defer h.slots.Release(1)
		return h.decideNow(fctx, req), nil
	})
	return v.(decision.Decision)
}

// flightKey is everything a decision reads from the review, hashed: the
// reduced Node holds all the rule reads of it, so reviews of the same Node
// that differ elsewhere (status, labels, uid) still share. Hashing keeps the
// key small whatever the review carries (a forged one may list 100,000
// groups); each field is length-prefixed, so no two inputs write the same
// bytes.
func flightKey(req guard.Request) (string, error) {
	var nodeJSON []byte
	if req.Node != nil {
		var err error
		if nodeJSON, err = json.Marshal(req.Node.Object); err != nil {
			return "", fmt.Errorf("key the review: %w", err)
		}
	}
	h := sha256.New()
	field := func(s string) {
		_ = binary.Write(h, binary.BigEndian, uint64(len(s)))
		_, _ = io.WriteString(h, s)
	}
	field(req.Cluster)
	field(req.Operation)
	field(req.Kind.Group)
	field(req.Kind.Version)
	field(req.Kind.Kind)
	field(req.Name)
	// null (no Node) is no Node's JSON, so it cannot collide with one.
	if nodeJSON == nil {
		nodeJSON = []byte("null")
	}
	field(string(nodeJSON))
	field(req.UserInfo.Username)
	_ = binary.Write(h, binary.BigEndian, uint64(len(req.UserInfo.Groups)))
	for _, g := range req.UserInfo.Groups {
		field(g)
	}
	return string(h.Sum(nil)), nil
}

func (h *handler) decideNow(ctx context.Context, req guard.Request) decision.Decision {
	if req.Cluster != "" && h.opts.ClusterExists != nil {
		ns, name, err := cache.SplitMetaNamespaceKey(req.Cluster)
		if err != nil {
			return decision.Deny(decision.ReasonError, fmt.Sprintf("Node %q cannot be deleted: nodeguard could not decide (%v).", req.Name, err))
		}
		ok, err := h.opts.ClusterExists(ctx, ns, name)
		if err != nil {
			return decision.Deny(decision.ReasonError, fmt.Sprintf("Node %q cannot be deleted right now: nodeguard could not read Cluster %s (%v); retry shortly.", req.Name, req.Cluster, err))
		}
		if !ok {
			return decision.Deny(decision.ReasonError, fmt.Sprintf("Node %q cannot be deleted: this webhook's URL names Cluster %s, which the management cluster does not have; fix the ValidatingWebhookConfiguration (nodeguard webhook-config --cluster).", req.Name, req.Cluster))
		}
	}
	d, err := h.opts.Decider.Decide(ctx, req)
	if err != nil {
		return decision.Deny(decision.ReasonError, fmt.Sprintf("Node %q cannot be deleted: nodeguard could not decide (%v).", req.Name, err))
	}
	return d
}

func result(allowed bool) string {
	if allowed {
		return "allowed"
	}
	return "denied"
}

func blockerNames(d decision.Decision) []string {
	out := make([]string, 0, len(d.Blockers))
	for _, b := range d.Blockers {
		out = append(out, fmt.Sprintf("%s %s/%s", b.Kind, b.Namespace, b.Name))
	}
	return out
}
