// This file is the rule's answer to an admission review: the
// decision types, the reasons, and Evaluate, which runs the policy's
// decision entry point (data.nodeguard.decision) on an Engine.

package rule

import (
	"context"
	"fmt"
)

// Input is what the rule reads: an AdmissionRequest-shaped review, an
// inventory in Gatekeeper's layout, and a Constraint's parameters.
type Input struct {
	Review     map[string]any `json:"review"`
	Inventory  map[string]any `json:"inventory"`
	Parameters Parameters     `json:"parameters"`
}

// BlockerLink says how a blocker is linked to the Node.
type BlockerLink struct {
	Type    string `json:"type"`
	Machine string `json:"machine,omitempty"`
	// MachinePool names the MachinePool ("namespace/name") through which a
	// pool is linked.
	MachinePool string `json:"machine_pool,omitempty"`
}

// Blocker is a linked InfraMachine (or pool) that still exists.
type Blocker struct {
	Group     string        `json:"group"`
	Version   string        `json:"version"`
	Kind      string        `json:"kind"`
	Namespace string        `json:"namespace"`
	Name      string        `json:"name"`
	Deleting  bool          `json:"deleting"`
	Links     []BlockerLink `json:"links"`
}

// Unverified is a linked Machine's InfraMachine whose kind is not synced, so
// its absence proves nothing.
type Unverified struct {
	Group     string        `json:"group"`
	Kind      string        `json:"kind"`
	Namespace string        `json:"namespace"`
	Name      string        `json:"name"`
	Links     []BlockerLink `json:"links"`
}

// Reasons say in one word why a request was answered as it was: the
// reason label of nodeguard_decisions_total and of the decision log line.
// The first seven are the rule's own, named here for the code that branches
// on them and for the docs: Go passes on whatever reason the decision gives.
// The others name denials made outside Rego (Denial) and requests answered
// with an HTTP error.
const (
	ReasonNoLink      = "no-link"     // allowed: nothing linked still exists
	ReasonExempt      = "exempt"      // allowed for an exempt user or group; see Warnings
	ReasonNotJudged   = "not-judged"  // allowed: the rule judges only DELETE of a core Node
	ReasonBlocked     = "blocked"     // denied: a linked InfraMachine or pool still exists
	ReasonUnverified  = "unverified"  // denied: a linked kind is not synced
	ReasonMisrouted   = "misrouted"   // denied: the Node's CAPI annotations name another Cluster than the route's
	ReasonUnjudgeable = "unjudgeable" // denied: the review carries no Node (or, in Gatekeeper, the provider gave no facts)

	ReasonNotReady        = "not-ready"         // denied: caches not synced yet
	ReasonCacheRecovering = "cache-recovering"  // denied: nothing linked found, but a cache is catching up after a broken watch
	ReasonNotHeld         = "not-held"          // denied: nothing linked found, but a watch-filter install does not hold the Cluster whole
	ReasonFreshReadFailed = "fresh-read-failed" // denied: the API server did not answer in time
	ReasonError           = "error"             // denied: no decision could be made
	ReasonBusy            = "busy"              // denied: no decision slot within the deadline
	ReasonDryRunOnly      = "dry-run-only"      // denied: nodeguard's own workload identity may only dry-run a Node delete
	ReasonBadRequest      = "bad-request"       // no decision: answered with an HTTP error
)

// Denial is a denial that no Rego evaluation produced (not ready, no fresh
// read, no decision in time), shaped like the rule's so every caller prints
// and counts it the same way.
func Denial(reason, msg string) Decision {
	return Decision{Allowed: false, Reason: reason, Blockers: []Blocker{}, Unverified: []Unverified{},
		Messages: []string{msg}, Warnings: []string{}}
}

// Decision is the rule's answer.
type Decision struct {
	Allowed    bool         `json:"allowed"`
	Reason     string       `json:"reason"`
	Blockers   []Blocker    `json:"blockers"`
	Unverified []Unverified `json:"unverified"`
	Messages   []string     `json:"messages"`
	Warnings   []string     `json:"warnings"`
	// Input is what the rule read for it (the review alone when it was not
	// asked), for a decision log; not the rule's.
	Input any `json:"-"`
}

// Evaluate runs the rule on one input, with the policy e runs.
func Evaluate(ctx context.Context, e *Engine, in Input) (Decision, error) {
	d, err := Run[Decision](ctx, e, DecisionEntry, map[string]any{"review": in.Review, "inventory": in.Inventory, "parameters": in.Parameters})
	if err != nil {
		return Decision{}, err
	}
	// The rule says why, in its own words, which Go passes on: a policy
	// that gives no reason gets no decision, which every caller turns into
	// a denial.
	if d.Reason == "" {
		return Decision{}, fmt.Errorf("evaluate %s: the decision (allowed %t) gives no reason", DecisionEntry.Query(), d.Allowed)
	}
	return d, nil
}
