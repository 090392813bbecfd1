package check

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodeguard/nodeguard/enforcer/decision"
	"github.com/nodeguard/nodeguard/enforcer/freshread"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/informers"
	"github.com/nodeguard/nodeguard/enforcer/inventory"
)

// syncTimeout bounds how long a live check waits for its caches.
const syncTimeout = 60 * time.Second

var nodeGVR = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}

// live judges against the cluster of the kubeconfig: Machines and
// InfraMachines through the same informers and indexes as the webhook, with
// fresh reads of the candidates.
func live(ctx context.Context, opts Options, params map[string]any) (decision.Decision, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = opts.Kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: opts.Context}).ClientConfig()
	if err != nil {
		return decision.Decision{}, fmt.Errorf("load kubeconfig: %w", err)
	}
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return decision.Decision{}, fmt.Errorf("create client: %w", err)
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return decision.Decision{}, fmt.Errorf("create discovery client: %w", err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disco))
	return liveWith(ctx, client, mapper, opts, params)
}

func liveWith(ctx context.Context, client dynamic.Interface, mapper meta.RESTMapper, opts Options, params map[string]any) (decision.Decision, error) {
	node, err := client.Resource(nodeGVR).Get(ctx, opts.Node, metav1.GetOptions{})
	if err != nil {
		return decision.Decision{}, fmt.Errorf("get node %q: %w", opts.Node, err)
	}
	eval, err := decision.NewEvaluator(ctx)
	if err != nil {
		return decision.Decision{}, err
	}
	infraKinds, poolKinds, err := kinds(eval, params)
	if err != nil {
		return decision.Decision{}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the informers
	inv := inventory.New()
	syncer := informers.New(inv, informers.Options{Client: client, Mapper: mapper, InfraKinds: infraKinds, PoolKinds: poolKinds})
	if err := syncer.Start(ctx); err != nil {
		return decision.Decision{}, err
	}
	if err := waitReady(ctx, syncer.Ready, syncTimeout); err != nil {
		return decision.Decision{}, err
	}
	g, err := guard.New(ctx, inv, guard.Options{
		Parameters:  params,
		Evaluator:   eval,
		SyncedKinds: syncer.SyncedKinds,
		Ready:       syncer.Ready,
		Fresh:       freshread.New(client, mapper),
	})
	if err != nil {
		return decision.Decision{}, err
	}
	return g.Decide(ctx, request(opts, node))
}

func waitReady(ctx context.Context, ready func() error, timeout time.Duration) error {
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
