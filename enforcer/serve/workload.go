package serve

import (
	"context"
	"log/slog"
	"sync"

	"k8s.io/client-go/kubernetes"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/kube"
)

// WorkloadSessions is the one set of workload-cluster sessions serve runs:
// every part that works inside workload clusters (the orphan scan's Node
// watch, the fleet's configuration watch) adds itself before Run, and each
// cluster's session runs them all on one kubeconfig.
type WorkloadSessions struct {
	Set *kube.ClusterSet
	// Management is the management cluster's typed client the Set reads
	// kubeconfig Secrets with, for the parts' own reads and writes there.
	Management kubernetes.Interface

	mu      sync.Mutex
	starts  []func(context.Context, *kube.Cluster)
	stopped []func(string)
	changed []func(string)
}

// NewWorkloadSessions watches the Clusters of c; Secrets reads their
// kubeconfig Secrets. The clusters' clients take c.Config's rate limits
// (none: kube's). Every session runs as nodeguard's own ServiceAccount
// in its cluster (kube.EnsureIdentity), allowed Node deletes when the fleet
// (its proofs are dry-run deletes) or the reaper needs them, Node updates
// when ghost detection may taint, and what the fleet installs.
func NewWorkloadSessions(c kube.Clients, secrets kubernetes.Interface, opts ReapOptions, fleet FleetOptions, metrics *kube.ClusterMetrics,
	log *slog.Logger) (*WorkloadSessions, error) {
	w := &WorkloadSessions{Management: secrets}
	// Taint: a Cluster may set ghost protection taint by annotation at any
	// time, and the identity is installed once a session.
	id := &kube.IdentityOptions{Delete: fleet.Enabled || opts.Enabled, Taint: opts.Ghosts.Enabled() && opts.Interval > 0}
	if fleet.Enabled {
		id.Owns = admission.WebhookRules()
	}
	if fleet.Enabled && fleet.AdmissionPolicy {
		info, err := admission.LoadPolicyInfo()
		if err != nil {
			return nil, err
		}
		id.Owns = append(id.Owns, admission.PolicyRules(info)...)
	}
	so := kube.ClusterSetOptions{Management: c, Secrets: secrets, Recheck: opts.KubeconfigRecheck, Identity: id, Log: log, Metrics: metrics,
		Start: w.start, Stopped: w.stop, Changed: w.change, WatchFilter: fleet.WatchFilter}
	if c.Config != nil {
		so.QPS, so.Burst = c.Config.QPS, c.Config.Burst
	}
	set, err := kube.NewClusterSet(so)
	if err != nil {
		return nil, err
	}
	w.Set = set
	return w, nil
}

// Add registers a part: start runs in each session (until its ctx is done),
// stopped after a session ended, changed (it must not block) when a Cluster
// or its session changed. Any may be nil.
func (w *WorkloadSessions) Add(start func(context.Context, *kube.Cluster), stopped, changed func(string)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if start != nil {
		w.starts = append(w.starts, start)
	}
	if stopped != nil {
		w.stopped = append(w.stopped, stopped)
	}
	if changed != nil {
		w.changed = append(w.changed, changed)
	}
}

// Run runs the sessions until ctx is done, and returns once they stopped.
func (w *WorkloadSessions) Run(ctx context.Context, log *slog.Logger) {
	if err := w.Set.Run(ctx); err != nil && ctx.Err() == nil {
		log.Error("workload clusters: not watched", "error", err.Error())
	}
}

func (w *WorkloadSessions) start(ctx context.Context, c *kube.Cluster) {
	w.mu.Lock()
	starts := w.starts
	w.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range starts {
		wg.Go(func() { s(ctx, c) })
	}
	wg.Wait()
}

func (w *WorkloadSessions) stop(key string)   { w.tell(&w.stopped, key) }
func (w *WorkloadSessions) change(key string) { w.tell(&w.changed, key) }

// tell calls each function of the list fs points to with key.
func (w *WorkloadSessions) tell(fs *[]func(string), key string) {
	w.mu.Lock()
	list := *fs
	w.mu.Unlock()
	for _, f := range list {
		f(key)
	}
}
