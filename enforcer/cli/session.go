package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// What every judging command sets up the same way, as serve does: the output
// format, the Constraint's parameters and the policy, an enforcer over a live
// cluster.

// syncTimeout bounds how long a live command waits for its caches.
const syncTimeout = 60 * time.Second

// checkOutput refuses an -o the commands do not print.
func checkOutput(output string) error {
	if output != "text" && output != "json" {
		return fmt.Errorf("-o %q: want text or json", output)
	}
	return nil
}

// writeJSON prints -o json.
func writeJSON(out io.Writer, what string, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write %s: %w", what, err)
	}
	return nil
}

// loadPolicy reads the parameters of --constraint FILE, else, with a live
// cluster c, its Constraint's, and the policy: the bundle's or the embedded
// rule.
func loadPolicy(ctx context.Context, c *kube.Clients, constraintFile string, bundle rule.BundleOptions) (map[string]any, *rule.Engine, error) {
	params, err := facts.ConstraintParameters(constraintFile)
	if err != nil {
		return nil, nil, err
	}
	if c != nil {
		if params, err = liveParameters(ctx, *c, constraintFile, params); err != nil {
			return nil, nil, err
		}
	}
	eval, err := rule.LoadEngine(ctx, bundle)
	if err != nil {
		return nil, nil, err
	}
	return params, eval, nil
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
// stop stops its informers (call it even on an error).
func startEnforcer(ctx context.Context, c kube.Clients, opts guard.EnforcerOptions) (e *guard.Enforcer, stop func(), err error) {
	ctx, stop = context.WithCancel(ctx)
	if e, err = guard.StartEnforcer(ctx, c, opts); err == nil {
		err = guard.WaitReady(ctx, e.Syncer.Ready, syncTimeout)
	}
	return e, stop, err
}
