package serve

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/google/uuid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"

	"github.com/nodeguard/nodeguard/enforcer/kubeclient"
	"github.com/nodeguard/nodeguard/enforcer/live"
	"github.com/nodeguard/nodeguard/enforcer/orphans"
	"github.com/nodeguard/nodeguard/enforcer/reaper"
)

// ReapOptions are the orphan-Node flags of `nodeguard serve`.
type ReapOptions struct {
	// Enabled deletes orphans (--reap-orphan-nodes); off, serve only counts
	// them in nodeguard_orphan_nodes.
	Enabled bool
	// Grace is --orphan-grace: how long a Node must have been not Ready, and
	// the least time between the two observations before a delete.
	Grace time.Duration
	// DryRun logs what would be deleted instead.
	DryRun bool
	// WorkloadClusters also reconciles the Nodes of every CAPI Cluster,
	// through its <name>-kubeconfig Secret.
	WorkloadClusters bool
	// MatchProviderID turns on the criteria's opt-in wider match.
	MatchProviderID bool
	// Interval between passes (--orphan-scan-interval); 0 turns the scan
	// (and the gauge) off.
	Interval time.Duration
	// LeaseNamespace holds the leader-election Lease.
	LeaseNamespace string
}

// Defaults of the orphan flags.
const (
	DefaultOrphanScanInterval = time.Minute
	DefaultLeaseNamespace     = "nodeguard-system"
)

// LeaseNamespace is the namespace for the Lease when no flag names one: the
// pod's (POD_NAMESPACE, set by the deployment), else nodeguard-system.
func LeaseNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	return DefaultLeaseNamespace
}

// startReaper runs the orphan scan (and, opted in, the reaper) in the
// background until ctx is done.
func startReaper(ctx context.Context, c kubeclient.Clients, e *live.Enforcer, metrics *reaper.Metrics, opts ReapOptions, log *slog.Logger) error {
	if opts.Interval <= 0 {
		if opts.Enabled {
			return fmt.Errorf("--reap-orphan-nodes needs a positive --orphan-scan-interval")
		}
		return nil
	}
	finder, err := orphans.NewFinder(ctx, orphans.Options{Guard: e.Guard, Inventory: e.Inventory, Grace: opts.Grace, MatchProviderID: opts.MatchProviderID})
	if err != nil {
		return err
	}
	ropts := reaper.Options{Finder: finder, Delete: opts.Enabled, DryRun: opts.DryRun, Log: log, Metrics: metrics}
	self := reaper.Target{Nodes: c.Dynamic}
	var mgmt kubernetes.Interface
	if opts.Enabled || opts.WorkloadClusters {
		if c.Config == nil {
			return fmt.Errorf("reaping orphan Nodes needs a kubeconfig or in-cluster config")
		}
		if mgmt, err = kubernetes.NewForConfig(c.Config); err != nil {
			return fmt.Errorf("create client: %w", err)
		}
	}
	if opts.Enabled {
		host, _ := os.Hostname()
		ns := opts.LeaseNamespace
		if ns == "" {
			ns = LeaseNamespace()
		}
		if ropts.IsLeader, err = reaper.Elect(ctx, reaper.LeaseOptions{Client: mgmt, Namespace: ns, Identity: host + "_" + uuid.NewString(), Log: log}); err != nil {
			return err
		}
		self.Recorder = recorder(ctx, mgmt)
	}
	r, err := reaper.New(ropts)
	if err != nil {
		return err
	}
	targets := func(context.Context) ([]reaper.Target, error) { return []reaper.Target{self}, nil }
	if opts.WorkloadClusters {
		w := &workloads{client: c, cache: newKubeconfigCache(mgmt, func(cfg *rest.Config) (reaper.Target, error) {
			return workloadTarget(ctx, cfg, opts.Enabled)
		})}
		targets = func(ctx context.Context) ([]reaper.Target, error) {
			ts, err := w.targets(ctx)
			return append([]reaper.Target{self}, ts...), err
		}
	}
	log.Info("orphan node scan", "reap", opts.Enabled, "dryRun", opts.DryRun, "grace", finder.Grace().String(),
		"interval", opts.Interval.String(), "workloadClusters", opts.WorkloadClusters, "matchProviderID", opts.MatchProviderID)
	go func() {
		// A pass over an unsynced inventory would fail (Guard.Objects refuses).
		if err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(context.Context) (bool, error) {
			return e.Syncer.Ready() == nil, nil
		}); err != nil {
			return
		}
		r.Run(ctx, opts.Interval, targets)
	}()
	return nil
}

// recorder records Events through the events.k8s.io API of one cluster.
func recorder(ctx context.Context, client kubernetes.Interface) events.EventRecorder {
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	_ = b.StartRecordingToSinkWithContext(ctx) // errors only when started twice
	return b.NewRecorder(scheme.Scheme, "nodeguard")
}

// workloads lists the CAPI Clusters and keeps reaper Targets for them.
type workloads struct {
	client kubeclient.Clients
	cache  *kubeconfigCache[reaper.Target]
}

// targets lists the CAPI Clusters and returns one Target per Cluster whose
// kubeconfig could be read; the others are skipped with an error.
func (w *workloads) targets(ctx context.Context) ([]reaper.Target, error) {
	mapping, err := w.client.Mapper.RESTMapping(clusterGVK().GroupKind())
	if err != nil {
		return nil, fmt.Errorf("find the Cluster resource: %w", err)
	}
	list, err := w.client.Dynamic.Resource(mapping.Resource).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Clusters: %w", err)
	}
	var out []reaper.Target
	var errs []error
	for _, cl := range list.Items {
		name := cl.GetNamespace() + "/" + cl.GetName()
		t, err := w.target(ctx, name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, t)
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("workload clusters: %v", errs)
	}
	return out, nil
}

func (w *workloads) target(ctx context.Context, cluster string) (reaper.Target, error) {
	t, err := w.cache.get(ctx, cluster)
	t.Cluster = cluster
	return t, err
}

// workloadTarget builds the clients of one workload cluster's Target; with
// events, a recorder that lives as long as ctx (a rotated kubeconfig leaves
// the old broadcaster idle, which is cheap).
func workloadTarget(ctx context.Context, cfg *rest.Config, events bool) (reaper.Target, error) {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return reaper.Target{}, err
	}
	t := reaper.Target{Nodes: dyn}
	if events {
		typed, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return reaper.Target{}, err
		}
		t.Recorder = recorder(ctx, typed)
	}
	return t, nil
}
