// Package serve wires `nodeguard serve`: a live Enforcer over one cluster's
// API server, the webhook handler, metrics, and the HTTPS server; the
// composition root, which builds the other packages' parts and starts them.
//
// It must not hold a rule, a judgment or a cluster write of its own: each
// lives in the package named for it.
package serve

import (
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/events"
	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/fleet"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/nodes"
	"github.com/nodeguard/nodeguard/enforcer/record"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// Options are the flags of `nodeguard serve`.
type Options struct {
	Listen              string
	CertFile, KeyFile   string
	ClientCAFile        string
	Kubeconfig, Context string
	// Constraint is a K8sNodeGuard Constraint file (parameters only, read
	// once); without it, ConstraintName is the Constraint read from the
	// cluster and followed while serving ("": none, the rule's defaults).
	Constraint       string
	ConstraintName   string
	NoFreshReads     bool
	FreshReadTimeout time.Duration
	RequestTimeout   time.Duration
	ShutdownGrace    time.Duration
	// EnforcementAction is what a denied Node delete becomes on the review
	// routes (deny, warn, dryrun; "" is deny); a Cluster's
	// nodeguard.io/enforcement-action annotation overrides it on its route.
	EnforcementAction rule.Action
	// Bundle, when its Path is set, is a signed policy bundle to run instead
	// of the embedded rule, reloaded when the file changes.
	Bundle rule.BundleOptions
	// Orphans configures the orphan-Node scan and reaper.
	Orphans ReapOptions
	// KubeAPIQPS and KubeAPIBurst are the clients' rate limits (0: the
	// kube package's defaults); Run applies them, RunWith's clients are
	// already built.
	KubeAPIQPS   float32
	KubeAPIBurst int
	// MaxConcurrentDecisions bounds the decisions made at once (0: the
	// webhook's default).
	MaxConcurrentDecisions int
	// MetricsBindAddress serves /metrics over HTTP, HealthProbeBindAddress
	// /healthz and /readyz; "" or "0" turns either off (the command's flags
	// default to DefaultMetricsBindAddress and DefaultHealthProbeBindAddress).
	// Neither is on the review port, so a NetworkPolicy can open only that
	// one to the API server.
	MetricsBindAddress     string
	HealthProbeBindAddress string
	// SideListening, when set, receives the metrics' ("metrics") and
	// probes' ("health probes") addresses once their ports are open.
	SideListening func(name string, addr net.Addr)
	// TLSMinVersion and TLSCipherSuites: see admission.TLSOptions.
	TLSMinVersion   string
	TLSCipherSuites []string
	// NoDenialEvents turns off the NodeDeleteDenied Events recorded on the
	// Node of each denied delete (--denial-events=false).
	NoDenialEvents bool
	// DenialEventsWorkloadClusters records a workload route's Events in that
	// workload cluster, through its <name>-kubeconfig Secret; without it
	// they go on the Machine (or Cluster) in the cluster nodeguard runs in.
	DenialEventsWorkloadClusters bool
	// ExternalDataClientCAFile, when set, serves Gatekeeper's external data
	// routes (/externaldata, /externaldata/clusters/NS/NAME) to clients with
	// a certificate of this CA: Gatekeeper's.
	ExternalDataClientCAFile string
	// GatekeeperProvider, when its URL or Service is set, keeps Gatekeeper's
	// Provider in this cluster pointing at this nodeguard.
	GatekeeperProvider ProviderOptions
	// ClusterRoutesClientCAFile, when set, makes the cluster routes (the
	// ones workload API servers call) require a client certificate of this
	// CA, /validate not (ClientCAFile covers every route).
	ClusterRoutesClientCAFile string
	// SelfCluster, "namespace/name", scopes /validate to that CAPI Cluster:
	// the management cluster's own, when it is CAPI-managed.
	SelfCluster string
	// Fleet guards the CAPI workload clusters, each through nodeguard's
	// configuration there, kept and proven.
	Fleet FleetOptions
	// DecisionLogs ship every verdict as OPA decision log events (off
	// unless its ConfigFile or Console is set).
	DecisionLogs DecisionLogOptions
}

// DecisionLogOptions configure the decision logs from files, as OPA's are.
type DecisionLogOptions struct {
	// ConfigFile is an OPA configuration file: services, labels,
	// decision_logs.
	ConfigFile string
	// Console logs every decision to standard error too.
	Console bool
	// MaskFile is a Rego module of package system.log replacing the default
	// mask (rule.DefaultDecisionLogMask).
	MaskFile string
	// Queue bounds the events waiting for the plugin (0: the default).
	Queue int
}

// start starts the decision logs (nil when off).
func (o DecisionLogOptions) start(ctx context.Context, policy func() rule.Policy, log *slog.Logger) (*rule.DecisionLog, error) {
	if o.ConfigFile == "" && !o.Console {
		return nil, nil
	}
	host, _ := os.Hostname() // a Pod's name
	opts := rule.DecisionLogOptions{Console: o.Console, Queue: o.Queue, ID: host, Version: rule.ReadBinary().Version, Policy: policy}
	if o.ConfigFile != "" {
		raw, err := os.ReadFile(o.ConfigFile)
		if err != nil {
			return nil, fmt.Errorf("--decision-log-config: %w", err)
		}
		opts.Config = raw
	}
	if o.MaskFile != "" {
		raw, err := os.ReadFile(o.MaskFile)
		if err != nil {
			return nil, fmt.Errorf("--decision-log-mask: %w", err)
		}
		opts.Mask = string(raw)
	}
	d, err := rule.StartDecisionLog(ctx, opts)
	if err != nil {
		return nil, err
	}
	log.Info("decision logs on", "config", o.ConfigFile, "console", o.Console, "mask", cmp.Or(o.MaskFile, "default"))
	return d, nil
}

// ProviderOptions say where Gatekeeper reaches nodeguard, for the Provider
// nodeguard keeps.
type ProviderOptions struct {
	URL, Service string
	// CAFile is the CA of nodeguard's serving certificate (default: ca.crt
	// beside the certificate, as cert-manager writes it).
	CAFile string
}

// Defaults for the flags; the request deadline stays below the 5s
// timeoutSeconds that `nodeguard webhook-config` writes.
const (
	DefaultListen         = ":8443"
	DefaultRequestTimeout = 4 * time.Second
	DefaultFreshTimeout   = 2 * time.Second
	DefaultShutdownGrace  = 10 * time.Second
	// The ports controller-runtime components conventionally use.
	DefaultMetricsBindAddress     = ":8080"
	DefaultHealthProbeBindAddress = ":8081"
)

// clusterGVK is Cluster API's Cluster, which the cluster route names.
func clusterGVK() schema.GroupVersionKind {
	return schema.GroupVersionKind{Group: "cluster.x-k8s.io", Kind: "Cluster"}
}

// Run serves until ctx is done. listening, when set, receives the address
// once the port is open.
func Run(ctx context.Context, opts Options, log *slog.Logger, listening func(net.Addr)) error {
	c, err := kube.ConnectWith(opts.Kubeconfig, opts.Context, opts.KubeAPIQPS, opts.KubeAPIBurst, kube.LogWarnings(log))
	if err != nil {
		return err
	}
	return RunWith(ctx, c, opts, log, listening)
}

// RunWith is Run with clients already built.
func RunWith(ctx context.Context, c kube.Clients, opts Options, log *slog.Logger, listening func(net.Addr)) error {
	// Whatever started here (informers, side servers) stops when it returns.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if opts.ShutdownGrace == 0 {
		opts.ShutdownGrace = DefaultShutdownGrace
	}
	// A bundle is verified and compiled before anything starts: a bad one
	// stops nodeguard here.
	eval, err := rule.LoadEngine(ctx, opts.Bundle)
	if err != nil {
		return err
	}
	spec, follow, err := initialConstraint(ctx, c, opts)
	if err != nil {
		return err
	}
	params := spec.Parameters
	if err := checkWatchFilter(opts); err != nil {
		return err
	}
	lopts := guard.EnforcerOptions{Parameters: params, NoFreshReads: opts.NoFreshReads, FreshTimeout: opts.FreshReadTimeout, Engine: eval,
		WatchFilter: opts.Fleet.WatchFilter}
	// The orphan scan hears of every inventory change from the first.
	var changes *facts.Relay
	if opts.Orphans.Interval > 0 {
		changes = &facts.Relay{}
		lopts.OnChange = changes.Send
	}
	e, err := guard.StartEnforcer(ctx, c, lopts)
	if err != nil {
		return err
	}
	dlog, err := opts.DecisionLogs.start(ctx, eval.Policy, log)
	if err != nil {
		return err
	}
	if dlog != nil {
		// Flushed last, after the review port closed.
		defer func() {
			stop, done := context.WithTimeout(context.WithoutCancel(ctx), opts.ShutdownGrace)
			defer done()
			dlog.Stop(stop)
		}()
	}
	reg := prometheus.NewRegistry()
	metrics, err := Register(reg, Sources{Policy: eval.Policy, Cached: e.Inventory.Count, Watched: e.Syncer.Watched, Ready: e.Syncer.Ready,
		DecisionLog: dlog})
	if err != nil {
		return err
	}
	sessions, err := workloadSessions(c, opts, metrics, log)
	if err != nil {
		return err
	}
	if e.Shard != nil && sessions != nil {
		// A shard proves it holds each of its Clusters whole (facts.Shard).
		sessions.Add(nil, nil, e.Shard.ClusterChanged)
		go e.Shard.Run(ctx, func(key string) bool { _, ok := sessions.Set.Meta(key); return ok })
	}
	publish := opts.Fleet.Enabled && opts.Fleet.AdmissionPolicy
	if publish && opts.Orphans.Interval <= 0 {
		return fmt.Errorf("--fleet-admission-policy judges workload Nodes with the orphan scan: it needs a positive --orphan-scan-interval")
	}
	// What stops with ctx and must be done before serve returns: the
	// Leases given up (a standby takes them at once), the writes under way.
	var bg sync.WaitGroup
	defer func() {
		cancel()
		waitFor(&bg, opts.ShutdownGrace, log)
	}()
	leaders, err := electLeaders(ctx, c, opts, sessions, log)
	if err != nil {
		return err
	}
	for _, l := range []*kube.Leader{leaders.fleet, leaders.reaper} {
		if l != nil {
			bg.Go(func() { <-l.Done() })
		}
	}
	// One recorder writes every Event: denials, orphans, ghosts, the fleet's.
	rec, err := startEvents(ctx, c, opts, sessions, metrics.Events, log)
	if err != nil {
		return err
	}
	// The scanner (nil when the scan is off) has every Node judged again
	// when the policy is reloaded.
	var scanner *nodes.Scanner
	if opts.Orphans.Interval > 0 {
		scan := OrphanScan{Management: c, Enforcer: e, Changes: changes, Registry: reg, Metrics: metrics.Orphans, Options: opts.Orphans,
			Sessions: sessions, Releases: publish, Events: rec, Log: log, ReapLeader: leaders.reaper, ReleaseLeader: leaders.fleet, DecisionLog: dlog}
		if scanner, err = scan.Start(ctx); err != nil {
			return err
		}
	} else if opts.Orphans.Enabled {
		return fmt.Errorf("--reap-orphan-nodes needs a positive --orphan-scan-interval")
	}
	var published *nodes.Publisher
	if publish {
		published = scanner.Releases()
	}
	issuer, err := opts.Fleet.issuer()
	if err != nil {
		return err
	}
	reconciler, err := startFleet(ctx, c, opts, params, sessions, published, leaders.fleet, issuer, metrics.Fleet, rec, &bg, log)
	if err != nil {
		return err
	}
	constraint := newLiveConstraint(e, spec, opts.EnforcementAction, log)
	constraint.fleet, constraint.scanner = reconciler, scanner
	if follow {
		go facts.WatchConstraint(ctx, facts.ConstraintWatchOptions{Client: c.Dynamic, Mapper: c.Mapper, Name: opts.ConstraintName,
			Applied: spec, Apply: constraint.Apply, Metrics: metrics.Constraint, Log: log})
	}
	if sessions != nil {
		bg.Go(func() { sessions.Run(ctx, log) })
	}
	if opts.Bundle.Path != "" {
		go func() {
			err := rule.WatchBundle(ctx, opts.Bundle, eval, log, func(err error) {
				if err != nil {
					metrics.Policy.ReloadErrors.Inc()
				} else if scanner != nil {
					scanner.JudgeAll() // the orphan criteria may have changed with it
				}
			})
			if err != nil {
				// Without a watch the loaded policy keeps deciding; say so.
				log.Error("bundle watch stopped: updates of the bundle file will not be loaded", "error", err)
			}
		}()
	}
	handler, clientCAs, err := routes(ctx, c, e, scanner, metrics, denials(rec, opts), constraint.Action, issuer, dlog, opts, log)
	if err != nil {
		return err
	}
	srv, err := admission.NewTLSServer(handler, admission.TLSOptions{CertFile: opts.CertFile, KeyFile: opts.KeyFile, ClientCAFiles: clientCAs,
		MinVersion: opts.TLSMinVersion, CipherSuites: opts.TLSCipherSuites}, log)
	if err != nil {
		return err
	}
	if err := keepProvider(ctx, c, opts, log); err != nil {
		return err
	}
	side := []sideServer{
		{"metrics", opts.MetricsBindAddress, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), "/metrics"},
		{"health probes", opts.HealthProbeBindAddress, admission.ProbeHandler(e.Syncer.Ready), ""},
	}
	for _, s := range side {
		if s.address == "" || s.address == "0" {
			continue
		}
		if err := s.start(ctx, log, opts.SideListening); err != nil {
			return err
		}
	}
	listen := opts.Listen
	if listen == "" {
		listen = DefaultListen
	}
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", listen, err)
	}
	pol := eval.Policy()
	log.Info("serving", "address", l.Addr().String(), "freshReads", !opts.NoFreshReads,
		"policy", pol.Source, "policyVersion", pol.Version, "bundleRevision", pol.Revision,
		"constraint", spec.From, "enforcementAction", string(constraint.Action()))
	if listening != nil {
		listening(l.Addr())
	}
	return srv.Serve(ctx, l, opts.ShutdownGrace)
}

// checkWatchFilter refuses a watch filter that is no label value, or one
// given to an install that guards no fleet: a shard is a fleet's part.
func checkWatchFilter(opts Options) error {
	v := opts.Fleet.WatchFilter
	if v == "" {
		return nil
	}
	if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
		return fmt.Errorf("--watch-filter %q is not a label value: %s", v, strings.Join(errs, "; "))
	}
	if !opts.Fleet.Enabled {
		return fmt.Errorf("--watch-filter %q needs --fleet: an install with a watch filter is one shard of a fleet", v)
	}
	if opts.SelfCluster != "" {
		return fmt.Errorf("--watch-filter %q with --self-cluster: the management cluster's own Nodes are guarded by an install "+
			"without a watch filter", v)
	}
	return nil
}

// waitFor waits for what runs in the background to stop, for at most grace:
// what has not by then is left to the process's exit.
func waitFor(bg *sync.WaitGroup, grace time.Duration, log *slog.Logger) {
	done := make(chan struct{})
	go func() {
		bg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(grace):
		log.Warn("stopping: leases and writes still under way after the shutdown grace; leaving them", "grace", grace.String())
	}
}

// caughtUp is nil once e's caches are synced and none is recovering from a
// broken watch.
func caughtUp(e *guard.Enforcer) func() error {
	return func() error {
		if err := e.Syncer.Ready(); err != nil {
			return err
		}
		return e.Syncer.Recovering()
	}
}

// leaders are this replica's parts in the elections: the fleet's and the
// reaper's (nil when off).
type leaders struct {
	fleet, reaper *kube.Leader
}

// electLeaders campaigns for the Leases of what is on.
func electLeaders(ctx context.Context, c kube.Clients, opts Options, sessions *WorkloadSessions, log *slog.Logger) (leaders, error) {
	var l leaders
	var err error
	if opts.Fleet.Enabled {
		if sessions == nil {
			return l, fmt.Errorf("--fleet needs a kubeconfig or in-cluster config")
		}
		if l.fleet, err = elect(ctx, sessions.Management, c.Dynamic, LeaseNamespace(opts.Fleet.Namespace),
			leaseName(fleetLease, opts.Fleet.WatchFilter), "fleet", log); err != nil {
			return l, err
		}
	}
	if opts.Orphans.Enabled && opts.Orphans.Interval > 0 && c.Config != nil {
		kube, err := kubernetes.NewForConfig(c.Config)
		if err != nil {
			return l, fmt.Errorf("create client: %w", err)
		}
		if l.reaper, err = elect(ctx, kube, c.Dynamic, LeaseNamespace(opts.Orphans.LeaseNamespace), leaseName(reaperLease, opts.Fleet.WatchFilter),
			"orphan reaper", log); err != nil {
			return l, err
		}
	}
	return l, nil
}

// workloadSessions are the one set of workload-cluster sessions, when any
// part works inside workload clusters.
func workloadSessions(c kube.Clients, opts Options, metrics *Metrics, log *slog.Logger) (*WorkloadSessions, error) {
	scan := (opts.Orphans.WorkloadClusters || opts.Fleet.AdmissionPolicy) && opts.Orphans.Interval > 0
	if (!scan && !opts.Fleet.Enabled && !opts.DenialEventsWorkloadClusters) || c.Config == nil {
		return nil, nil
	}
	secrets, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return nil, fmt.Errorf("create client: %w", err)
	}
	return NewWorkloadSessions(c, secrets, opts.Orphans, opts.Fleet, metrics.Orphans.Clusters, log)
}

// routes are the review port's: the webhook's review routes and, with a
// client CA for Gatekeeper, the external data provider's, sharing one
// intake. It returns the CA files whose client certificates the TLS server
// asks for.
func routes(ctx context.Context, c kube.Clients, e *guard.Enforcer, scanner *nodes.Scanner, metrics *Metrics, denied func(events.Denial),
	action func() rule.Action, issuer *fleet.Issuer, dlog *rule.DecisionLog, opts Options, log *slog.Logger) (http.Handler, []string, error) {
	in := admission.NewIntake(admission.IntakeOptions{Timeout: opts.RequestTimeout, MaxConcurrent: opts.MaxConcurrentDecisions, Metrics: metrics.Intake, Log: log})
	clusters := clusterReader{fresh: facts.NewFreshReader(c.Dynamic, c.Mapper), log: log}
	var register func(context.Context, admission.Registration) (admission.RegistrationAnswer, error)
	if scanner != nil && opts.Orphans.Ghosts.Enabled() {
		clusters.protection = opts.Orphans.Ghosts.protection()
		register = registrations(scanner.Finder(), clusters.Protection, caughtUp(e))
	}
	// Each CA file a route requires client certificates of: loaded here, and
	// asked for by the TLS server. The first that cannot be loaded is err.
	var caFiles []string
	var err error
	clientCAs := func(file string) (pool *x509.CertPool) {
		if file != "" && err == nil {
			caFiles = append(caFiles, file)
			pool, err = admission.LoadCAs(file)
		}
		return pool
	}
	reviewCAs, clusterCAs := clientCAs(opts.ClientCAFile), clientCAs(opts.ClusterRoutesClientCAFile)
	var identities *x509.CertPool
	if issuer != nil {
		// Each workload API server's own certificate, issued by the fleet.
		identities = clientCAs(opts.Fleet.ClientCACertFile)
	}
	if err != nil {
		return nil, nil, err
	}
	// One mux: each package adds its own routes.
	mux := http.NewServeMux()
	admission.NewWebhook(admission.WebhookOptions{Decider: e.Guard, Clusters: clusters, Action: action, ClientCAs: reviewCAs, ClusterClientCAs: clusterCAs,
		ClusterIdentities: identities, SelfCluster: opts.SelfCluster, DryRunOnlyUser: dryRunOnly(opts), Intake: in, Metrics: metrics.Webhook, Log: log,
		Denied: denied, Register: register, DecisionLog: dlog, Mux: mux})
	if opts.ExternalDataClientCAFile == "" {
		return mux, caFiles, nil
	}
	gatekeeperCAs := clientCAs(opts.ExternalDataClientCAFile)
	if err != nil {
		return nil, nil, err
	}
	// Answered a little before Gatekeeper gives up on the request.
	if _, err := admission.NewProvider(admission.ProviderOptions{Facts: e.Guard, ClientCAs: gatekeeperCAs, Clusters: clusters, Intake: in,
		Timeout: admission.ProviderTimeoutSeconds*time.Second - 200*time.Millisecond, Metrics: metrics.Provider, Log: log, DecisionLog: dlog, Mux: mux}); err != nil {
		return nil, nil, err
	}
	log.Info("serving Gatekeeper's external data", "routes", []string{admission.ProviderRouteSelf, admission.ProviderRouteCluster})
	return mux, caFiles, nil
}

// clusterReader reads, fresh, the CAPI Clusters the cluster routes name, for
// what their annotations set there.
type clusterReader struct {
	fresh      *facts.FreshReader
	protection nodes.Protection // the ghost protection of Clusters that set none
	log        *slog.Logger
}

// Cluster is admission.Clusters: whether the Cluster exists, and the
// enforcement action it sets.
func (r clusterReader) Cluster(ctx context.Context, key string) (bool, rule.Action, error) {
	obj, err := r.read(ctx, key)
	if obj == nil || err != nil {
		return false, "", err
	}
	a, err := rule.ActionOf(obj.GetAnnotations(), "")
	if err != nil {
		// The route keeps the default action; say why on each review
		// until the annotation is fixed.
		r.log.Warn("Cluster's enforcement action ignored", "cluster", key, "error", err.Error())
	}
	return true, a, nil
}

// Protection is the ghost protection of Cluster key ("": the cluster
// nodeguard runs in).
func (r clusterReader) Protection(ctx context.Context, key string) (nodes.Protection, error) {
	if key == "" {
		return r.protection, nil
	}
	obj, err := r.read(ctx, key)
	if obj == nil || err != nil {
		return r.protection, fmt.Errorf("read Cluster %s: %w", key, err)
	}
	return nodes.ProtectionOf(obj.GetAnnotations(), r.protection)
}

// read reads Cluster key; nil when there is none.
func (r clusterReader) read(ctx context.Context, key string) (*unstructured.Unstructured, error) {
	ns, name, err := record.SplitKey("cluster", key)
	if err != nil {
		return nil, err
	}
	return r.fresh.Get(ctx, clusterGVK(), ns, name)
}

// keepProvider keeps Gatekeeper's Provider pointing at this nodeguard, when
// asked to, in the background until ctx is done.
func keepProvider(ctx context.Context, c kube.Clients, opts Options, log *slog.Logger) error {
	p := opts.GatekeeperProvider
	if p.URL == "" && p.Service == "" {
		return nil
	}
	if opts.ExternalDataClientCAFile == "" {
		return fmt.Errorf("--gatekeeper-provider-url and --gatekeeper-provider-service need --externaldata-client-ca-file: " +
			"the Provider's route answers only Gatekeeper")
	}
	name, err := admission.ProviderName(ctx)
	if err != nil {
		return err
	}
	caFile := p.CAFile
	if caFile == "" {
		caFile = filepath.Join(filepath.Dir(opts.CertFile), "ca.crt")
	}
	keeper := &fleet.ProviderKeeper{Client: c.Dynamic, Name: name, Options: admission.WebhookConfigOptions{URL: p.URL, Service: p.Service},
		CAFiles: []string{caFile}, Log: log}
	go func() {
		if err := keeper.Run(ctx); err != nil {
			log.Error("Gatekeeper's Provider is not kept", "error", err.Error())
		}
	}()
	return nil
}

// sideServer is a plain-HTTP server beside the review port: metrics or
// probes, nothing a review could reach.
type sideServer struct {
	name, address string
	handler       http.Handler
	path          string // only this path when set
}

// start listens and serves until ctx is done.
func (s sideServer) start(ctx context.Context, log *slog.Logger, listening func(string, net.Addr)) error {
	l, err := net.Listen("tcp", s.address)
	if err != nil {
		return fmt.Errorf("listen for %s on %s: %w", s.name, s.address, err)
	}
	h := s.handler
	if s.path != "" {
		mux := http.NewServeMux()
		mux.Handle("GET "+s.path, s.handler)
		h = mux
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(s.name+" server stopped", "error", err)
		}
	}()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	log.Info("serving "+s.name, "address", l.Addr().String())
	if listening != nil {
		listening(s.name, l.Addr())
	}
	return nil
}

// dryRunOnly is the user whose real Node deletes the cluster routes deny:
// nodeguard's own identity in workload clusters, unless its reaper works
// there.
func dryRunOnly(opts Options) string {
	if opts.Orphans.Enabled && opts.Orphans.WorkloadClusters && !opts.Orphans.DryRun {
		return ""
	}
	return kube.Username
}
