package serve

import (
	"context"
	"time"

	"github.com/nodeguard/nodeguard/enforcer/ghosts"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/webhook"
)

// registrations judges what the registration routes are sent: under the
// cluster's ghost protection deny, the ghost criteria on fresh reads; any
// other protection, or a cluster whose protection cannot be read, allows.
// Nothing is denied while the inventory is not ready: registrations fail
// open, unlike Node deletes.
func registrations(finder *guard.Finder, protection func(ctx context.Context, cluster string) (ghosts.Protection, error),
	ready func() error) func(context.Context, webhook.Registration) (webhook.RegistrationAnswer, error) {
	return func(ctx context.Context, r webhook.Registration) (webhook.RegistrationAnswer, error) {
		p, err := protection(ctx, r.Cluster)
		if err != nil {
			return webhook.RegistrationAnswer{}, err
		}
		if p != ghosts.Deny {
			return webhook.RegistrationAnswer{Allowed: true, Reason: webhook.ReasonProtectionOff}, nil
		}
		if err := ready(); err != nil {
			return webhook.RegistrationAnswer{}, err
		}
		reg, err := finder.Registration(ctx, r.Cluster, r.Operation, r.Node, r.Old, time.Now())
		if err != nil {
			return webhook.RegistrationAnswer{}, err
		}
		if reg.Allowed {
			return webhook.RegistrationAnswer{Allowed: true, Reason: webhook.ReasonRegisters}, nil
		}
		return webhook.RegistrationAnswer{Reason: webhook.ReasonGhost, Message: reg.Message}, nil
	}
}
