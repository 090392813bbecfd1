package admission

import (
	"context"
	"net/http"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// The registration routes: a Node CREATE, or an UPDATE of a Node (not its
// status), judged by the ghost criteria. Their webhook entry is its own,
// with failurePolicy Ignore: joining a cluster never depends on nodeguard.
const (
	RouteRegister        = "/register"
	RouteRegisterCluster = "/register/clusters/{namespace}/{name}"
)

// Reasons a registration route answers with (nodeguard_decisions_total).
const (
	// ReasonGhost denies: the Node's providerID is tombstoned, nothing
	// links it.
	ReasonGhost = "ghost"
	// ReasonRegisters allows: no ghost registers (or nothing registers).
	ReasonRegisters = "not-a-ghost"
	// ReasonProtectionOff allows: the cluster's ghost protection is not deny.
	ReasonProtectionOff = "protection-off"
	// ReasonFailedOpen allows: nodeguard could not judge (not ready, a read
	// failed), and registrations fail open.
	ReasonFailedOpen = "failed-open"
)

// Registration is a Node CREATE or UPDATE as the registration routes pass
// it on: the Node (and the Node before an UPDATE) reduced to the fields the
// link model declares.
type Registration struct {
	Cluster   string // "" on /register (or WebhookOptions.SelfCluster), else the route's Cluster
	Operation string
	Node, Old *unstructured.Unstructured
}

// RegistrationAnswer is what the registration routes answer.
type RegistrationAnswer struct {
	Allowed bool   `json:"allowed"`
	Reason  string `json:"reason"`  // one of the Reason* of the registration routes
	Message string `json:"message"` // why it is denied
}

// register answers one registration review on route for cluster; any
// failure to judge it is an allow with a warning (fail open).
func (h *handler) register(w http.ResponseWriter, r *http.Request, route, cluster string) {
	start := time.Now()
	review, release, herr := h.read(w, r, route, cluster, true)
	if herr != nil {
		h.reject(w, herr, route, cluster, start)
		return
	}
	defer release()
	req := &review.Request
	a := RegistrationAnswer{Allowed: true, Reason: ReasonRegisters}
	switch {
	case req.Object == nil || req.Object.obj == nil:
		// No Node to judge (a DELETE sent here by a wrong configuration).
	case h.opts.Register == nil:
		a.Reason = ReasonProtectionOff
	default:
		ctx, cancel := context.WithTimeout(r.Context(), h.opts.Intake.Timeout())
		var old *unstructured.Unstructured
		if req.OldObject != nil {
			old = req.OldObject.obj
		}
		var err error
		a, err = h.opts.Register(ctx, Registration{Cluster: cluster, Operation: req.Operation, Node: req.Object.obj, Old: old})
		cancel()
		if err != nil {
			a = RegistrationAnswer{Allowed: true, Reason: ReasonFailedOpen,
				Message: "nodeguard could not judge whether this Node is a ghost (" + err.Error() + "); registrations fail open"}
		}
	}
	name := ""
	if req.Object != nil && req.Object.obj != nil {
		name = req.Object.obj.GetName()
	}
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: a.Allowed}
	if a.Allowed && a.Message != "" {
		resp.Warnings = []string{"nodeguard: " + a.Message}
	}
	if !a.Allowed {
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden, Message: a.Message}
	}
	if h.opts.DecisionLog.Enabled() {
		id := rule.NewDecisionID()
		resp.AuditAnnotations = map[string]string{DecisionIDAuditAnnotation: id}
		h.opts.DecisionLog.Log(rule.DecisionEvent{ID: id, Path: rule.RegistrationEntry.Path(), Result: a, Time: start,
			Input:  map[string]any{"review": map[string]any{"operation": req.Operation, "name": name, "userInfo": map[string]any{"username": req.UserInfo.Username}}},
			Custom: map[string]any{"route": route, "cluster": cluster, "uid": string(req.UID)}})
	}
	elapsed := time.Since(start)
	h.opts.Metrics.observe(route, cluster, result(a.Allowed), a.Reason, rule.ActionDeny, elapsed)
	h.opts.Log.Info("registration", "node", name, "cluster", cluster, "operation", req.Operation, "allowed", a.Allowed,
		"reason", a.Reason, "duration", elapsed)
	answer(w, review, resp)
}
