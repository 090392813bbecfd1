// Package clusters keeps clients for each Cluster API workload cluster, built
// from the kubeconfig Secret CAPI writes for it (<name>-kubeconfig, key
// value, in the Cluster's namespace), and runs whatever a caller wants run
// against that cluster (the orphan scan: a Node watch) for as long as the
// Cluster exists and its kubeconfig is unchanged. A new Cluster starts a
// session; a deleted Cluster or Secret stops it; a changed kubeconfig (a new
// digest) stops it and starts another. A Secret that cannot be read, or a
// kubeconfig that does not parse, is retried with a bounded backoff, counted
// and logged; an unreachable API server is the session's to retry. Other
// callers reuse a session's clients (Get), or build their own from the same
// Secrets through a Cache (the denial Events in workload clusters).
package clusters

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/nodeguard/nodeguard/enforcer/identity"
	"github.com/nodeguard/nodeguard/enforcer/kubeclient"
	"github.com/nodeguard/nodeguard/enforcer/registrar"
)

// ClusterKind is Cluster API's Cluster.
var ClusterKind = schema.GroupKind{Group: "cluster.x-k8s.io", Kind: "Cluster"}

// Cluster is one workload cluster's clients.
type Cluster struct {
	// Key is the Cluster's "namespace/name".
	Key string
	// Config is the kubeconfig's, with nodeguard's client rate limits.
	Config *rest.Config
	// Kube is a typed client that asks for protobuf (Nodes decode several
	// times faster than as JSON); Dynamic reads and deletes as JSON.
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
	// Identity, when the Set installs one (Options.Identity), is
	// nodeguard's own ServiceAccount there, which Config authenticates as;
	// a part refused as unauthorized or forbidden has it Repair.
	Identity *identity.Session
}

// Options configure a Set.
type Options struct {
	// Management is the management cluster: Clusters are watched through
	// Dynamic and Mapper, kubeconfig Secrets read (GET only) through Secrets.
	Management kubeclient.Clients
	Secrets    kubernetes.Interface
	// Recheck is how often every Cluster's Secret is read again, to see a
	// rotated kubeconfig (default DefaultRecheck); failures retry sooner,
	// from 1 s doubling up to Recheck.
	Recheck time.Duration
	// QPS and Burst are the workload clients' rate limits (0: kubeclient's).
	QPS   float32
	Burst int
	// Start runs a session against c until ctx is done, on a goroutine of
	// its own; it must return then, leaving nothing running.
	Start func(ctx context.Context, c *Cluster)
	// Stopped, when set, is called after a session of key has returned
	// (the Cluster or its Secret went, or the kubeconfig changed).
	Stopped func(key string)
	// Changed, when set, is called (it must not block) when a Cluster
	// appears, goes, or changes its Meta, and when its session starts or
	// stops.
	Changed func(key string)
	Log     *slog.Logger
	// Identity, when set, has each session run as nodeguard's own
	// ServiceAccount in the workload cluster (package identity), installed
	// with the kubeconfig's credentials when the session starts; a cluster
	// where that fails has no session, and the failure is retried.
	Identity *identity.Options
	// Metrics, when set, counts failures by cluster.
	Metrics *Metrics
}

// DefaultRecheck is how often kubeconfig Secrets are read again.
const DefaultRecheck = time.Minute

// Set runs one session per workload Cluster with a readable kubeconfig.
type Set struct {
	opts  Options
	queue workqueue.TypedRateLimitingInterface[string]
	// kubeconfigs builds a Cluster's clients once per kubeconfig: a session
	// runs on one kubeconfig, and a new one (a new *Cluster) replaces it.
	kubeconfigs *Cache[*Cluster]

	mu       sync.Mutex
	clusters map[string]Meta // Clusters that exist
	sessions map[string]*session
	failures map[string]error // why a Cluster has no session
}

// Meta is what the Set keeps of a Cluster: what says whether, and how, a
// caller acts on it.
type Meta struct {
	// APIVersion and UID name the Cluster object, for an Event on it.
	APIVersion string
	UID        types.UID
	Labels     map[string]string
	// Annotations holds only the keys under AnnotationPrefix: a Cluster's
	// other annotations (kubectl's last-applied configuration) can be large.
	Annotations map[string]string
	// Deleting is set once the Cluster has a deletionTimestamp.
	Deleting bool
}

// AnnotationPrefix starts the annotations of a Cluster that Meta keeps.
const AnnotationPrefix = "nodeguard.io/"

func (m Meta) equal(o Meta) bool {
	return m.Deleting == o.Deleting && m.UID == o.UID && maps.Equal(m.Labels, o.Labels) && maps.Equal(m.Annotations, o.Annotations)
}

type session struct {
	// source is the kubeconfig's Cluster the session was started from,
	// cluster what it runs with (source, or nodeguard's identity there).
	source  *Cluster
	cluster *Cluster
	cancel  context.CancelFunc
	done    chan struct{}
}

// New returns a Set; Run runs it.
func New(opts Options) (*Set, error) {
	if opts.Management.Dynamic == nil || opts.Management.Mapper == nil || opts.Secrets == nil || opts.Start == nil {
		return nil, errors.New("clusters: the management cluster's clients and a Start function are required")
	}
	if opts.Recheck <= 0 {
		opts.Recheck = DefaultRecheck
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	limiter := workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, opts.Recheck)
	s := &Set{
		opts:     opts,
		queue:    workqueue.NewTypedRateLimitingQueueWithConfig(limiter, workqueue.TypedRateLimitingQueueConfig[string]{}),
		clusters: map[string]Meta{},
		sessions: map[string]*session{},
		failures: map[string]error{},
	}
	s.kubeconfigs = NewCache(opts.Secrets, s.build)
	return s, nil
}

// Get returns the clients of a running session.
func (s *Set) Get(key string) (*Cluster, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss, ok := s.sessions[key]; ok {
		return ss.cluster, true
	}
	return nil, false
}

// Meta returns what the Set keeps of the Cluster key, and whether it exists.
func (s *Set) Meta(key string) (Meta, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.clusters[key]
	return m, ok
}

// Clusters returns every Cluster that exists, sorted.
func (s *Set) Clusters() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.clusters))
}

// Failure is why the Cluster key has no session (its kubeconfig Secret is
// missing, unreadable or invalid), or nil.
func (s *Set) Failure(key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failures[key]
}

// Keys returns the Clusters with a running session, sorted.
func (s *Set) Keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.sessions))
	for k := range s.sessions {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Run watches Clusters and runs their sessions until ctx is done; it returns
// once every session has stopped.
func (s *Set) Run(ctx context.Context) error {
	mapping, err := s.clusterResource(ctx)
	if err != nil {
		return err
	}
	factory := dynamicinformer.NewDynamicSharedInformerFactory(s.opts.Management.Dynamic, 0)
	informer := factory.ForResource(mapping.Resource).Informer()
	// Only the key and Meta are read: keep nothing else of a Cluster.
	if err := informer.SetTransform(reduce); err != nil {
		return fmt.Errorf("clusters: set transform: %w", err)
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { s.clusterEvent(obj, true) },
		// A Cluster's status changes often: only a changed Meta counts.
		UpdateFunc: func(_, obj any) { s.clusterEvent(obj, true) },
		DeleteFunc: func(obj any) { s.clusterEvent(obj, false) },
	}); err != nil {
		return fmt.Errorf("clusters: watch Clusters: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	go func() {
		<-ctx.Done()
		s.queue.ShutDown()
	}()
	go wait.Until(s.recheck, s.opts.Recheck, ctx.Done())
	for s.work(ctx) {
	}
	s.stopAll()
	return nil
}

// clusterRetry is how often Run looks for the Cluster resource while the API
// server does not serve it (Cluster API installed after nodeguard).
const clusterRetry = 30 * time.Second

// clusterResource finds the Cluster resource, waiting for it to be served.
func (s *Set) clusterResource(ctx context.Context) (*meta.RESTMapping, error) {
	logged := false
	for {
		mapping, err := s.opts.Management.Mapper.RESTMapping(ClusterKind)
		if err == nil {
			return mapping, nil
		}
		if r, ok := s.opts.Management.Mapper.(meta.ResettableRESTMapper); ok && meta.IsNoMatchError(err) {
			r.Reset()
		}
		if !logged {
			s.opts.Log.Error("workload clusters: the Cluster resource is not served; looking again every 30s", "error", err.Error())
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("clusters: find the Cluster resource: %w", err)
		case <-time.After(clusterRetry):
		}
	}
}

// reduce keeps of a Cluster its key and what Meta reads.
func reduce(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	out := &unstructured.Unstructured{}
	out.SetAPIVersion(u.GetAPIVersion())
	out.SetKind(u.GetKind())
	out.SetNamespace(u.GetNamespace())
	out.SetName(u.GetName())
	out.SetResourceVersion(u.GetResourceVersion())
	out.SetUID(u.GetUID())
	out.SetLabels(u.GetLabels())
	out.SetDeletionTimestamp(u.GetDeletionTimestamp())
	var kept map[string]string
	for k, v := range u.GetAnnotations() {
		if strings.HasPrefix(k, AnnotationPrefix) {
			if kept == nil {
				kept = map[string]string{}
			}
			kept[k] = v
		}
	}
	out.SetAnnotations(kept)
	return out, nil
}

func (s *Set) clusterEvent(obj any, exists bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return
	}
	key := m.GetNamespace() + "/" + m.GetName()
	meta := Meta{UID: m.GetUID(), Labels: m.GetLabels(), Annotations: m.GetAnnotations(), Deleting: m.GetDeletionTimestamp() != nil}
	if u, ok := obj.(*unstructured.Unstructured); ok {
		meta.APIVersion = u.GetAPIVersion()
	}
	s.mu.Lock()
	had, existed := s.clusters[key]
	if exists {
		s.clusters[key] = meta
	} else {
		delete(s.clusters, key)
	}
	s.mu.Unlock()
	if existed == exists && had.equal(meta) {
		return // a status update
	}
	s.queue.Add(key)
	s.changed(key)
}

func (s *Set) changed(key string) {
	if s.opts.Changed != nil {
		s.opts.Changed(key)
	}
}

// recheck queues every Cluster, to see rotated kubeconfigs.
func (s *Set) recheck() {
	s.mu.Lock()
	keys := make([]string, 0, len(s.clusters))
	for k := range s.clusters {
		keys = append(keys, k)
	}
	s.mu.Unlock()
	for _, k := range keys {
		s.queue.Add(k)
	}
}

func (s *Set) work(ctx context.Context) bool {
	key, shutdown := s.queue.Get()
	if shutdown {
		return false
	}
	defer s.queue.Done(key)
	err := s.reconcile(ctx, key)
	s.mu.Lock()
	before := s.failures[key]
	if err != nil && ctx.Err() == nil {
		s.failures[key] = err
	} else {
		delete(s.failures, key)
	}
	s.mu.Unlock()
	// A different failure is a change too: a missing Secret that appears
	// pointing at an API server that does not answer, say.
	if (before == nil) != (err == nil) || (before != nil && err != nil && before.Error() != err.Error()) {
		s.changed(key)
	}
	if err != nil {
		if ctx.Err() == nil {
			s.opts.Metrics.failed(key, "kubeconfig")
			s.opts.Log.Error("workload cluster: cannot build its clients; retrying", "cluster", key, "error", err.Error(),
				"failures", s.queue.NumRequeues(key)+1)
		}
		s.queue.AddRateLimited(key)
		return true
	}
	s.queue.Forget(key)
	return true
}

// reconcile makes the session of key match the Cluster and its Secret.
func (s *Set) reconcile(ctx context.Context, key string) error {
	s.mu.Lock()
	_, exists := s.clusters[key]
	s.mu.Unlock()
	if !exists {
		s.stop(key)
		s.kubeconfigs.Forget(key)
		s.opts.Metrics.forget(key)
		return nil
	}
	c, unanswered, err := s.kubeconfigs.get(ctx, key)
	if err != nil {
		// A session built from a kubeconfig that worked keeps running through
		// a management API hiccup, which says nothing about it; without a
		// kubeconfig (yet, or any more), or with one that does not build,
		// nothing can run against the cluster.
		if !unanswered {
			s.stop(key)
		}
		return err
	}
	s.mu.Lock()
	current, running := s.sessions[key]
	s.mu.Unlock()
	if running && current.source == c {
		return nil
	}
	s.stop(key)
	run := c
	if s.opts.Identity != nil {
		if run, err = s.identity(ctx, c); err != nil {
			return err
		}
	}
	s.start(ctx, c, run)
	return nil
}

// identity installs nodeguard's ServiceAccount in c's cluster and returns
// the clients that authenticate as it.
func (s *Set) identity(ctx context.Context, c *Cluster) (*Cluster, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	opts := *s.opts.Identity
	opts.Log = s.opts.Log.With("cluster", c.Key)
	id, err := identity.Ensure(ctx, c.Config, opts)
	if err != nil {
		return nil, fmt.Errorf("workload cluster %s: nodeguard's own identity: %w", c.Key, err)
	}
	run, err := s.build(c.Key, id.Config)
	if err != nil {
		return nil, err
	}
	run.Identity = id
	return run, nil
}

// build makes a Cluster's clients from its kubeconfig.
func (s *Set) build(key string, cfg *rest.Config) (*Cluster, error) {
	cfg.QPS, cfg.Burst = s.opts.QPS, s.opts.Burst
	clients, err := kubeclient.FromConfig(cfg)
	if err != nil {
		return nil, err
	}
	kube, err := kubeclient.Protobuf(clients.Config)
	if err != nil {
		return nil, err
	}
	return &Cluster{Key: key, Config: clients.Config, Kube: kube, Dynamic: clients.Dynamic}, nil
}

func (s *Set) start(ctx context.Context, source, c *Cluster) {
	ctx, cancel := context.WithCancel(ctx)
	ss := &session{source: source, cluster: c, cancel: cancel, done: make(chan struct{})}
	s.mu.Lock()
	s.sessions[c.Key] = ss
	s.mu.Unlock()
	s.opts.Metrics.running(c.Key, true)
	s.opts.Log.Info("workload cluster: session started", "cluster", c.Key, "server", c.Config.Host, "ownIdentity", c.Identity != nil)
	go func() {
		defer close(ss.done)
		s.opts.Start(ctx, c)
	}()
	s.changed(c.Key)
}

// stop ends the session of key, if any, and waits for it.
func (s *Set) stop(key string) {
	s.mu.Lock()
	ss, ok := s.sessions[key]
	delete(s.sessions, key)
	s.mu.Unlock()
	if !ok {
		return
	}
	ss.cancel()
	<-ss.done
	s.opts.Metrics.running(key, false)
	s.opts.Log.Info("workload cluster: session stopped", "cluster", key)
	if s.opts.Stopped != nil {
		s.opts.Stopped(key)
	}
	s.changed(key)
}

func (s *Set) stopAll() {
	for _, k := range s.Keys() {
		s.stop(k)
	}
}

// Metrics are the Set's Prometheus series.
type Metrics struct {
	errors   *prometheus.CounterVec
	sessions *prometheus.GaugeVec
}

// NewMetrics registers nodeguard_workload_cluster_errors_total{cluster,
// stage} and nodeguard_workload_cluster_session{cluster}.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	r := registrar.New(reg)
	m := &Metrics{
		errors: r.CounterVec("nodeguard_workload_cluster_errors_total",
			"Failures reaching a CAPI workload cluster, by cluster and stage: kubeconfig (its Secret missing, unreadable or invalid) or watch (its API server's list or watch failed).", "cluster", "stage"),
		sessions: r.GaugeVec("nodeguard_workload_cluster_session",
			"1 while nodeguard runs against a CAPI workload cluster with a working kubeconfig.", "cluster"),
	}
	if err := r.Err("workload cluster metrics"); err != nil {
		return nil, err
	}
	return m, nil
}

// Failed counts one failure of a cluster at a stage ("watch" for callers).
func (m *Metrics) Failed(cluster, stage string) { m.failed(cluster, stage) }

func (m *Metrics) failed(cluster, stage string) {
	if m != nil {
		m.errors.WithLabelValues(cluster, stage).Inc()
	}
}

// forget drops the series of a Cluster that is gone.
func (m *Metrics) forget(cluster string) {
	if m != nil {
		m.errors.DeletePartialMatch(prometheus.Labels{"cluster": cluster})
	}
}

func (m *Metrics) running(cluster string, on bool) {
	if m == nil {
		return
	}
	if on {
		m.sessions.WithLabelValues(cluster).Set(1)
		return
	}
	m.sessions.DeleteLabelValues(cluster)
}

// Errors is the failure counter, for tests.
func (m *Metrics) Errors() *prometheus.CounterVec { return m.errors }
