package serve

import (
	"context"
	"time"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/nodes"
)

// registrations judges what the registration routes are sent: under the
// cluster's ghost protection deny, the ghost criteria on fresh reads; any
// other protection, or a cluster whose protection cannot be read, allows.
// Nothing is denied while the inventory is not ready: registrations fail
// open, unlike Node deletes.
func registrations(finder *guard.Finder, protection func(ctx context.Context, cluster string) (nodes.Protection, error),
	ready func() error) func(context.Context, admission.Registration) (admission.RegistrationAnswer, error) {
	return func(ctx context.Context, r admission.Registration) (admission.RegistrationAnswer, error) {
		p, err := protection(ctx, r.Cluster)
		if err != nil {
			return admission.RegistrationAnswer{}, err
		}
		if p != nodes.ProtectionDeny {
			return admission.RegistrationAnswer{Allowed: true, Reason: admission.ReasonProtectionOff}, nil
		}
		if err := ready(); err != nil {
			return admission.RegistrationAnswer{}, err
		}
		reg, err := finder.Registration(ctx, r.Cluster, r.Operation, r.Node, r.Old, time.Now())
		if err != nil {
			return admission.RegistrationAnswer{}, err
		}
		if reg.Allowed {
			return admission.RegistrationAnswer{Allowed: true, Reason: admission.ReasonRegisters}, nil
		}
		return admission.RegistrationAnswer{Reason: admission.ReasonGhost, Message: reg.Message}, nil
	}
}
