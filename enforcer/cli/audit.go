// This file implements `nodeguard audit`: for every CAPI Cluster (or
// one), each Node of its workload cluster and what a delete of it would get
// right now, as that Cluster's route judges it: a rollout preview before
// warn or deny, and a check that no Node is unverified or misrouted.

package cli

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"

	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// AuditOptions are the flags of `nodeguard audit`.
type AuditOptions struct {
	// Cluster, "namespace/name", audits that Cluster only; "" every one.
	Cluster             string
	Kubeconfig, Context string
	// Constraint is a Constraint file; "" the cluster's, as serve reads it.
	Constraint string
	// User is who the deletes are judged for (exemptions).
	User   string
	Groups []string
	Output string
	Bundle rule.BundleOptions
}

// AuditNode is one Node's verdict.
type AuditNode struct {
	Cluster  string   `json:"cluster"`
	Node     string   `json:"node"`
	Allowed  bool     `json:"allowed"`
	Reason   string   `json:"reason"`
	Blockers []string `json:"blockers,omitempty"`
	Messages []string `json:"messages,omitempty"`
}

// AuditCluster is one Cluster's audit: its Nodes, or why they could not be read.
type AuditCluster struct {
	Cluster string         `json:"cluster"`
	Nodes   []AuditNode    `json:"nodes"`
	Reasons map[string]int `json:"reasons"`
	Error   string         `json:"error,omitempty"`
}

// Audit audits and prints; the int is the exit code: 0, or 1 when a Cluster
// could not be audited (the others are printed).
func Audit(ctx context.Context, opts AuditOptions, out io.Writer) (int, error) {
	if err := checkOutput(opts.Output); err != nil {
		return 1, err
	}
	c, err := kube.Connect(opts.Kubeconfig, opts.Context)
	if err != nil {
		return 1, err
	}
	params, eval, err := loadPolicy(ctx, &c, opts.Constraint, opts.Bundle)
	if err != nil {
		return 1, err
	}
	keys, err := kube.ClusterKeys(ctx, c, opts.Cluster, "")
	if err != nil {
		return 1, err
	}
	// From the caches alone: an audit judges every Node, and a delete
	// re-reads its candidates fresh anyway.
	e, stop, err := startEnforcer(ctx, c, guard.EnforcerOptions{Parameters: params, Engine: eval, NoFreshReads: true})
	defer stop()
	if err != nil {
		return 1, err
	}
	user := authenticationv1.UserInfo{Username: opts.User, Groups: opts.Groups}
	results := make([]AuditCluster, 0, len(keys))
	code := 0
	for _, key := range keys {
		r := auditCluster(ctx, c, e.Guard, key, user)
		if r.Error != "" {
			code = 1
		}
		results = append(results, r)
	}
	if err := printAudit(out, opts.Output, results); err != nil {
		return 1, err
	}
	return code, nil
}

func auditCluster(ctx context.Context, c kube.Clients, g *guard.Guard, key string, user authenticationv1.UserInfo) AuditCluster {
	r := AuditCluster{Cluster: key, Nodes: []AuditNode{}, Reasons: map[string]int{}}
	nodes, err := kube.ClusterNodes(ctx, c.Config, key)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	list, err := listNodes(lctx, nodes)
	cancel()
	if err != nil {
		r.Error = fmt.Sprintf("list the Nodes of the workload cluster: %v", err)
		return r
	}
	for _, n := range list {
		d, err := g.Decide(ctx, guard.Request{Node: n, Cluster: key, UserInfo: user})
		if err != nil {
			d = rule.Denial(rule.ReasonError, err.Error())
		}
		v := AuditNode{Cluster: key, Node: n.GetName(), Allowed: d.Allowed, Reason: d.Reason, Messages: d.Messages}
		for _, b := range d.Blockers {
			v.Blockers = append(v.Blockers, fmt.Sprintf("%s %s/%s", b.Kind, b.Namespace, b.Name))
		}
		r.Nodes = append(r.Nodes, v)
		r.Reasons[d.Reason]++
	}
	return r
}

func printAudit(out io.Writer, format string, results []AuditCluster) error {
	if format == "json" {
		return writeJSON(out, "result", results)
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CLUSTER\tNODES\tA DELETE WOULD BE")
	for _, r := range results {
		if r.Error != "" {
			fmt.Fprintf(w, "%s\t-\tnot audited: %s\n", r.Cluster, r.Error)
			continue
		}
		fmt.Fprintf(w, "%s\t%d\t%s\n", r.Cluster, len(r.Nodes), summary(r))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "CLUSTER\tNODE\tVERDICT\tREASON\tBLOCKERS")
	for _, r := range results {
		for _, n := range r.Nodes {
			verdict := "denied"
			if n.Allowed {
				verdict = "allowed"
			}
			blockers := strings.Join(n.Blockers, ", ")
			if blockers == "" {
				blockers = "-"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", r.Cluster, n.Node, verdict, n.Reason, blockers)
		}
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("write result: %w", err)
	}
	return nil
}

// summary counts a Cluster's verdicts by reason, e.g. "denied: 3 blocked;
// allowed: 1 no-link".
func summary(r AuditCluster) string {
	var denied, allowed []string
	allowedReason := map[string]bool{}
	for _, n := range r.Nodes {
		allowedReason[n.Reason] = n.Allowed
	}
	for _, reason := range slices.Sorted(maps.Keys(r.Reasons)) {
		item := fmt.Sprintf("%d %s", r.Reasons[reason], reason)
		if allowedReason[reason] {
			allowed = append(allowed, item)
		} else {
			denied = append(denied, item)
		}
	}
	var parts []string
	if len(denied) > 0 {
		parts = append(parts, "denied: "+strings.Join(denied, ", "))
	}
	if len(allowed) > 0 {
		parts = append(parts, "allowed: "+strings.Join(allowed, ", "))
	}
	if len(parts) == 0 {
		return "(no Nodes)"
	}
	return strings.Join(parts, "; ")
}
