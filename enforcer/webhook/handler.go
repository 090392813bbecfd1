// Package webhook serves nodeguard as a Kubernetes validating admission
// webhook: AdmissionReview v1 in, a decision of the Guard out.
//
// controller-runtime's admission.Webhook answers a malformed request with HTTP
// 200 and an errored AdmissionReview; nodeguard answers with the HTTP status
// that names the fault (405, 415, 413, 400), so this handler is its own, small.
package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/nodeguard/nodeguard/enforcer/decision"
	"github.com/nodeguard/nodeguard/enforcer/guard"
)

// MaxBodyBytes bounds an AdmissionReview; a Node is far smaller.
const MaxBodyBytes = 1 << 20

// Routes, also the values of the metrics' route label.
const (
	RouteSelf    = "/validate"
	RouteCluster = "/validate/clusters/{namespace}/{name}"
)

// Reasons of answers that are not the rule's decisions.
const (
	ReasonNotJudged  = "not-judged"  // not a Node DELETE: allowed untouched
	ReasonBadRequest = "bad-request" // answered with an HTTP error
	ReasonError      = "error"       // no decision could be made: denied
)

// Decider judges one Node delete; *guard.Guard is one.
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
	Metrics           *Metrics
	MetricsHandler    http.Handler
	Log               *slog.Logger
}

type handler struct{ opts Options }

// New returns the webhook's routes: /validate, /validate/clusters/NS/NAME,
// /healthz, /readyz and /metrics.
func New(opts Options) http.Handler {
	if opts.Timeout == 0 {
		opts.Timeout = 4 * time.Second
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	h := &handler{opts: opts}
	mux := http.NewServeMux()
	mux.HandleFunc(RouteSelf, func(w http.ResponseWriter, r *http.Request) { h.validate(w, r, RouteSelf, "") })
	mux.HandleFunc(RouteCluster, func(w http.ResponseWriter, r *http.Request) {
		h.validate(w, r, RouteCluster, r.PathValue("namespace")+"/"+r.PathValue("name"))
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", h.readyz)
	if opts.MetricsHandler != nil {
		mux.Handle("GET /metrics", opts.MetricsHandler)
	}
	return mux
}

func (h *handler) readyz(w http.ResponseWriter, _ *http.Request) {
	if h.opts.Ready != nil {
		if err := h.opts.Ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
	}
	_, _ = io.WriteString(w, "ok\n")
}

// httpError is a request nodeguard cannot judge: no AdmissionReview answer,
// so the API server applies the webhook's failurePolicy (Fail: denied).
type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

func badRequest(format string, args ...any) *httpError {
	return &httpError{code: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

func (h *handler) validate(w http.ResponseWriter, r *http.Request, route, cluster string) {
	start := time.Now()
	review, herr := h.read(w, r)
	if herr != nil {
		h.reject(w, herr, route, cluster, start)
		return
	}
	req := review.Request
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Operation == admissionv1.Delete && req.Kind.Group == "" && req.Kind.Kind == "Node" {
		node, herr := decodeNode(req)
		if herr != nil {
			h.reject(w, herr, route, cluster, start)
			return
		}
		d := h.decide(r.Context(), node, cluster, req)
		resp.Allowed, resp.Warnings = d.Allowed, d.Warnings
		if !d.Allowed {
			code := int32(http.StatusForbidden)
			if d.Reason == ReasonError {
				code = http.StatusInternalServerError
			}
			resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: metav1.StatusReasonForbidden,
				Message: strings.Join(d.Messages, " ")}
		}
		elapsed := time.Since(start)
		h.opts.Metrics.observe(route, result(d.Allowed), d.Reason, elapsed)
		h.opts.Log.Info("decision", "node", node.GetName(), "cluster", cluster, "user", req.UserInfo.Username,
			"allowed", d.Allowed, "reason", d.Reason, "blockers", blockerNames(d), "duration", elapsed)
	} else {
		h.opts.Metrics.observe(route, "allowed", ReasonNotJudged, time.Since(start))
	}
	review.Response, review.Request = resp, nil
	body, err := json.Marshal(review)
	if err != nil {
		http.Error(w, "nodeguard: encode response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

// reject answers a request that cannot be judged with its HTTP error.
func (h *handler) reject(w http.ResponseWriter, herr *httpError, route, cluster string, start time.Time) {
	if herr.code == http.StatusMethodNotAllowed {
		w.Header().Set("Allow", http.MethodPost)
	}
	http.Error(w, "nodeguard: "+herr.msg, herr.code)
	h.opts.Metrics.observe(route, "error", ReasonBadRequest, time.Since(start))
	h.opts.Log.Warn("bad admission request", "route", route, "cluster", cluster, "status", herr.code, "error", herr.msg)
}

// read checks the transport and decodes the AdmissionReview.
func (h *handler) read(w http.ResponseWriter, r *http.Request) (*admissionv1.AdmissionReview, *httpError) {
	if r.Method != http.MethodPost {
		return nil, &httpError{http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed: send the AdmissionReview with POST", r.Method)}
	}
	if h.opts.RequireClientCert && (r.TLS == nil || len(r.TLS.VerifiedChains) == 0) {
		return nil, &httpError{http.StatusUnauthorized, "a client certificate signed by --client-ca-file is required"}
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return nil, &httpError{http.StatusUnsupportedMediaType, fmt.Sprintf("content type %q not supported: want application/json", r.Header.Get("Content-Type"))}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &httpError{http.StatusRequestEntityTooLarge, fmt.Sprintf("body over %d bytes", MaxBodyBytes)}
		}
		return nil, badRequest("read body: %v", err)
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil {
		return nil, badRequest("malformed AdmissionReview JSON: %v", err)
	}
	if review.APIVersion != "admission.k8s.io/v1" || review.Kind != "AdmissionReview" {
		return nil, badRequest("want apiVersion admission.k8s.io/v1, kind AdmissionReview; got %q, %q", review.APIVersion, review.Kind)
	}
	if review.Request == nil {
		return nil, badRequest("AdmissionReview has no request")
	}
	if review.Request.UID == "" {
		return nil, badRequest("AdmissionReview request has no uid")
	}
	return &review, nil
}

// decodeNode reads the Node being deleted: the API server sends it as
// oldObject on DELETE.
func decodeNode(req *admissionv1.AdmissionRequest) (*unstructured.Unstructured, *httpError) {
	if len(req.OldObject.Raw) == 0 {
		return nil, badRequest("DELETE of Node %q carries no oldObject: nodeguard cannot tell which InfraMachines are linked to it", req.Name)
	}
	node := &unstructured.Unstructured{}
	if err := node.UnmarshalJSON(req.OldObject.Raw); err != nil {
		return nil, badRequest("oldObject of Node %q does not decode: %v", req.Name, err)
	}
	if node.GetAPIVersion() != "v1" || node.GetKind() != "Node" || node.GetName() == "" {
		return nil, badRequest("oldObject is %s %s %q, want a v1 Node with a name", node.GetAPIVersion(), node.GetKind(), node.GetName())
	}
	return node, nil
}

func (h *handler) decide(ctx context.Context, node *unstructured.Unstructured, cluster string, req *admissionv1.AdmissionRequest) decision.Decision {
	ctx, cancel := context.WithTimeout(ctx, h.opts.Timeout)
	defer cancel()
	if cluster != "" && h.opts.ClusterExists != nil {
		ns, name, _ := strings.Cut(cluster, "/")
		ok, err := h.opts.ClusterExists(ctx, ns, name)
		if err != nil {
			return guard.Deny(ReasonError, fmt.Sprintf("Node %q cannot be deleted right now: nodeguard could not read Cluster %s (%v); retry shortly.", node.GetName(), cluster, err))
		}
		if !ok {
			return guard.Deny(ReasonError, fmt.Sprintf("Node %q cannot be deleted: this webhook's URL names Cluster %s, which the management cluster does not have; fix the ValidatingWebhookConfiguration (nodeguard webhook-config --cluster).", node.GetName(), cluster))
		}
	}
	d, err := h.opts.Decider.Decide(ctx, guard.Request{Node: node, Cluster: cluster, UserInfo: req.UserInfo})
	if err != nil {
		return guard.Deny(ReasonError, fmt.Sprintf("Node %q cannot be deleted: nodeguard could not decide (%v).", node.GetName(), err))
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
