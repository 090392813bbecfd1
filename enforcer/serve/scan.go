package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/events"
	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/nodes"
	"github.com/nodeguard/nodeguard/enforcer/record"
	"github.com/nodeguard/nodeguard/enforcer/rule"
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
	// Interval is the period of the full pass over the Node caches
	// (--orphan-scan-interval), the safety net under judging what changed;
	// 0 turns the scan (and the gauge) off.
	Interval time.Duration
	// LeaseNamespace holds the leader-election Lease.
	LeaseNamespace string
	// KubeconfigRecheck is how often workload kubeconfig Secrets are read
	// again (0: kube.DefaultClusterRecheck).
	KubeconfigRecheck time.Duration
	// Ghosts configures ghost-Node detection, which the scan runs.
	Ghosts GhostOptions
}

// GhostOptions are the ghost-Node flags of `nodeguard serve`.
type GhostOptions struct {
	// Window is how long a providerID stays tombstoned after what carried
	// it went away (--ghost-window, default facts.DefaultTombstoneWindow); 0
	// turns ghost detection off.
	Window time.Duration
	// Max bounds the tombstones (--ghost-tombstones-max; 0:
	// facts.DefaultTombstoneMax).
	Max int
	// Protection is what is done about a ghost besides reporting it
	// (--ghost-protection: off, deny, taint; "" is off); a Cluster's
	// annotation nodeguard.io/ghost-protection sets its own.
	Protection nodes.Protection
}

// Enabled says whether ghosts are detected (the orphan scan must run too).
func (g GhostOptions) Enabled() bool { return g.Window > 0 }

// Defaults of the orphan flags.
const (
	DefaultOrphanScanInterval = 10 * time.Minute
	DefaultLeaseNamespace     = "nodeguard-system"
)

// LeaseNamespace is ns, else, when no flag names one, the pod's namespace
// (POD_NAMESPACE, set by the deployment), else nodeguard-system.
func LeaseNamespace(ns string) string {
	if ns != "" {
		return ns
	}
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	return DefaultLeaseNamespace
}

// releaseFlushInterval bounds how often the released Nodes of one workload
// cluster are written, and how long a verdict waits to be.
const releaseFlushInterval = 200 * time.Millisecond

// OrphanScan is the orphan scan of `nodeguard serve` and what it runs on.
type OrphanScan struct {
	// Management is the cluster nodeguard runs in; Kube its typed client
	// (Leases, Events, kubeconfig Secrets), required to reap or to scan
	// workload clusters; Nodes, when set, watches its Nodes (else
	// Management.Dynamic does). With Management.Config, Start makes both
	// when unset, and the workload clusters' clients take its rate limits.
	Management kube.Clients
	Kube       kubernetes.Interface
	Nodes      kubernetes.Interface
	Enforcer   *guard.Enforcer
	// Changes, when set, relays the inventory's changes from before the
	// scan started (guard.EnforcerOptions.OnChange); else the scan subscribes now.
	Changes *facts.Relay
	// Registry gets the scan's per-cluster gauges, and its counters unless
	// Metrics holds them already (serve.Register's).
	Registry prometheus.Registerer
	Metrics  *OrphanMetrics
	Options  ReapOptions
	// Sessions, when set, are the workload-cluster sessions the scan's Node
	// watches join (the caller runs them); else, with WorkloadClusters, the
	// scan runs sessions of its own.
	Sessions *WorkloadSessions
	// Releases has the scan judge the workload clusters' Nodes for release
	// too (mode admission-policy; Scanner.Releases publishes them), watching
	// them in every session; without WorkloadClusters they are never reaped.
	Releases bool
	// Events records OrphanNodeDeleted and GhostNode Events (nil: none).
	Events *events.Recorder
	// ReapLeader, when set, is this replica's part in the reaper's Lease
	// (else, reaping, the scan campaigns itself); ReleaseLeader, when set,
	// the fleet's, whose leader alone writes the releases.
	ReapLeader, ReleaseLeader *kube.Leader
	// DecisionLog, when set, gets the orphan, ghost and release verdicts
	// acted on.
	DecisionLog *rule.DecisionLog
	Log         *slog.Logger
}

// Start runs the scan until ctx is done: a reduced Node cache per cluster,
// judged as it and the inventory change, and the reaper when enabled.
func (o OrphanScan) Start(ctx context.Context) (*nodes.Scanner, error) {
	e, opts, log, c := o.Enforcer, o.Options, o.Log, o.Management
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if c.Config != nil {
		var err error
		if o.Kube == nil {
			if o.Kube, err = kubernetes.NewForConfig(c.Config); err != nil {
				return nil, fmt.Errorf("create client: %w", err)
			}
		}
		// The cluster's own Nodes, through the protobuf client (tests
		// without a config watch through the dynamic client).
		if o.Nodes == nil {
			if o.Nodes, err = kube.Protobuf(c.Config); err != nil {
				return nil, err
			}
		}
	}
	model := e.Inventory.Model()
	var info admission.PolicyInfo
	var verdicts []rule.Path
	if o.Releases {
		// The Node cache keeps the verdicts on the Nodes: written only where
		// they differ.
		var err error
		if info, err = admission.LoadPolicyInfo(); err != nil {
			return nil, fmt.Errorf("orphan scan: %w", err)
		}
		verdicts = info.VerdictPaths()
	}
	shape, err := facts.NodeShapeOf(e.Engine, verdicts...)
	if err != nil {
		return nil, fmt.Errorf("orphan scan: %w", err)
	}
	m := o.Metrics
	if m == nil {
		if m, err = registerOrphanMetrics(o.Registry); err != nil {
			return nil, err
		}
	}
	var scanner *nodes.Scanner
	sessions := o.Sessions // the scan's own, when it runs them, from below
	var store *facts.Tombstones
	var tracker *nodes.GhostTracker
	if opts.Ghosts.Enabled() {
		store = facts.NewTombstones(facts.TombstoneOptions{Window: opts.Ghosts.Window, Max: opts.Ghosts.Max, Metrics: m.Tombstones,
			Changed: func(pid string) { scanner.TombstoneChanged(pid) }})
		tracker = nodes.NewGhostTracker(nodes.GhostOptions{Protection: func(cluster string) nodes.Protection { return o.protection(sessions, cluster) },
			Metrics: m.Ghosts, DecisionLog: o.DecisionLog, Log: log})
	}
	evidence := guard.NewEvidence(model)
	finder, err := guard.NewFinder(guard.FinderOptions{Guard: e.Guard, Inventory: e.Inventory, Evidence: evidence,
		Grace: opts.Grace, MatchProviderID: opts.MatchProviderID, Tombstones: store})
	if err != nil {
		return nil, err
	}
	ropts := nodes.ReaperOptions{Finder: finder, Delete: opts.Enabled, DryRun: opts.DryRun, Log: log, Metrics: m.Reaper, DecisionLog: o.DecisionLog}
	mgmt := o.Kube
	if (opts.Enabled || opts.WorkloadClusters) && mgmt == nil {
		return nil, fmt.Errorf("reaping orphan Nodes needs a kubeconfig or in-cluster config")
	}
	self := nodes.ReapTarget{Nodes: c.Dynamic}
	if opts.Enabled || store != nil {
		// OrphanNodeDeleted and GhostNode Events.
		self.Recorder = o.Events.In("", nil)
	}
	if opts.Enabled {
		leader := o.ReapLeader
		if leader == nil {
			if leader, err = elect(ctx, mgmt, c.Dynamic, LeaseNamespace(opts.LeaseNamespace), reaperLease, "orphan reaper", log); err != nil {
				return nil, err
			}
		}
		ropts.IsLeader = leader.Leading
		ropts.Permitted = SwitchPermits(mgmt)
	}
	r, err := nodes.NewReaper(ropts)
	if err != nil {
		return nil, err
	}
	// A cache recovering from a broken watch may lack a new link: no Node
	// is judged an orphan, nor released, until it caught up.
	ready := caughtUp(e)
	var published *nodes.Publisher
	if o.Releases {
		var leading func() bool
		if o.ReleaseLeader != nil {
			leading = o.ReleaseLeader.Leading
		}
		if published, err = nodes.NewPublisher(nodes.PublisherOptions{Judge: finder.Releases, Ready: ready, Log: log, Metrics: m.Releases, Leading: leading, Info: info,
			DecisionLog: o.DecisionLog,
			Rejudge:     func(cluster string) { scanner.JudgeCluster(cluster) }}); err != nil {
			return nil, err
		}
	}
	scanner, err = nodes.NewScanner(nodes.ScanOptions{Finder: finder, Evidence: evidence, Reaper: r, Model: model,
		Ready: ready, SyncedKinds: e.Syncer.SyncedKinds, Interval: opts.Interval, Log: log, Metrics: m.Scan, Releases: published,
		Tombstones: store, Ghosts: tracker})
	if err != nil {
		return nil, err
	}
	if store != nil && c.Dynamic != nil {
		// Before the inventory's changes reach the store: those replayed
		// since the informers started end or add to what it held.
		keeper := &facts.TombstoneKeeper{Store: store, Client: c.Dynamic, Namespace: LeaseNamespace(opts.LeaseNamespace), Log: log}
		if err := keeper.Load(ctx); err != nil {
			// Ghost bookkeeping is not the delete rule: serve goes on,
			// detecting from what it sees, writing nothing over what it
			// could not read (nodeguard_tombstone_reads_unreadable_total).
			log.Error("ghost detection: the tombstones are not loaded; detecting from the deletions seen from now on, "+
				"writing none until they can be read (RBAC: the Role nodeguard-tombstones)", "error", err.Error())
		}
		go keeper.Run(ctx)
	}
	if err := o.Registry.Register(scanner); err != nil {
		return nil, fmt.Errorf("register orphan scan metrics: %w", err)
	}
	if o.Changes != nil {
		o.Changes.Connect(scanner.ObjectChanged)
	} else if err := e.Syncer.Subscribe(scanner.ObjectChanged); err != nil {
		return nil, err
	}
	watchErrors := &watchErrors{metrics: m.Clusters, log: log, last: map[string]time.Time{}}
	// A shard holds only its Clusters' objects: the management cluster's
	// own Nodes are for an install without a watch filter.
	if e.Shard == nil {
		if err := watchNodes(ctx, scanner, shape, "", o.Nodes, c.Dynamic, self, watchErrors, false); err != nil {
			return nil, err
		}
	}
	var own *WorkloadSessions // sessions the scan runs itself
	if opts.WorkloadClusters || o.Releases {
		if sessions == nil {
			if own, err = NewWorkloadSessions(c, mgmt, opts, FleetOptions{}, m.Clusters, log); err != nil {
				return nil, err
			}
			sessions = own
		}
		sessions.Add(func(ctx context.Context, cl *kube.Cluster) {
			t := nodes.ReapTarget{Nodes: cl.Dynamic, ObserveOnly: !opts.WorkloadClusters}
			if o.Events != nil && ((opts.Enabled && opts.WorkloadClusters) || store != nil) {
				t.Recorder = o.Events.In(cl.Key, cl.Events)
			}
			if err := watchNodes(ctx, scanner, shape, cl.Key, cl.Kube, cl.Dynamic, t, watchErrors, true); err != nil {
				log.Error("workload cluster: cannot watch its Nodes", "cluster", cl.Key, "error", err.Error())
			}
		}, scanner.RemoveCluster, nil)
	}
	log.Info("orphan node scan", "reap", opts.Enabled, "dryRun", opts.DryRun, "grace", finder.Grace().String(),
		"fullScanInterval", opts.Interval.String(), "workloadClusters", opts.WorkloadClusters, "matchProviderID", opts.MatchProviderID,
		"ghosts", store != nil, "ghostWindow", opts.Ghosts.Window.String(), "ghostProtection", opts.Ghosts.protection())
	if own != nil {
		go own.Run(ctx, log)
	}
	if published != nil {
		go published.Run(ctx, releaseFlushInterval)
	}
	go scanner.Run(ctx)
	return scanner, nil
}

// protection is a cluster's ghost protection: its Cluster's annotation, else
// the flag's.
func (o OrphanScan) protection(sessions *WorkloadSessions, cluster string) nodes.Protection {
	def := o.Options.Ghosts.protection()
	if cluster == "" || sessions == nil {
		return def
	}
	meta, ok := sessions.Set.Meta(cluster)
	if !ok {
		return def
	}
	p, err := nodes.ProtectionOf(meta.Annotations, def)
	if err != nil && o.Log != nil {
		o.Log.Warn("Cluster's ghost protection ignored", "cluster", cluster, "error", err.Error())
	}
	return p
}

func (g GhostOptions) protection() nodes.Protection {
	if g.Protection == "" {
		return nodes.ProtectionOff
	}
	return g.Protection
}

// OrphanMetrics are the counters of the orphan scan, the reaper, the
// workload-cluster sessions, the releases, the tombstones and the ghosts.
type OrphanMetrics struct {
	Reaper     *nodes.ReaperMetrics
	Scan       *nodes.ScanMetrics
	Clusters   *kube.ClusterMetrics
	Releases   *nodes.ReleaseMetrics
	Tombstones *facts.TombstoneMetrics
	Ghosts     *nodes.GhostMetrics
}

func registerOrphanMetrics(reg prometheus.Registerer) (*OrphanMetrics, error) {
	var err error
	m := &OrphanMetrics{
		Reaper:     register(&err, reg, nodes.NewReaperMetrics),
		Scan:       register(&err, reg, nodes.NewScanMetrics),
		Clusters:   register(&err, reg, kube.NewClusterMetrics),
		Releases:   register(&err, reg, nodes.NewReleaseMetrics),
		Tombstones: register(&err, reg, facts.NewTombstoneMetrics),
		Ghosts:     register(&err, reg, nodes.NewGhostMetrics),
	}
	if err != nil {
		return nil, err
	}
	return m, nil
}

// watchNodes caches a cluster's Nodes for the scanner until ctx is done; with
// wait, it returns only then (a workload session), else at once.
func watchNodes(ctx context.Context, scanner *nodes.Scanner, shape *record.Shape, cluster string,
	kube kubernetes.Interface, dyn dynamic.Interface, t nodes.ReapTarget, errs *watchErrors, wait bool) error {
	o := facts.NodeWatchOptions{Shape: shape, Kube: kube, Dynamic: dyn,
		OnChange: func(node string) { scanner.NodeChanged(cluster, node) },
		OnError:  func(err error) { errs.report(ctx, cluster, err) },
	}
	if p := scanner.Releases(); p != nil {
		o.Verdicts, o.OnVerdict = p.Verdicts(), func(node string) { scanner.VerdictChanged(cluster, node) }
	}
	w, err := facts.NewNodeWatch(o)
	if err != nil {
		return err
	}
	scanner.AddCluster(cluster, w, t)
	if wait {
		w.Run(ctx)
		return nil
	}
	go w.Run(ctx)
	return nil
}

// watchErrors counts every failed list or watch of a cluster's Nodes and
// logs at most one line per cluster per watchErrorLogEvery: an unreachable
// workload cluster costs client-go's bounded retries, a metric and a log
// line, nothing more.
type watchErrors struct {
	metrics *kube.ClusterMetrics
	log     *slog.Logger

	mu   sync.Mutex
	last map[string]time.Time
	n    map[string]int
}

const watchErrorLogEvery = 5 * time.Minute

func (w *watchErrors) report(ctx context.Context, cluster string, err error) {
	if ctx.Err() != nil {
		return // stopping: the watch ends by design
	}
	w.metrics.Failed(cluster, "watch")
	w.mu.Lock()
	if w.n == nil {
		w.n = map[string]int{}
	}
	w.n[cluster]++
	if time.Since(w.last[cluster]) < watchErrorLogEvery {
		w.mu.Unlock()
		return
	}
	n := w.n[cluster]
	w.last[cluster], w.n[cluster] = time.Now(), 0
	w.mu.Unlock()
	w.log.Error("orphan scan: cannot list or watch the Nodes of a cluster; retrying with backoff, its Nodes are not judged meanwhile",
		"cluster", cluster, "error", err.Error(), "failuresSinceLastLine", n)
}

// SwitchPermits is the one switch over every Node delete nodeguard makes:
// before each, in the management cluster or any workload cluster, it asks
// the management API server whether nodeguard may delete Nodes there,
// which only the reaper's ClusterRoleBinding (nodeguard-orphan-reaper)
// grants. Delete that binding and the next delete anywhere is refused.
func SwitchPermits(mgmt kubernetes.Interface) func(context.Context) error {
	return func(ctx context.Context) error {
		review, err := mgmt.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "delete", Resource: "nodes"}},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("ask the management cluster whether nodeguard may delete Nodes: %w", err)
		}
		if !review.Status.Allowed {
			return errors.New("the management cluster no longer lets nodeguard delete Nodes (the reaper's ClusterRoleBinding " +
				"nodeguard-orphan-reaper is gone): nodeguard deletes no Node in any cluster")
		}
		return nil
	}
}
