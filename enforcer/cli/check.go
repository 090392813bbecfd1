// This file implements `nodeguard check`: would deleting this Node be
// allowed? Offline against manifest files, or live against a cluster.

package cli

import (
	"context"
	"fmt"
	"io"
	"slices"

	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// Exit codes: scripts depend on them.
const (
	ExitAllowed = 0
	ExitError   = 1
	ExitDenied  = 2
)

// CheckOptions are the flags of `nodeguard check`.
type CheckOptions struct {
	Node       string
	Files      []string
	Cluster    string
	User       string
	Groups     []string
	Constraint string
	Output     string
	Kubeconfig string
	Context    string
	// Bundle, when its Path is set, is the signed policy bundle to judge
	// with instead of the embedded rule.
	Bundle rule.BundleOptions
}

// CheckResult is what -o json prints.
type CheckResult struct {
	Node    string `json:"node"`
	Cluster string `json:"cluster,omitempty"`
	rule.Decision
}

// Check judges the delete and prints the result; the int is the exit code.
func Check(ctx context.Context, opts CheckOptions, out io.Writer) (int, error) {
	if opts.Node == "" {
		return ExitError, fmt.Errorf("--node is required")
	}
	if err := checkOutput(opts.Output); err != nil {
		return ExitError, err
	}
	params, eval, err := loadPolicy(ctx, nil, opts.Constraint, opts.Bundle)
	if err != nil {
		return ExitError, err
	}
	var d rule.Decision
	if len(opts.Files) > 0 {
		d, err = offline(ctx, opts, params, eval)
	} else {
		d, err = judgeLive(ctx, opts, params, eval)
	}
	if err != nil {
		return ExitError, err
	}
	if err := printCheck(out, opts, d); err != nil {
		return ExitError, err
	}
	if !d.Allowed {
		return ExitDenied, nil
	}
	return ExitAllowed, nil
}

func offline(ctx context.Context, opts CheckOptions, params map[string]any, eval *rule.Engine) (rule.Decision, error) {
	objs, err := facts.LoadManifests(opts.Files...)
	if err != nil {
		return rule.Decision{}, err
	}
	var node *unstructured.Unstructured
	for _, o := range objs {
		if o.GetAPIVersion() == "v1" && o.GetKind() == "Node" && o.GetName() == opts.Node {
			node = o
		}
	}
	if node == nil {
		return rule.Decision{}, fmt.Errorf("node %q not found in %v", opts.Node, opts.Files)
	}
	infra, pools, err := eval.Kinds(params)
	if err != nil {
		return rule.Decision{}, err
	}
	// CRDs among the manifests add the kinds the contract finds, as the
	// informers do in a cluster: their objects are then all in the files.
	for _, o := range objs {
		if o.GroupVersionKind().GroupKind() != crdKind() {
			continue
		}
		if k, ok := facts.ContractKindOf(o); ok {
			switch gk := k.GVK.GroupKind(); {
			case k.Role == facts.InfraMachinePool && !slices.Contains(pools, gk):
				pools = append(pools, gk)
			case k.Role == facts.InfraMachine && !slices.Contains(infra, gk):
				infra = append(infra, gk)
			}
		}
	}
	inv, err := facts.FromObjects(eval.Model(), objs, infra, pools)
	if err != nil {
		return rule.Decision{}, err
	}
	synced := func() (machines, pooled []schema.GroupVersionKind) {
		for _, gk := range infra {
			machines = append(machines, gk.WithVersion(""))
		}
		for _, gk := range pools {
			pooled = append(pooled, gk.WithVersion(""))
		}
		return machines, pooled
	}
	g, err := guard.New(ctx, inv, guard.Options{Parameters: params, Engine: eval, SyncedKinds: synced})
	if err != nil {
		return rule.Decision{}, err
	}
	return g.Decide(ctx, request(opts, node))
}

func crdKind() schema.GroupKind {
	return schema.GroupKind{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition"}
}

func request(opts CheckOptions, node *unstructured.Unstructured) guard.Request {
	return guard.Request{
		Node:     node,
		Cluster:  opts.Cluster,
		UserInfo: authenticationv1.UserInfo{Username: opts.User, Groups: opts.Groups},
	}
}

func printCheck(out io.Writer, opts CheckOptions, d rule.Decision) error {
	if opts.Output == "json" {
		return writeJSON(out, "result", CheckResult{Node: opts.Node, Cluster: opts.Cluster, Decision: d})
	}
	switch {
	case d.Reason == rule.ReasonExempt:
		// The rule would deny it: the warning below says what was bypassed.
		fmt.Fprintf(out, "ALLOWED only because of an exemption: Node %q would be denied to anyone not exempt.\n", opts.Node)
	case d.Allowed:
		fmt.Fprintf(out, "ALLOWED: Node %q may be deleted: no InfraMachine linked to it still exists.\n", opts.Node)
	default:
		fmt.Fprintf(out, "DENIED: Node %q may not be deleted yet.\n", opts.Node)
	}
	for _, m := range d.Messages {
		fmt.Fprintf(out, "  - %s\n", m)
	}
	for _, w := range d.Warnings {
		fmt.Fprintf(out, "warning: %s\n", w)
	}
	return nil
}
