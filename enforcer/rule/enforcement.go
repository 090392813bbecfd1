// This file says what nodeguard does with a Node delete the rule
// denies, as Gatekeeper's enforcementAction does: deny it (the default),
// allow it with the denial as an admission warning (warn), or allow it
// silently, logged and counted (dryrun). A rollout goes dryrun, warn, deny.

package rule

import "fmt"

// Action is one enforcement action.
type Action string

// The actions, named as Gatekeeper names them.
const (
	ActionDeny   Action = "deny"
	ActionWarn   Action = "warn"
	ActionDryRun Action = "dryrun"
)

// ActionAnnotation on a CAPI Cluster sets the action for its route (and, in mode
// admission-policy, its policy's binding), over serve's
// --enforcement-action.
const ActionAnnotation = "nodeguard.io/enforcement-action"

// ParseAction reads an action; "" is ActionDeny.
func ParseAction(s string) (Action, error) {
	switch a := Action(s); a {
	case "":
		return ActionDeny, nil
	case ActionDeny, ActionWarn, ActionDryRun:
		return a, nil
	}
	return "", fmt.Errorf("enforcement action %q: want deny, warn or dryrun", s)
}

// ActionOf is the action a Cluster's annotations set, else fallback. An action
// the annotation misspells is an error: the caller keeps fallback, and
// says so, rather than guess.
func ActionOf(annotations map[string]string, fallback Action) (Action, error) {
	v, ok := annotations[ActionAnnotation]
	if !ok {
		return fallback, nil
	}
	a, err := ParseAction(v)
	if err != nil {
		return fallback, fmt.Errorf("annotation %s: %w", ActionAnnotation, err)
	}
	return a, nil
}

// Enforced says whether a denial under a is answered as one.
func (a Action) Enforced() bool { return a == ActionDeny || a == "" }
