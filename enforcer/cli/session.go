package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/kube"
)

// What every judging command sets up the same way, as serve does: the output
// format, the Constraint's parameters, an enforcer over a live cluster.

// syncTimeout bounds how long a live command waits for its caches.
const syncTimeout = 60 * time.Second

// checkOutput refuses an -o the commands do not print.
func checkOutput(output string) error {
	if output != "text" && output != "json" {
		return fmt.Errorf("-o %q: want text or json", output)
	}
	return nil
}

// liveParameters are the parameters read from --constraint FILE when one was
// given, else the live Constraint's in c's cluster, as serve's are.
func liveParameters(ctx context.Context, c kube.Clients, constraintFile string, fromFile map[string]any) (map[string]any, error) {
	if constraintFile != "" {
		return fromFile, nil
	}
	return facts.LiveConstraintParameters(ctx, c.Dynamic, c.Mapper)
}

// startEnforcer starts an enforcer over c's cluster and waits for its caches;
// cancelling ctx stops its informers.
func startEnforcer(ctx context.Context, c kube.Clients, opts guard.EnforcerOptions) (*guard.Enforcer, error) {
	e, err := guard.StartEnforcer(ctx, c, opts)
	if err != nil {
		return nil, err
	}
	if err := guard.WaitReady(ctx, e.Syncer.Ready, syncTimeout); err != nil {
		return nil, err
	}
	return e, nil
}
