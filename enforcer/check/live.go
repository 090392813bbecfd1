package check

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeguard/nodeguard/enforcer/decision"
	"github.com/nodeguard/nodeguard/enforcer/engine"
	"github.com/nodeguard/nodeguard/enforcer/kubeclient"
	"github.com/nodeguard/nodeguard/enforcer/live"
)

// syncTimeout bounds how long a live check waits for its caches.
const syncTimeout = 60 * time.Second

var nodeGVR = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}

// judgeLive judges against the cluster of the kubeconfig: Machines and
// InfraMachines through the same informers and indexes as the webhook, with
// fresh reads of the candidates.
func judgeLive(ctx context.Context, opts Options, params map[string]any, eval *engine.Engine) (decision.Decision, error) {
	c, err := kubeclient.Connect(opts.Kubeconfig, opts.Context)
	if err != nil {
		return decision.Decision{}, err
	}
	return judgeWith(ctx, c, opts, params, eval)
}

func judgeWith(ctx context.Context, c kubeclient.Clients, opts Options, params map[string]any, eval *engine.Engine) (decision.Decision, error) {
	node, err := c.Dynamic.Resource(nodeGVR).Get(ctx, opts.Node, metav1.GetOptions{})
	if err != nil {
		return decision.Decision{}, fmt.Errorf("get node %q: %w", opts.Node, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the informers
	e, err := live.Start(ctx, c, live.Options{Parameters: params, Engine: eval})
	if err != nil {
		return decision.Decision{}, err
	}
	if err := live.WaitReady(ctx, e.Syncer.Ready, syncTimeout); err != nil {
		return decision.Decision{}, err
	}
	return e.Guard.Decide(ctx, request(opts, node))
}
