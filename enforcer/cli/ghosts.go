// This file implements `nodeguard ghosts`: the tombstones nodeguard serve
// keeps, the Nodes that are ghosts now (in the cluster of the kubeconfig and
// in every CAPI Cluster's workload cluster) with the evidence, and, with
// Clear, the operator's way to end a tombstone.

package cli

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/nodes"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// Exit codes: a ghost found is worth a non-zero exit, as an unguarded
// Cluster is for `nodeguard clusters`.
const (
	ExitNone  = 0
	ExitGhost = 2
)

// GhostsOptions are the flags of `nodeguard ghosts`.
type GhostsOptions struct {
	// Cluster, "namespace/name", looks only at that CAPI Cluster's workload
	// cluster; "" at the cluster of the kubeconfig and every Cluster's.
	Cluster string
	// Namespace holds the tombstones' ConfigMap.
	Namespace           string
	Kubeconfig, Context string
	Constraint          string
	Output              string
	// Tombstones prints every tombstone too.
	Tombstones bool
	// Clear ends the tombstones of these providerIDs instead.
	Clear  []string
	Bundle rule.BundleOptions
}

// GhostReport is what -o json prints.
type GhostReport struct {
	Ghosts     []Ghost           `json:"ghosts"`
	Kept       []Ghost           `json:"kept"`
	Tombstones []facts.Tombstone `json:"tombstones"`
	// Errors are the workload clusters whose Nodes could not be read.
	Errors map[string]string `json:"errors,omitempty"`
}

// Ghost is one Node whose providerID is tombstoned: a ghost (Kept empty) or
// not, and why not.
type Ghost struct {
	Cluster    string          `json:"cluster"`
	Node       string          `json:"node"`
	ProviderID string          `json:"providerID"`
	Reason     string          `json:"reason,omitempty"`
	Kept       []string        `json:"kept,omitempty"`
	Tainted    bool            `json:"tainted"`
	Tombstone  facts.Tombstone `json:"tombstone"`
}

// Ghosts lists ghosts (or clears tombstones) and prints the report; the int is
// the exit code.
func Ghosts(ctx context.Context, opts GhostsOptions, out io.Writer) (int, error) {
	if err := checkOutput(opts.Output); err != nil {
		return ExitError, err
	}
	c, err := kube.Connect(opts.Kubeconfig, opts.Context)
	if err != nil {
		return ExitError, err
	}
	if len(opts.Clear) > 0 {
		return clear(ctx, c.Dynamic, opts, out)
	}
	params, eval, err := loadPolicy(ctx, &c, opts.Constraint, opts.Bundle)
	if err != nil {
		return ExitError, err
	}
	store, err := facts.LoadTombstones(ctx, c.Dynamic, opts.Namespace)
	if err != nil {
		return ExitError, err
	}
	report := GhostReport{Ghosts: []Ghost{}, Kept: []Ghost{}, Tombstones: store.List(), Errors: map[string]string{}}
	if store.Len() > 0 {
		if err := judgeGhost(ctx, c, opts, params, eval, store, &report); err != nil {
			return ExitError, err
		}
	}
	if err := printGhosts(out, opts, report); err != nil {
		return ExitError, err
	}
	switch {
	case len(report.Errors) > 0:
		return ExitError, nil
	case len(report.Ghosts) > 0:
		return ExitGhost, nil
	}
	return ExitNone, nil
}

// judgeGhost judges every Node with a tombstone, on fresh reads, in the cluster
// of the kubeconfig (unless opts.Cluster names one) and the workload
// clusters.
func judgeGhost(ctx context.Context, c kube.Clients, opts GhostsOptions, params map[string]any, eval *rule.Engine, store *facts.Tombstones, report *GhostReport) error {
	e, stop, err := startEnforcer(ctx, c, guard.EnforcerOptions{Parameters: params, Engine: eval})
	defer stop()
	if err != nil {
		return err
	}
	f, err := guard.NewFinder(guard.FinderOptions{Guard: e.Guard, Inventory: e.Inventory, Tombstones: store})
	if err != nil {
		return err
	}
	type source struct {
		cluster string
		nodes   dynamic.ResourceInterface
	}
	var sources []source
	if opts.Cluster == "" {
		sources = append(sources, source{nodes: c.Dynamic.Resource(guard.NodeGVR)})
	}
	keys, err := kube.ClusterKeys(ctx, c, opts.Cluster, "")
	if err != nil {
		return err
	}
	for _, key := range keys {
		nodes, err := kube.ClusterNodes(ctx, c.Config, key)
		if err != nil {
			report.Errors[key] = err.Error()
			continue
		}
		sources = append(sources, source{cluster: key, nodes: nodes})
	}
	now := time.Now()
	for _, s := range sources {
		list, err := listNodes(ctx, s.nodes)
		if err != nil {
			report.Errors[s.cluster] = fmt.Sprintf("list the Nodes: %v", err)
			continue
		}
		route, err := f.Route(s.cluster)
		if err != nil {
			return err
		}
		for _, n := range list {
			if f.Tombstone(n) == nil {
				continue
			}
			g, err := f.Ghost(ctx, route, n, now, true)
			if err != nil {
				return err
			}
			row := Ghost{Cluster: s.cluster, Node: g.Node, ProviderID: g.ProviderID, Reason: g.Reason, Kept: g.Kept,
				Tainted: tainted(n), Tombstone: *g.Tombstone}
			if g.Ghost {
				report.Ghosts = append(report.Ghosts, row)
			} else {
				report.Kept = append(report.Kept, row)
			}
		}
	}
	for _, rows := range [][]Ghost{report.Ghosts, report.Kept} {
		sort.Slice(rows, func(i, j int) bool { return rows[i].Cluster+"/"+rows[i].Node < rows[j].Cluster+"/"+rows[j].Node })
	}
	return nil
}

// tainted says whether nodeguard's taint is on the Node.
func tainted(n *unstructured.Unstructured) bool {
	taints, _, _ := unstructured.NestedSlice(n.Object, "spec", "taints")
	return slices.ContainsFunc(taints, func(x any) bool {
		m, _ := x.(map[string]any)
		return m["key"] == nodes.GhostTaintKey
	})
}

func clear(ctx context.Context, client dynamic.Interface, opts GhostsOptions, out io.Writer) (int, error) {
	found, err := facts.ClearTombstones(ctx, client, opts.Namespace, opts.Clear)
	if err != nil {
		return ExitError, err
	}
	for _, pid := range opts.Clear {
		if slices.Contains(found, pid) {
			fmt.Fprintf(out, "cleared: tombstone of providerID %q (nodeguard serve takes it at once; its Nodes are judged again).\n", pid)
		} else {
			fmt.Fprintf(out, "not found: no tombstone of providerID %q.\n", pid)
		}
	}
	return ExitNone, nil
}

func printGhosts(out io.Writer, opts GhostsOptions, r GhostReport) error {
	if opts.Output == "json" {
		return writeJSON(out, "report", r)
	}
	where := func(g Ghost) string {
		if g.Cluster == "" {
			return ""
		}
		return " in Cluster " + g.Cluster
	}
	for _, g := range r.Ghosts {
		taint := "not tainted"
		if g.Tainted {
			taint = "tainted " + nodes.GhostTaintKey
		}
		fmt.Fprintf(out, "GHOST: Node %q%s: %s (%s; tombstone until %s).\n", g.Node, where(g), g.Reason, taint, g.Tombstone.Until.Format(time.RFC3339))
	}
	for _, g := range r.Kept {
		fmt.Fprintf(out, "tombstoned, no ghost: Node %q%s: %s.\n", g.Node, where(g), strings.Join(g.Kept, "; "))
	}
	if opts.Tombstones {
		for _, t := range r.Tombstones {
			fmt.Fprintf(out, "tombstone: providerID %q: %s deleted at %s (Node %q, Cluster %q), until %s.\n", t.ProviderID, t.Object,
				t.DeletedAt.Format(time.RFC3339), t.Node, t.Cluster, t.Until.Format(time.RFC3339))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(r.Errors)) {
		fmt.Fprintf(out, "ERROR: Cluster %s: %s.\n", k, r.Errors[k])
	}
	fmt.Fprintf(out, "%d ghost Node(s), %d tombstone(s).\n", len(r.Ghosts), len(r.Tombstones))
	return nil
}
