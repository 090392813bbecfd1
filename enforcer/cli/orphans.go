// This file implements `nodeguard orphans`: the orphan Nodes of -f files or
// of the live cluster, judged by the orphan criteria (guard.Finder), and
// with --delete deleted as the reaper deletes them (nodes.DeleteNode).

package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	ngnodes "github.com/nodeguard/nodeguard/enforcer/nodes"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// Exit codes of `nodeguard orphans`: finding orphans is not an error.
const ExitOK = 0

// OrphansOptions are the flags of `nodeguard orphans`.
type OrphansOptions struct {
	Files           []string
	Cluster         string
	Grace           time.Duration
	Now             string
	MatchProviderID bool
	Delete          bool
	Constraint      string
	Output          string
	Kubeconfig      string
	Context         string
	// Namespace holds nodeguard's tombstones (live): a ghost is never an
	// orphan, so --delete never deletes one.
	Namespace string
	// Bundle, when its Path is set, is the signed policy bundle to judge
	// with instead of the embedded rule, as serve --bundle's reaper does.
	Bundle rule.BundleOptions
}

// OrphanReport is what -o json prints.
type OrphanReport struct {
	Orphans []Orphan `json:"orphans"`
	Kept    []Kept   `json:"kept"`
	Deleted []string `json:"deleted,omitempty"`
}

// Orphan is one orphan Node in a Report.
type Orphan struct {
	Node          string `json:"node"`
	Cluster       string `json:"cluster"`
	Machine       string `json:"machine"`
	NotReadySince string `json:"notReadySince"`
	Reason        string `json:"reason"`
}

// Kept is a CAPI-managed Node that is not an orphan, and why.
type Kept struct {
	Node string `json:"node"`
	Why  string `json:"why"`
}

// Orphans lists (and with Delete, deletes) orphan Nodes and prints the report;
// the int is the exit code.
func Orphans(ctx context.Context, opts OrphansOptions, out io.Writer) (int, error) {
	if err := checkOutput(opts.Output); err != nil {
		return ExitError, err
	}
	if opts.Delete && len(opts.Files) > 0 {
		return ExitError, fmt.Errorf("--delete works on a live cluster only, not on -f files")
	}
	if opts.Delete && opts.Now != "" {
		return ExitError, fmt.Errorf("--delete judges at the real time; drop --now")
	}
	now := time.Now()
	if opts.Now != "" {
		t, err := time.Parse(time.RFC3339, opts.Now)
		if err != nil {
			return ExitError, fmt.Errorf("--now %q: want RFC 3339: %w", opts.Now, err)
		}
		now = t
	}
	// The policy is chosen here, once: the bundle's or the embedded rule.
	params, eval, err := loadPolicy(ctx, nil, opts.Constraint, opts.Bundle)
	if err != nil {
		return ExitError, err
	}
	var report OrphanReport
	if len(opts.Files) > 0 {
		report, err = orphansOffline(ctx, opts, params, eval, now)
	} else {
		report, err = runLive(ctx, opts, params, eval, now)
	}
	if err != nil {
		return ExitError, err
	}
	if err := printOrphans(out, opts, report); err != nil {
		return ExitError, err
	}
	return ExitOK, nil
}

func orphansOffline(ctx context.Context, opts OrphansOptions, params map[string]any, eval *rule.Engine, now time.Time) (OrphanReport, error) {
	objs, err := facts.LoadManifests(opts.Files...)
	if err != nil {
		return OrphanReport{}, err
	}
	var nodes []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetAPIVersion() == "v1" && o.GetKind() == "Node" {
			nodes = append(nodes, o)
		}
	}
	infra, pools, err := eval.Kinds(params)
	if err != nil {
		return OrphanReport{}, err
	}
	inv, err := facts.FromObjects(eval.Model(), objs, infra, pools)
	if err != nil {
		return OrphanReport{}, err
	}
	g, err := guard.New(ctx, inv, guard.Options{Parameters: params, Engine: eval})
	if err != nil {
		return OrphanReport{}, err
	}
	f, err := guard.NewFinder(guard.FinderOptions{Guard: g, Inventory: inv, Grace: opts.Grace, MatchProviderID: opts.MatchProviderID})
	if err != nil {
		return OrphanReport{}, err
	}
	verdicts, err := f.Judge(ctx, nodes, opts.Cluster, now)
	if err != nil {
		return OrphanReport{}, err
	}
	return NewOrphanReport(verdicts), nil
}

func runLive(ctx context.Context, opts OrphansOptions, params map[string]any, eval *rule.Engine, now time.Time) (OrphanReport, error) {
	c, err := kube.Connect(opts.Kubeconfig, opts.Context)
	if err != nil {
		return OrphanReport{}, err
	}
	if params, err = liveParameters(ctx, c, opts.Constraint, params); err != nil {
		return OrphanReport{}, err
	}
	return runLiveWith(ctx, c, opts, params, eval, now)
}

func runLiveWith(ctx context.Context, c kube.Clients, opts OrphansOptions, params map[string]any, eval *rule.Engine, now time.Time) (OrphanReport, error) {
	e, stop, err := startEnforcer(ctx, c, guard.EnforcerOptions{Parameters: params, Engine: eval})
	defer stop()
	if err != nil {
		return OrphanReport{}, err
	}
	stones, err := facts.LoadTombstones(ctx, c.Dynamic, opts.Namespace)
	if err != nil {
		return OrphanReport{}, err
	}
	f, err := guard.NewFinder(guard.FinderOptions{Guard: e.Guard, Inventory: e.Inventory, Grace: opts.Grace, MatchProviderID: opts.MatchProviderID,
		Tombstones: stones})
	if err != nil {
		return OrphanReport{}, err
	}
	nodes, err := listNodes(ctx, c.Dynamic.Resource(guard.NodeGVR))
	if err != nil {
		return OrphanReport{}, fmt.Errorf("list nodes: %w", err)
	}
	verdicts, err := f.Judge(ctx, nodes, opts.Cluster, now)
	if err != nil {
		return OrphanReport{}, err
	}
	report := NewOrphanReport(verdicts)
	if opts.Delete {
		for _, v := range verdicts {
			if !v.Orphan {
				continue
			}
			if err := ngnodes.DeleteNode(ctx, c.Dynamic, v); err != nil {
				return report, err
			}
			report.Deleted = append(report.Deleted, v.Node)
		}
	}
	return report, nil
}

// listNodes reads every Node there, sorted by name.
func listNodes(ctx context.Context, nodes dynamic.ResourceInterface) ([]*unstructured.Unstructured, error) {
	list, err := nodes.List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := make([]*unstructured.Unstructured, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, &list.Items[i])
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetName() < out[j].GetName() })
	return out, nil
}

// NewOrphanReport sorts verdicts into orphans and the CAPI-managed Nodes kept.
func NewOrphanReport(verdicts []guard.OrphanVerdict) OrphanReport {
	r := OrphanReport{Orphans: []Orphan{}, Kept: []Kept{}}
	for _, v := range verdicts {
		switch {
		case v.Orphan:
			r.Orphans = append(r.Orphans, Orphan{Node: v.Node, Cluster: v.Cluster, Machine: v.Machine, NotReadySince: v.NotReadySince, Reason: v.Reason})
		case v.Managed:
			r.Kept = append(r.Kept, Kept{Node: v.Node, Why: strings.Join(v.Kept, "; ")})
		}
	}
	return r
}

func printOrphans(out io.Writer, opts OrphansOptions, r OrphanReport) error {
	if opts.Output == "json" {
		return writeJSON(out, "report", r)
	}
	for _, o := range r.Orphans {
		fmt.Fprintf(out, "ORPHAN: Node %q: %s.\n", o.Node, o.Reason)
	}
	for _, k := range r.Kept {
		fmt.Fprintf(out, "kept: Node %q: %s.\n", k.Node, k.Why)
	}
	for _, d := range r.Deleted {
		fmt.Fprintf(out, "DELETED: Node %q.\n", d)
	}
	fmt.Fprintf(out, "%d orphan Node(s), %d CAPI-managed Node(s) kept.\n", len(r.Orphans), len(r.Kept))
	return nil
}
