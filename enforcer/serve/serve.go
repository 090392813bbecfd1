// Package serve wires `nodeguard serve`: a live Enforcer over one cluster's
// API server, the webhook handler, metrics, and the HTTPS server.
package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeguard/nodeguard/enforcer/freshread"
	"github.com/nodeguard/nodeguard/enforcer/informers"
	"github.com/nodeguard/nodeguard/enforcer/kubeclient"
	"github.com/nodeguard/nodeguard/enforcer/live"
	"github.com/nodeguard/nodeguard/enforcer/manifest"
	"github.com/nodeguard/nodeguard/enforcer/policybundle"
	"github.com/nodeguard/nodeguard/enforcer/version"
	"github.com/nodeguard/nodeguard/enforcer/webhook"
)

// Options are the flags of `nodeguard serve`.
type Options struct {
	Listen              string
	CertFile, KeyFile   string
	ClientCAFile        string
	Kubeconfig, Context string
	Constraint          string
	NoFreshReads        bool
	FreshReadTimeout    time.Duration
	RequestTimeout      time.Duration
	ShutdownGrace       time.Duration
	// Bundle, when its Path is set, is a signed policy bundle to run instead
	// of the embedded rule, reloaded when the file changes.
	Bundle policybundle.Options
	// Orphans configures the orphan-Node scan and reaper.
	Orphans ReapOptions
	// KubeAPIQPS and KubeAPIBurst are the clients' rate limits (0: the
	// kubeclient package's defaults); Run applies them, RunWith's clients are
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
	// TLSMinVersion and TLSCipherSuites: see webhook.TLSOptions.
	TLSMinVersion   string
	TLSCipherSuites []string
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
	c, err := kubeclient.ConnectWith(opts.Kubeconfig, opts.Context, opts.KubeAPIQPS, opts.KubeAPIBurst)
	if err != nil {
		return err
	}
	return RunWith(ctx, c, opts, log, listening)
}

// RunWith is Run with clients already built.
func RunWith(ctx context.Context, c kubeclient.Clients, opts Options, log *slog.Logger, listening func(net.Addr)) error {
	// Whatever started here (informers, side servers) stops when it returns.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var params map[string]any
	if opts.Constraint != "" {
		p, err := manifest.ConstraintParameters(opts.Constraint)
		if err != nil {
			return err
		}
		params = p
	}
	// A bundle is verified and compiled before anything starts: a bad one
	// stops nodeguard here.
	eval, err := policybundle.Evaluator(ctx, opts.Bundle)
	if err != nil {
		return err
	}
	lopts := live.Options{Parameters: params, NoFreshReads: opts.NoFreshReads, FreshTimeout: opts.FreshReadTimeout, Evaluator: eval}
	// The orphan scan hears of every inventory change from the first.
	var changes *informers.Relay
	if opts.Orphans.Interval > 0 {
		changes = &informers.Relay{}
		lopts.OnChange = changes.Send
	}
	e, err := live.Start(ctx, c, lopts)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	policyMetrics, err := version.Register(reg, eval.Policy)
	if err != nil {
		return err
	}
	metrics, err := webhook.NewMetrics(reg, e.Inventory.Count)
	if err != nil {
		return err
	}
	scanner, err := startReaper(ctx, c, e, changes, reg, opts.Orphans, log)
	if err != nil {
		return err
	}
	if opts.Bundle.Path != "" {
		go func() {
			err := policybundle.Watch(ctx, opts.Bundle, eval, log, func(err error) {
				if err != nil {
					policyMetrics.ReloadErrors.Inc()
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
	clusters := freshread.New(c.Dynamic, c.Mapper)
	handler := webhook.New(webhook.Options{
		Decider: e.Guard,
		Ready:   e.Syncer.Ready,
		ClusterExists: func(ctx context.Context, namespace, name string) (bool, error) {
			obj, err := clusters.Get(ctx, clusterGVK(), namespace, name)
			return obj != nil, err
		},
		Timeout:                opts.RequestTimeout,
		RequireClientCert:      opts.ClientCAFile != "",
		MaxConcurrentDecisions: opts.MaxConcurrentDecisions,
		Metrics:                metrics,
		Log:                    log,
	})
	srv, err := webhook.NewServer(handler, webhook.TLSOptions{CertFile: opts.CertFile, KeyFile: opts.KeyFile, ClientCAFile: opts.ClientCAFile,
		MinVersion: opts.TLSMinVersion, CipherSuites: opts.TLSCipherSuites}, log)
	if err != nil {
		return err
	}
	side := []sideServer{
		{"metrics", opts.MetricsBindAddress, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), "/metrics"},
		{"health probes", opts.HealthProbeBindAddress, webhook.Probes(e.Syncer.Ready), ""},
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
		"policy", pol.Source, "policyVersion", pol.Version, "bundleRevision", pol.Revision)
	if listening != nil {
		listening(l.Addr())
	}
	grace := opts.ShutdownGrace
	if grace == 0 {
		grace = DefaultShutdownGrace
	}
	return srv.Serve(ctx, l, grace)
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
