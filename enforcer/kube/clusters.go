// This file holds the one way nodeguard reaches a Cluster API workload
// cluster, as Cluster API's clustercache is its own: one connection per
// Cluster, built from the kubeconfig Secret CAPI writes for it
// (<name>-kubeconfig, key value, in the Cluster's namespace), running as
// nodeguard's own identity there (EnsureIdentity), health-checked, and
// kept for as long as the Cluster exists and its kubeconfig is unchanged.
//
// A new Cluster connects; a deleted Cluster or Secret disconnects; a changed
// kubeconfig (a new digest) reconnects. Each connection is probed on a
// schedule of its own (a GET of /readyz every 30 s) and at once when any
// request or watch made through it fails, and whoever depends on the
// cluster is told (Changed) the moment it turns unreachable or reachable
// again. A Secret that cannot be read, or a kubeconfig that does not parse,
// is retried with a bounded backoff, counted and logged.
//
// The parts that work inside workload clusters (the fleet's configuration
// watch, the orphan scan's Node watch, the releases, nodeguard's Events
// there) run as the connection's sessions (ClusterSetOptions.Start); the commands that
// reach a workload cluster once use ConnectCluster, the same way from kubeconfig to
// client. One loop (kube.Loop) reconciles every Cluster: its connection, its
// Secret read again every Recheck, its next probe.

package kube

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	eventsv1client "k8s.io/client-go/kubernetes/typed/events/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/nodeguard/nodeguard/enforcer/metrics"
)

// ClusterKind is Cluster API's Cluster.
var ClusterKind = schema.GroupKind{Group: "cluster.x-k8s.io", Kind: "Cluster"}

// WatchFilterLabel is Cluster API's label that splits a fleet between
// controllers started with --watch-filter: each acts only on objects
// carrying its value.
const WatchFilterLabel = "cluster.x-k8s.io/watch-filter"

// Cluster is one workload cluster's connection.
type Cluster struct {
	// Key is the Cluster's "namespace/name".
	Key string
	// Config authenticates as nodeguard's own identity there (Identity), or
	// with the kubeconfig's credentials when the ClusterSet installs none, at
	// nodeguard's client rate limits.
	Config *rest.Config
	// Kube is a typed client that asks for protobuf (Nodes decode several
	// times faster than as JSON); Dynamic reads and writes as JSON.
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
	// Events writes Events there, at rate limits of their own (Options).
	Events eventsv1client.EventsV1Interface
	// Admin writes with the kubeconfig's credentials (CAPI's admin): only
	// for what nodeguard's identity may not do, such as removing what a
	// configuration with more grants installed there.
	Admin dynamic.Interface
	// Identity, when the ClusterSet installs one (ClusterSetOptions.Identity), is
	// nodeguard's own ServiceAccount there, which Config authenticates as;
	// a part refused as unauthorized or forbidden has it Repair.
	Identity *IdentitySession
}

// ClusterSetOptions configure a ClusterSet.
type ClusterSetOptions struct {
	// Management is the management cluster: Clusters are watched through
	// Dynamic and Mapper, kubeconfig Secrets read (GET only) through Secrets.
	Management Clients
	Secrets    kubernetes.Interface
	// Recheck is how often every Cluster's Secret is read again, to see a
	// rotated kubeconfig (default DefaultClusterRecheck); failures retry sooner,
	// from 1 s doubling up to Recheck.
	Recheck time.Duration
	// ProbeInterval and ProbeTimeout schedule the health checks (defaults
	// DefaultProbeInterval and DefaultProbeTimeout); an unreachable cluster
	// is probed every UnreachableProbeInterval (default
	// DefaultUnreachableProbeInterval), so its return is seen soon.
	ProbeInterval, ProbeTimeout, UnreachableProbeInterval time.Duration
	// QPS and Burst are the workload clients' rate limits (0: kube.Connect's);
	// EventsQPS and EventsBurst the Events' (0: 10 and 50), apart, so writing
	// Events never takes a request the work needs.
	QPS         float32
	Burst       int
	EventsQPS   float32
	EventsBurst int
	// Workers connect and probe that many clusters at once (default 16): an
	// unreachable cluster holds one for up to ProbeTimeout.
	Workers int
	// Start runs a session against c until ctx is done, on a goroutine of
	// its own; it must return then, leaving nothing running.
	Start func(ctx context.Context, c *Cluster)
	// Stopped, when set, is called after a session of key has returned
	// (the Cluster or its Secret went, or the kubeconfig changed).
	Stopped func(key string)
	// Changed, when set, is called (it must not block) when a Cluster
	// appears, goes, or changes its Meta, when its connection starts, stops
	// or fails otherwise, and when it turns reachable or unreachable.
	Changed func(key string)
	Log     *slog.Logger
	// Identity, when set, has each connection run as nodeguard's own
	// ServiceAccount in the workload cluster (EnsureIdentity), installed
	// with the kubeconfig's credentials when it starts; a cluster where that
	// fails has no connection, and the failure is retried.
	Identity *IdentityOptions
	// Metrics, when set, counts failures and probes.
	Metrics *ClusterMetrics
	// WatchFilter, when set, keeps only the Clusters labelled
	// WatchFilterLabel with this value: the server filters the watch.
	WatchFilter string
}

// DefaultClusterRecheck is how often kubeconfig Secrets are read again.
const DefaultClusterRecheck = time.Minute

// ClusterSet keeps one connection per workload Cluster with a readable kubeconfig.
type ClusterSet struct {
	opts ClusterSetOptions
	loop *Loop[string]

	mu        sync.Mutex
	listed    bool                   // the Clusters' informer synced
	clusters  map[string]ClusterMeta // Clusters that exist
	conns     map[string]*conn
	failures  map[string]failure   // why a Cluster has no connection, and since when
	secretDue map[string]time.Time // when its Secret is read next (absent: now)
}

type failure struct {
	err   error
	since time.Time
}

// ClusterMeta is what the ClusterSet keeps of a Cluster: what says whether, and how, a
// caller acts on it.
type ClusterMeta struct {
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

func (m ClusterMeta) equal(o ClusterMeta) bool {
	return m.Deleting == o.Deleting && m.UID == o.UID && maps.Equal(m.Labels, o.Labels) && maps.Equal(m.Annotations, o.Annotations)
}

// conn is one running connection and its session.
type conn struct {
	digest  [sha256.Size]byte // of the kubeconfig it was built from
	cluster *Cluster
	cancel  context.CancelFunc
	done    chan struct{}

	// Guarded by the ClusterSet's mu.
	health    ClusterHealth
	lastProbe time.Time
	suspected bool // a request or watch failed since the last probe
}

// NewClusterSet returns a ClusterSet; Run runs it.
func NewClusterSet(opts ClusterSetOptions) (*ClusterSet, error) {
	if opts.Management.Dynamic == nil || opts.Management.Mapper == nil || opts.Secrets == nil || opts.Start == nil {
		return nil, errors.New("clusters: the management cluster's clients and a Start function are required")
	}
	SetDefault(&opts.Recheck, DefaultClusterRecheck)
	SetDefault(&opts.ProbeInterval, DefaultProbeInterval)
	SetDefault(&opts.ProbeTimeout, DefaultProbeTimeout)
	SetDefault(&opts.UnreachableProbeInterval, DefaultUnreachableProbeInterval)
	if opts.EventsQPS <= 0 {
		opts.EventsQPS, opts.EventsBurst = 10, 50
	}
	SetDefault(&opts.Workers, 16)
	opts.Log = cmp.Or(opts.Log, slog.New(slog.DiscardHandler))
	s := &ClusterSet{
		opts:      opts,
		clusters:  map[string]ClusterMeta{},
		conns:     map[string]*conn{},
		failures:  map[string]failure{},
		secretDue: map[string]time.Time{},
	}
	s.loop = NewLoop(LoopOptions{Name: "workload-clusters", Workers: opts.Workers, BaseBackoff: defaultProbeBackoffBase,
		MaxBackoff: opts.Recheck}, s.reconcile)
	return s, nil
}

// Get returns the connection of the Cluster key, when it has one.
func (s *ClusterSet) Get(key string) (*Cluster, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.conns[key]; ok {
		return c.cluster, true
	}
	return nil, false
}

// Await returns the connection of the Cluster key, waiting up to wait for a
// Cluster that is being connected: a caller that runs first thing after a
// start, or right after a Cluster appeared (CAPI writes its kubeconfig
// Secret after the Cluster), gets the connection rather than a miss. A
// failure that has lasted wait already is returned at once, so a cluster
// that stays unreachable costs its callers no wait.
func (s *ClusterSet) Await(ctx context.Context, key string, wait time.Duration) (*Cluster, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		s.mu.Lock()
		c, connected := s.conns[key]
		_, exists := s.clusters[key]
		f, listed := s.failures[key], s.listed
		s.mu.Unlock()
		switch {
		case connected:
			return c.cluster, nil
		case f.err != nil && time.Since(f.since) >= wait:
			return nil, f.err
		case !exists && listed:
			return nil, fmt.Errorf("no Cluster %s", key)
		}
		select {
		case <-ctx.Done():
			if f.err != nil {
				return nil, f.err
			}
			return nil, fmt.Errorf("no connection to workload cluster %s yet", key)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Health says whether the Cluster key's API server answers, as its
// connection last found.
func (s *ClusterSet) Health(key string) ClusterHealth {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.conns[key]; ok {
		return c.health
	}
	return ClusterHealth{}
}

// Meta returns what the ClusterSet keeps of the Cluster key, and whether it exists.
func (s *ClusterSet) Meta(key string) (ClusterMeta, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.clusters[key]
	return m, ok
}

// Clusters returns every Cluster that exists, sorted.
func (s *ClusterSet) Clusters() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.clusters))
}

// Failure is why the Cluster key has no connection (its kubeconfig Secret
// is missing, unreadable or invalid, or nodeguard's identity could not be
// installed there), or nil.
func (s *ClusterSet) Failure(key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failures[key].err
}

// Keys returns the Clusters with a connection, sorted.
func (s *ClusterSet) Keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.conns))
}

// Run watches Clusters and keeps their connections until ctx is done; it
// returns once every session has stopped.
func (s *ClusterSet) Run(ctx context.Context) error {
	mapping, err := s.clusterResource(ctx)
	if err != nil {
		return err
	}
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(s.opts.Management.Dynamic, 0, metav1.NamespaceAll,
		func(o *metav1.ListOptions) {
			if s.opts.WatchFilter != "" {
				o.LabelSelector = WatchFilterLabel + "=" + s.opts.WatchFilter
			}
		})
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
		if cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
			s.mu.Lock()
			s.listed = true
			s.mu.Unlock()
		}
	}()
	s.loop.Run(ctx)
	for _, k := range s.Keys() {
		s.disconnect(k)
	}
	return nil
}

// clusterRetry is how often Run looks for the Cluster resource while the API
// server does not serve it (Cluster API installed after nodeguard).
const clusterRetry = 30 * time.Second

// clusterResource finds the Cluster resource, waiting for it to be served.
func (s *ClusterSet) clusterResource(ctx context.Context) (*meta.RESTMapping, error) {
	logged := false
	for {
		mapping, err := RESTMapping(s.opts.Management.Mapper, ClusterKind)
		if err == nil {
			return mapping, nil
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
	kept := maps.Clone(u.GetAnnotations())
	maps.DeleteFunc(kept, func(k, _ string) bool { return !strings.HasPrefix(k, AnnotationPrefix) })
	out.SetAnnotations(kept)
	return out, nil
}

func (s *ClusterSet) clusterEvent(obj any, exists bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return
	}
	key := m.GetNamespace() + "/" + m.GetName()
	meta := ClusterMeta{UID: m.GetUID(), Labels: m.GetLabels(), Annotations: m.GetAnnotations(), Deleting: m.GetDeletionTimestamp() != nil}
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
	if existed != exists {
		delete(s.secretDue, key) // a new Cluster's Secret is read at once
	}
	s.mu.Unlock()
	if existed == exists && had.equal(meta) {
		return // a status update
	}
	s.loop.Add(key)
	s.changed(key)
}

func (s *ClusterSet) changed(key string) {
	if s.opts.Changed != nil {
		s.opts.Changed(key)
	}
}

// reconcile keeps the connection of key as its Cluster and Secret say, and
// probes it when a probe is due; it asks to be run again when the next
// Secret read or probe is.
func (s *ClusterSet) reconcile(ctx context.Context, key string) Result {
	s.mu.Lock()
	_, exists := s.clusters[key]
	due, read := s.secretDue[key]
	_, connected := s.conns[key]
	s.mu.Unlock()
	if !exists {
		s.disconnect(key)
		s.mu.Lock()
		delete(s.failures, key)
		delete(s.secretDue, key)
		s.mu.Unlock()
		s.opts.Metrics.forget(key)
		return Result{}
	}
	now := time.Now()
	if !read || !now.Before(due) || !connected {
		err := s.connect(ctx, key)
		s.setFailure(ctx, key, err)
		if err != nil && ctx.Err() == nil {
			s.opts.Metrics.Failed(key, "kubeconfig")
			s.opts.Log.Error("workload cluster: cannot connect; retrying", "cluster", key, "error", err.Error(),
				"failures", s.loop.Failures(key)+1)
		}
		s.mu.Lock()
		_, connected = s.conns[key]
		if err == nil || connected {
			// A connection that worked keeps running through a management
			// API hiccup, which says nothing about it: read again soon.
			next := s.opts.Recheck
			if err != nil {
				next = min(s.opts.Recheck, 10*time.Second)
			}
			s.secretDue[key] = now.Add(next)
		}
		s.mu.Unlock()
		if !connected {
			return Result{Retry: ctx.Err() == nil}
		}
	}
	next := s.probe(ctx, key)
	s.mu.Lock()
	secret := s.secretDue[key]
	s.mu.Unlock()
	return Result{After: max(time.Millisecond, min(time.Until(secret), next))}
}

// setFailure records why key has no connection (nil: it has one, or the
// failure is gone); a different failure is a change too: a missing Secret
// that appears pointing at an API server that does not answer, say.
func (s *ClusterSet) setFailure(ctx context.Context, key string, err error) {
	if ctx.Err() != nil {
		err = nil
	}
	s.mu.Lock()
	was := s.failures[key]
	before := was.err
	if err == nil {
		delete(s.failures, key)
	} else if before == nil {
		s.failures[key] = failure{err, time.Now()}
	} else {
		s.failures[key] = failure{err, was.since}
	}
	s.mu.Unlock()
	if (before == nil) != (err == nil) || (before != nil && err != nil && before.Error() != err.Error()) {
		s.changed(key)
	}
}

// connect reads the Cluster's kubeconfig and (re)starts its connection when
// there is none or the kubeconfig changed.
func (s *ClusterSet) connect(ctx context.Context, key string) error {
	kubeconfig, err := ReadKubeconfig(ctx, s.opts.Secrets, key)
	if err != nil {
		if !unanswered(err) {
			s.disconnect(key)
		}
		return err
	}
	digest := sha256.Sum256(kubeconfig)
	s.mu.Lock()
	current, running := s.conns[key]
	s.mu.Unlock()
	if running && current.digest == digest {
		return nil
	}
	cfg, err := ClusterConfig(key, kubeconfig)
	s.disconnect(key)
	if err != nil {
		return err
	}
	c := &conn{digest: digest, done: make(chan struct{})}
	suspect := func(err error) { s.suspect(key, c, err) }
	admin, err := s.build(key, cfg, suspect)
	if err != nil {
		return err
	}
	run := admin
	if s.opts.Identity != nil {
		if run, err = s.identity(ctx, admin, suspect); err != nil {
			return err
		}
	}
	run.Admin = admin.Dynamic
	c.cluster = run
	s.start(ctx, c)
	return nil
}

// identity installs nodeguard's ServiceAccount in c's cluster and returns
// the clients that authenticate as it.
func (s *ClusterSet) identity(ctx context.Context, c *Cluster, suspect func(error)) (*Cluster, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	opts := *s.opts.Identity
	opts.Log = s.opts.Log.With("cluster", c.Key)
	id, err := EnsureIdentity(ctx, c.Config, opts)
	if err != nil {
		return nil, fmt.Errorf("workload cluster %s: nodeguard's own identity: %w", c.Key, err)
	}
	run, err := s.build(c.Key, id.Config, suspect)
	if err != nil {
		return nil, err
	}
	run.Identity = id
	return run, nil
}

// build makes a Cluster's clients from cfg, every request observed for the
// health checks.
func (s *ClusterSet) build(key string, cfg *rest.Config, suspect func(error)) (*Cluster, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = s.opts.QPS, s.opts.Burst
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &observer{next: rt, suspect: suspect} })
	clients, err := FromConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("clients of Cluster %s: %w", key, err)
	}
	kube, err := Protobuf(clients.Config)
	if err != nil {
		return nil, fmt.Errorf("clients of Cluster %s: %w", key, err)
	}
	ecfg := rest.CopyConfig(clients.Config)
	ecfg.QPS, ecfg.Burst = s.opts.EventsQPS, s.opts.EventsBurst
	// The events group alone: a clientset's fifty clients cost a few KiB
	// each, at thousands of clusters.
	events, err := eventsv1client.NewForConfig(ecfg)
	if err != nil {
		return nil, fmt.Errorf("events client of Cluster %s: %w", key, err)
	}
	return &Cluster{Key: key, Config: clients.Config, Kube: kube, Dynamic: clients.Dynamic, Events: events}, nil
}

func (s *ClusterSet) start(ctx context.Context, c *conn) {
	ctx, cancel := context.WithCancel(ctx)
	c.cancel = cancel
	key := c.cluster.Key
	s.mu.Lock()
	s.conns[key] = c
	s.mu.Unlock()
	s.opts.Metrics.running(key, true)
	s.opts.Log.Info("workload cluster: connected", "cluster", key, "server", c.cluster.Config.Host, "ownIdentity", c.cluster.Identity != nil)
	go func() {
		defer close(c.done)
		s.opts.Start(ctx, c.cluster)
	}()
	s.changed(key)
}

// disconnect ends the connection of key, if any, and waits for its session.
func (s *ClusterSet) disconnect(key string) {
	s.mu.Lock()
	c, ok := s.conns[key]
	delete(s.conns, key)
	s.mu.Unlock()
	if !ok {
		return
	}
	c.cancel()
	<-c.done
	s.opts.Metrics.running(key, false)
	s.opts.Log.Info("workload cluster: disconnected", "cluster", key)
	if s.opts.Stopped != nil {
		s.opts.Stopped(key)
	}
	s.changed(key)
}

// suspect is told of a failed request or watch of connection c: its
// cluster is probed now (at most once a second), not at the next
// scheduled probe.
func (s *ClusterSet) suspect(key string, c *conn, _ error) {
	s.mu.Lock()
	if s.conns[key] != c || c.suspected {
		s.mu.Unlock()
		return
	}
	c.suspected = true
	wait := time.Until(c.lastProbe.Add(leastTimeBetweenProbes))
	s.mu.Unlock()
	s.loop.AddAfter(key, max(0, wait))
}

// probe checks the connection of key when a check is due, tells its users
// when it turned reachable or unreachable, and returns how long until the
// next check is due.
func (s *ClusterSet) probe(ctx context.Context, key string) time.Duration {
	s.mu.Lock()
	c, ok := s.conns[key]
	if !ok {
		s.mu.Unlock()
		return s.opts.ProbeInterval
	}
	due := s.probeDue(c)
	s.mu.Unlock()
	if wait := time.Until(due); wait > 0 {
		return wait
	}
	start := time.Now()
	err := probe(ctx, c.cluster.Kube, s.opts.ProbeTimeout)
	if ctx.Err() != nil {
		return s.opts.ProbeInterval
	}
	s.opts.Metrics.probed(err)
	s.mu.Lock()
	if s.conns[key] != c {
		s.mu.Unlock()
		return s.opts.ProbeInterval
	}
	before := c.health
	c.lastProbe, c.suspected = start, false
	c.health = ClusterHealth{Checked: true, Reachable: err == nil, Since: before.Since, Err: err}
	turned := !before.Checked || before.Reachable != c.health.Reachable
	if turned {
		c.health.Since = start
	}
	next := time.Until(s.probeDue(c))
	s.mu.Unlock()
	s.opts.Metrics.reachable(key, c.health.Reachable)
	if turned {
		if err != nil {
			s.opts.Metrics.Failed(key, "health")
			s.opts.Log.Error("workload cluster: unreachable", "cluster", key, "error", err.Error())
		} else if before.Checked {
			s.opts.Log.Info("workload cluster: reachable again", "cluster", key, "unreachableFor", start.Sub(before.Since).Round(time.Second).String())
		}
		s.changed(key)
	}
	return max(time.Millisecond, next)
}

// probeDue is when c is checked next; the caller holds mu.
func (s *ClusterSet) probeDue(c *conn) time.Time {
	if !c.health.Checked {
		return time.Time{}
	}
	if c.suspected {
		return c.lastProbe.Add(leastTimeBetweenProbes)
	}
	if !c.health.Reachable {
		return c.lastProbe.Add(min(s.opts.UnreachableProbeInterval, s.opts.ProbeInterval))
	}
	return c.lastProbe.Add(s.opts.ProbeInterval)
}

// ClusterMetrics are the ClusterSet's Prometheus series.
type ClusterMetrics struct {
	errors   *prometheus.CounterVec
	sessions *prometheus.GaugeVec
	reachOK  *prometheus.GaugeVec
	checks   *prometheus.CounterVec
}

// NewClusterMetrics registers nodeguard_workload_cluster_errors_total{cluster,
// stage}, nodeguard_workload_cluster_session{cluster},
// nodeguard_workload_cluster_reachable{cluster} and
// nodeguard_workload_cluster_health_checks_total{result}.
func NewClusterMetrics(reg prometheus.Registerer) (*ClusterMetrics, error) {
	r := metrics.New(reg)
	m := &ClusterMetrics{
		errors: r.CounterVec("nodeguard_workload_cluster_errors_total",
			"Failures reaching a CAPI workload cluster, by cluster and stage: kubeconfig (its Secret missing, unreadable or invalid, or nodeguard's identity not installed), watch (its API server's list or watch failed) or health (its API server stopped answering).", "cluster", "stage"),
		sessions: r.GaugeVec("nodeguard_workload_cluster_session",
			"1 while nodeguard runs against a CAPI workload cluster with a working kubeconfig.", "cluster"),
		reachOK: r.GaugeVec("nodeguard_workload_cluster_reachable",
			"1 when the last health check of a CAPI workload cluster's API server got an answer, 0 when it did not.", "cluster"),
		checks: r.CounterVec("nodeguard_workload_cluster_health_checks_total",
			"Health checks of CAPI workload clusters' API servers (GET /readyz), by result (ok, failed).", "result"),
	}
	if err := r.Err("workload cluster metrics"); err != nil {
		return nil, err
	}
	return m, nil
}

// Failed counts one failure of a cluster at a stage ("watch" for callers).
func (m *ClusterMetrics) Failed(cluster, stage string) {
	if m != nil {
		m.errors.WithLabelValues(cluster, stage).Inc()
	}
}

// forget drops the series of a Cluster that is gone.
func (m *ClusterMetrics) forget(cluster string) {
	if m != nil {
		m.errors.DeletePartialMatch(prometheus.Labels{"cluster": cluster})
	}
}

func (m *ClusterMetrics) running(cluster string, on bool) {
	if m == nil {
		return
	}
	if on {
		m.sessions.WithLabelValues(cluster).Set(1)
		return
	}
	m.sessions.DeleteLabelValues(cluster)
	m.reachOK.DeleteLabelValues(cluster)
}

func (m *ClusterMetrics) reachable(cluster string, ok bool) {
	if m == nil {
		return
	}
	v := 0.0
	if ok {
		v = 1
	}
	m.reachOK.WithLabelValues(cluster).Set(v)
}

func (m *ClusterMetrics) probed(err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "failed"
	}
	m.checks.WithLabelValues(result).Inc()
}

// Errors is the failure counter, for tests.
func (m *ClusterMetrics) Errors() *prometheus.CounterVec { return m.errors }

// HealthChecks is the health checks' counter, for tests and benchmarks.
func (m *ClusterMetrics) HealthChecks() *prometheus.CounterVec { return m.checks }
