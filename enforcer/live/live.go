// Package live connects the enforcer to a cluster: clients from a kubeconfig,
// informers that fill the inventory, fresh reads, and a Guard over them. The
// webhook (`nodeguard serve`) and the live `nodeguard check` share it, so both
// judge a Node the same way.
package live

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodeguard/nodeguard/enforcer/decision"
	"github.com/nodeguard/nodeguard/enforcer/freshread"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/informers"
	"github.com/nodeguard/nodeguard/enforcer/inventory"
)

// Clients are what the enforcer needs of one API server.
type Clients struct {
	Config  *rest.Config
	Dynamic dynamic.Interface
	Mapper  meta.RESTMapper
}

// Client-side rate limits of the clients (--kube-api-qps, --kube-api-burst).
// client-go's own defaults (5/s, burst 10) starve fresh reads: a
// MachineDeployment scaled down by 30 deletes 30 Nodes within a second or two,
// each decision re-reads 2 objects (Machine, InfraMachine), and CAPI tries each
// Node delete for only ~10 s. A burst of 200 covers 100 Node deletes arriving
// at once; 100/s sustains ~50 Node deletes a second (docs/performance.md
// measures the live path). The API server's priority and fairness stays the
// real limit; these only keep the client from refusing first.
const (
	DefaultQPS   float32 = 100
	DefaultBurst         = 200
)

// Connect builds clients from a kubeconfig file (empty: the usual kubectl
// search, then in-cluster) and context (empty: the current one), with the
// default rate limits.
func Connect(kubeconfig, kubeContext string) (Clients, error) {
	return ConnectWith(kubeconfig, kubeContext, DefaultQPS, DefaultBurst)
}

// ConnectWith is Connect with the client rate limits given (0: the default).
func ConnectWith(kubeconfig, kubeContext string, qps float32, burst int) (Clients, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kubeContext}).ClientConfig()
	if err != nil {
		return Clients{}, fmt.Errorf("load kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = qps, burst
	return FromConfig(cfg)
}

// FromConfig builds clients from a REST config; a QPS or Burst left 0 takes
// DefaultQPS or DefaultBurst instead of client-go's 5 and 10.
func FromConfig(cfg *rest.Config) (Clients, error) {
	cfg = rest.CopyConfig(cfg)
	if cfg.QPS == 0 {
		cfg.QPS = DefaultQPS
	}
	if cfg.Burst == 0 {
		cfg.Burst = DefaultBurst
	}
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return Clients{}, fmt.Errorf("create client: %w", err)
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return Clients{}, fmt.Errorf("create discovery client: %w", err)
	}
	return Clients{Config: cfg, Dynamic: client, Mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disco))}, nil
}

// Options configure an Enforcer.
type Options struct {
	// Parameters are a Constraint's spec.parameters (nil: the defaults).
	Parameters map[string]any
	// NoFreshReads answers from the informer caches alone.
	NoFreshReads bool
	// FreshTimeout bounds the fresh reads of one decision (default 2s).
	FreshTimeout time.Duration
	// Evaluator, when set, runs instead of the embedded rule (e.g. a
	// verified bundle's policy).
	Evaluator *decision.Evaluator
}

// Enforcer is a Guard over informer caches of one cluster.
type Enforcer struct {
	Evaluator *decision.Evaluator
	Guard     *guard.Guard
	Syncer    *informers.Syncer
	Inventory *inventory.Inventory
}

// Start starts the informers and returns at once; the Guard denies every
// delete until Syncer.Ready reports the caches synced. Informers stop when
// ctx is done.
func Start(ctx context.Context, c Clients, opts Options) (*Enforcer, error) {
	eval := opts.Evaluator
	if eval == nil {
		var err error
		if eval, err = decision.NewEvaluator(ctx); err != nil {
			return nil, err
		}
	}
	infraKinds, poolKinds, err := Kinds(eval, opts.Parameters)
	if err != nil {
		return nil, err
	}
	inv := inventory.New(eval.Model())
	syncer := informers.New(inv, informers.Options{Client: c.Dynamic, Mapper: c.Mapper, InfraKinds: infraKinds, PoolKinds: poolKinds})
	if err := syncer.Start(ctx); err != nil {
		return nil, err
	}
	gopts := guard.Options{
		Parameters:   opts.Parameters,
		Evaluator:    eval,
		SyncedKinds:  syncer.SyncedKinds,
		Ready:        syncer.Ready,
		FreshTimeout: opts.FreshTimeout,
	}
	if !opts.NoFreshReads {
		gopts.Fresh = freshread.New(c.Dynamic, c.Mapper)
	}
	g, err := guard.New(ctx, inv, gopts)
	if err != nil {
		return nil, err
	}
	return &Enforcer{Evaluator: eval, Guard: g, Syncer: syncer, Inventory: inv}, nil
}

// WaitReady polls ready until it reports no error, the timeout passes, or
// ctx is done.
func WaitReady(ctx context.Context, ready func() error, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("caches not synced after %s: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Kinds returns the InfraMachine and pool kinds of the parameters, with the
// rule's defaults for those not given.
func Kinds(eval *decision.Evaluator, params map[string]any) (infra, pools []schema.GroupKind, err error) {
	effective := eval.DefaultParameters()
	for k, v := range params {
		effective[k] = v
	}
	if infra, err = groupKinds(effective, "infraMachineKinds"); err != nil {
		return nil, nil, err
	}
	if pools, err = groupKinds(effective, "infraMachinePoolKinds"); err != nil {
		return nil, nil, err
	}
	return infra, pools, nil
}

// groupKinds reads a list of {group, kind} parameters.
func groupKinds(params map[string]any, key string) ([]schema.GroupKind, error) {
	list, ok := params[key].([]any)
	if !ok {
		return nil, fmt.Errorf("parameter %s: want a list of {group, kind}, got %T", key, params[key])
	}
	out := make([]schema.GroupKind, 0, len(list))
	for i, item := range list {
		m, _ := item.(map[string]any)
		group, _ := m["group"].(string)
		kind, _ := m["kind"].(string)
		if kind == "" {
			return nil, fmt.Errorf("parameter %s[%d]: want {group, kind}, got %v", key, i, item)
		}
		out = append(out, schema.GroupKind{Group: group, Kind: kind})
	}
	return out, nil
}
