package cli

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

var nodeGVR = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}

// judgeLive judges against the cluster of the kubeconfig: Machines and
// InfraMachines through the same informers and indexes as the webhook, with
// fresh reads of the candidates. With --cluster the Node is read from that
// workload cluster, through its kubeconfig Secret, as the cluster route
// judges a Node of it. Without --constraint the parameters are the
// cluster's Constraint, as serve's are.
func judgeLive(ctx context.Context, opts CheckOptions, params map[string]any, eval *rule.Engine) (rule.Decision, error) {
	c, err := kube.Connect(opts.Kubeconfig, opts.Context)
	if err != nil {
		return rule.Decision{}, err
	}
	if params, err = liveParameters(ctx, c, opts.Constraint, params); err != nil {
		return rule.Decision{}, err
	}
	nodes := func(context.Context) (dynamic.ResourceInterface, error) { return c.Dynamic.Resource(nodeGVR), nil }
	if opts.Cluster != "" {
		nodes = func(ctx context.Context) (dynamic.ResourceInterface, error) {
			return kube.ClusterNodes(ctx, c.Config, opts.Cluster)
		}
	}
	return judgeWith(ctx, c, nodes, opts, params, eval)
}

func judgeWith(ctx context.Context, c kube.Clients, nodes func(context.Context) (dynamic.ResourceInterface, error), opts CheckOptions, params map[string]any, eval *rule.Engine) (rule.Decision, error) {
	where, err := nodes(ctx)
	if err != nil {
		return rule.Decision{}, err
	}
	node, err := where.Get(ctx, opts.Node, metav1.GetOptions{})
	if err != nil {
		if opts.Cluster != "" {
			return rule.Decision{}, fmt.Errorf("get node %q in the workload cluster of %s: %w", opts.Node, opts.Cluster, err)
		}
		return rule.Decision{}, fmt.Errorf("get node %q: %w", opts.Node, err)
	}
	e, stop, err := startEnforcer(ctx, c, guard.EnforcerOptions{Parameters: params, Engine: eval})
	defer stop()
	if err != nil {
		return rule.Decision{}, err
	}
	return e.Guard.Decide(ctx, request(opts, node))
}
