// This file assembles the enforcer over one cluster: informers that fill
// the inventory, fresh reads, and a Guard over them, with its readiness. The
// webhook (`nodeguard serve`), the live `nodeguard check` and `nodeguard
// orphans` share it, so all judge a Node the same way. kube.Connect builds the
// clients it runs on.

package guard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// EnforcerOptions configure an Enforcer.
type EnforcerOptions struct {
	// Parameters are a Constraint's spec.parameters (nil: the defaults).
	Parameters map[string]any
	// NoFreshReads answers from the informer caches alone.
	NoFreshReads bool
	// FreshTimeout bounds the fresh reads of one decision (default 2s).
	FreshTimeout time.Duration
	// Engine runs the policy (required): the embedded rule or a verified
	// bundle's, chosen once by the caller (rule.LoadEngine).
	Engine *rule.Engine
	// OnChange, when set, gets every change of the inventory from the
	// informers' first objects on (the orphan scan's facts.Relay).
	OnChange func(facts.Change)
	// WatchFilter, when set, caches only the objects labelled
	// cluster.x-k8s.io/watch-filter with this value, and judges a Cluster's
	// route only once its Shard proves the caches hold that Cluster whole.
	WatchFilter string
}

// Enforcer is a Guard over informer caches of one cluster.
type Enforcer struct {
	Engine    *rule.Engine
	Guard     *Guard
	Syncer    *facts.Syncer
	Inventory *facts.Inventory
	// Shard is nil without a watch filter; with one, its caller runs it
	// (Shard.Run) with the Clusters it acts on.
	Shard *facts.Shard
}

// StartEnforcer starts the informers and returns at once; the Guard denies every
// delete until Syncer.Ready reports the caches synced. Informers stop when
// ctx is done.
func StartEnforcer(ctx context.Context, c kube.Clients, opts EnforcerOptions) (*Enforcer, error) {
	eval := opts.Engine
	if eval == nil {
		return nil, errors.New("live: no policy engine: the caller chooses the policy (rule.LoadEngine)")
	}
	infraKinds, poolKinds, err := eval.Kinds(opts.Parameters)
	if err != nil {
		return nil, err
	}
	inv := facts.NewInventory(eval.Model())
	// Kinds are found by the contract too, so a provider kind no parameter
	// lists still blocks (informers/contract.go).
	syncer := facts.NewSyncer(inv, facts.SyncerOptions{Client: c.Dynamic, Mapper: c.Mapper, InfraKinds: infraKinds, PoolKinds: poolKinds, Contract: true,
		WatchFilter: opts.WatchFilter})
	var shard *facts.Shard
	if opts.WatchFilter != "" {
		shard = facts.NewShard(facts.ShardOptions{Value: opts.WatchFilter, Client: c.Dynamic, Syncer: syncer})
	}
	if opts.OnChange != nil {
		if err := syncer.Subscribe(opts.OnChange); err != nil {
			return nil, err
		}
	}
	if err := syncer.Start(ctx); err != nil {
		return nil, err
	}
	gopts := Options{
		Parameters:   opts.Parameters,
		Engine:       eval,
		SyncedKinds:  syncer.SyncedKinds,
		Ready:        syncer.Ready,
		Recovering:   syncer.Recovering,
		FreshTimeout: opts.FreshTimeout,
	}
	if shard != nil {
		gopts.Holds = shard.Holds
	}
	if !opts.NoFreshReads {
		gopts.Fresh = facts.NewFreshReader(c.Dynamic, c.Mapper)
	}
	g, err := New(ctx, inv, gopts)
	if err != nil {
		return nil, err
	}
	return &Enforcer{Engine: eval, Guard: g, Syncer: syncer, Inventory: inv, Shard: shard}, nil
}

// WaitReady polls ready until it reports no error, the timeout passes, or
// ctx is done.
func WaitReady(ctx context.Context, ready func() error, timeout time.Duration) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		last = ready()
		return last == nil, nil
	})
	if err != nil && last != nil && ctx.Err() == nil {
		return fmt.Errorf("caches not synced after %s: %w", timeout, last)
	}
	return err
}
