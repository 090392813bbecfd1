package serve

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/fleet"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/nodes"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// initialConstraint is the Constraint nodeguard starts with: the file's
// (--constraint), else the cluster's (--constraint-name), else none (the
// rule's defaults). follow says whether its edits are followed.
func initialConstraint(ctx context.Context, c kube.Clients, opts Options) (spec facts.ConstraintSpec, follow bool, err error) {
	if opts.Constraint != "" {
		params, err := facts.ConstraintParameters(opts.Constraint)
		return facts.ConstraintSpec{Parameters: params, From: opts.Constraint}, false, err
	}
	if opts.ConstraintName == "" || c.Dynamic == nil || c.Mapper == nil {
		return facts.ConstraintSpec{From: "no Constraint asked for"}, false, nil
	}
	spec, err = facts.ReadConstraint(ctx, c.Dynamic, c.Mapper, opts.ConstraintName)
	if err != nil {
		return spec, false, fmt.Errorf("%w (nodeguard reads its parameters there; grant it get, list and watch on "+
			"k8snodeguard.constraints.gatekeeper.sh, pass --constraint FILE, or --constraint-name=\"\" for the rule's defaults)", err)
	}
	return spec, true, nil
}

// liveConstraint puts the Constraint's edits in force: the guard's
// parameters, the kinds watched, the fleet's admission policy exemptions and
// the enforcement action, all or none.
type liveConstraint struct {
	enforcer *guard.Enforcer
	fleet    *fleet.Reconciler
	scanner  *nodes.Scanner
	// flag is --enforcement-action, in force where the Constraint sets none.
	flag   rule.Action
	action atomic.Value // rule.Action
}

func newLiveConstraint(e *guard.Enforcer, spec facts.ConstraintSpec, flag rule.Action, log *slog.Logger) *liveConstraint {
	l := &liveConstraint{enforcer: e, flag: flag}
	l.setAction(spec)
	if spec.Action != "" && flag != "" && spec.Action != flag {
		log.Warn("the Constraint's spec.enforcementAction overrides --enforcement-action", "from", spec.From,
			"enforcementAction", string(spec.Action), "flag", string(flag))
	}
	return l
}

// Action is the enforcement action in force.
func (l *liveConstraint) Action() rule.Action { return l.action.Load().(rule.Action) }

func (l *liveConstraint) setAction(spec facts.ConstraintSpec) {
	a := spec.Action
	if a == "" {
		a = l.flag
	}
	if a == "" {
		a = rule.ActionDeny
	}
	l.action.Store(a)
}

// Apply is facts.ConstraintWatchOptions.Apply.
func (l *liveConstraint) Apply(_ context.Context, spec facts.ConstraintSpec) error {
	e := l.enforcer
	infra, pools, err := e.Engine.Kinds(spec.Parameters)
	if err != nil {
		return err
	}
	before := e.Guard.Parameters()
	if err := e.Guard.SetParameters(spec.Parameters); err != nil {
		return err
	}
	if l.fleet != nil {
		if err := l.fleet.SetExempt(stringsParam(spec.Parameters, "exemptUsers"), stringsParam(spec.Parameters, "exemptGroups")); err != nil {
			if rerr := e.Guard.SetParameters(before); rerr != nil {
				return fmt.Errorf("%w; and the parameters before could not be put back: %v", err, rerr)
			}
			return err
		}
	}
	e.Syncer.AddParameterKinds(infra, pools)
	was := l.Action()
	l.setAction(spec)
	if l.fleet != nil && l.Action() != was {
		// The routes answer under it from the next review: proven now, so a
		// dryrun is reported at once.
		l.fleet.Reprove()
	}
	if l.scanner != nil {
		l.scanner.JudgeAll() // the orphan criteria read the parameters too
	}
	return nil
}
