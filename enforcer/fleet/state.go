package fleet

import (
	"time"
)

// Modes of a Cluster (annotation ModeAnnotation).
const (
	// ModeWebhook routes the workload API server's Node deletes to
	// nodeguard's cluster route through a ValidatingWebhookConfiguration.
	ModeWebhook = "webhook"
)

// Annotations on a CAPI Cluster that steer the fleet reconciler.
const (
	// ModeAnnotation picks the Cluster's mode (default ModeWebhook).
	ModeAnnotation = "nodeguard.io/mode"
	// OptOutAnnotation "true" keeps nodeguard out of the Cluster: the
	// configuration it installed there is removed.
	OptOutAnnotation = "nodeguard.io/opt-out"
)

// Reasons a Cluster is not guarded (State.Reason).
const (
	ReasonNoKubeconfig      = "no-kubeconfig"
	ReasonUnreachable       = "unreachable"
	ReasonNotInstalled      = "not-installed"
	ReasonStaleCABundle     = "stale-ca-bundle"
	ReasonReviewNotReceived = "review-not-received"
	ReasonNoNodes           = "no-nodes"
	ReasonOptedOut          = "opted-out"
	ReasonNotSelected       = "not-selected"
	ReasonModeUnsupported   = "mode-unsupported"
	ReasonDeleting          = "deleting"
	// ReasonDryRun: the Cluster's enforcement action is dryrun there (the
	// route's, or its policy binding's): every Node delete is judged and
	// none denied, as asked.
	ReasonDryRun = "dryrun"
)

// Reasons lists every reason, for metrics and docs.
func Reasons() []string {
	return []string{ReasonNoKubeconfig, ReasonUnreachable, ReasonNotInstalled, ReasonStaleCABundle, ReasonReviewNotReceived,
		ReasonNoNodes, ReasonOptedOut, ReasonNotSelected, ReasonModeUnsupported, ReasonDeleting, ReasonDryRun}
}

// Excluded says whether a reason means nodeguard was told to stay out, or
// not to deny (or the Cluster is going): not a fault, and the unguarded
// alert ignores it.
func Excluded(reason string) bool {
	switch reason {
	case ReasonOptedOut, ReasonNotSelected, ReasonDeleting, ReasonDryRun:
		return true
	}
	return false
}

// State is what the reconciler knows of one Cluster, as `nodeguard
// clusters` shows it.
type State struct {
	Cluster string `json:"cluster"`
	Mode    string `json:"mode"`
	// Guarded: the cluster's configuration is as nodeguard wants it and its
	// last proof reached nodeguard's route for this Cluster.
	Guarded bool `json:"guarded"`
	// Wired: nodeguard's configuration is installed there as it wants it.
	Wired bool `json:"wired"`
	// CACurrent: the installed configuration trusts the current CA bundle.
	CACurrent bool `json:"caCurrent"`
	// Action is the enforcement action the last proof found in force
	// there ("" before one).
	Action  string `json:"action,omitempty"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Identity is the user nodeguard writes and proves as there, as the
	// workload API server names it (a SelfSubjectReview).
	Identity string `json:"identity,omitempty"`
	// LastProof is when a dry-run Node delete last reached the route.
	LastProof time.Time `json:"lastProof,omitzero"`
	// Since is when Guarded and Reason took their values.
	Since time.Time `json:"since,omitzero"`
}

// sameVerdict says whether two states read the same to an operator: an
// Event is recorded when they do not.
func (s State) sameVerdict(o State) bool {
	return s.Guarded == o.Guarded && s.Reason == o.Reason
}
