package rule

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/loader"
	"github.com/open-policy-agent/opa/v1/logging"
	"github.com/open-policy-agent/opa/v1/metrics"
	"github.com/open-policy-agent/opa/v1/plugins"
	"github.com/open-policy-agent/opa/v1/plugins/logs"
	"github.com/open-policy-agent/opa/v1/server"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	"sigs.k8s.io/yaml"
)

// DefaultDecisionLogMask is the mask policy decision logs get unless
// another is given: the requester's extra attributes (they may carry a
// token's credential ID) never leave nodeguard.
const DefaultDecisionLogMask = `package system.log

mask contains "/input/review/userInfo/extra"
`

// DecisionLogOptions configure decision logs, as OPA's are configured.
type DecisionLogOptions struct {
	// Config is an OPA configuration (YAML or JSON): services, labels and
	// decision_logs (console, service, reporting, mask_decision, ...).
	// Empty with Console: decision logs to the console only.
	Config []byte
	// Console adds decision_logs.console: true.
	Console bool
	// ConsoleOutput is where console decision logs go (nil: standard error,
	// as OPA writes them).
	ConsoleOutput io.Writer
	// Mask is the Rego module of package system.log whose mask rule says
	// what events keep of their input (empty: DefaultDecisionLogMask).
	Mask string
	// Queue is how many events may wait for the plugin; a full queue
	// drops the event (counted), so logging never delays a decision.
	Queue int
	// ID names this nodeguard in the events' labels.id; Version is their
	// labels.nodeguard_version (OPA's own is labels.version).
	ID, Version string
	// Policy, when set, is the policy in force: an event that names none
	// is logged under it.
	Policy func() Policy
}

// DefaultDecisionLogQueue is DecisionLogOptions.Queue's default.
const DefaultDecisionLogQueue = 10000

// DecisionLog ships decision log events through OPA's decision log plugin
// (console or an HTTP service with its batching, retries, bounded buffer and
// masking). Log hands an event to a queue and returns: the plugin's work,
// masking included, runs on a goroutine of its own. A nil *DecisionLog logs
// nothing.
type DecisionLog struct {
	policy  func() Policy
	manager *plugins.Manager
	plugin  *logs.Plugin
	metrics metrics.Metrics
	queue   chan DecisionEvent
	dropped atomic.Uint64
	// stop ends the worker, which first hands what is queued to the plugin;
	// the queue is never closed, so a Log racing Stop cannot panic.
	stop chan struct{}
	done chan struct{}
}

// DecisionEvent is one verdict, in the terms of OPA's decision log event.
type DecisionEvent struct {
	// ID is the decision_id (NewDecisionID).
	ID string
	// Path is the rule's path ("nodeguard/decision"): Entry.Path.
	Path string
	// Input and Result are what the rule read and answered (or, for a
	// verdict acted on, what nodeguard did and on what).
	Input, Result any
	// Policy is the policy that decided: its revision is the event's
	// bundle revision.
	Policy Policy
	// Time is when it was decided.
	Time time.Time
	// Custom is nodeguard's own context (the route, the Cluster, the action).
	Custom map[string]any
}

// NewDecisionID returns a new decision_id.
func NewDecisionID() string { return uuid.NewString() }

// Path is the entry point's path as decision logs name it
// ("data.nodeguard.decision": "nodeguard/decision").
func (e Entry) Path() string {
	return strings.ReplaceAll(strings.TrimPrefix(e.Query(), "data."), ".", "/")
}

// StartDecisionLog starts OPA's decision log plugin with opts; Stop flushes
// and stops it.
func StartDecisionLog(ctx context.Context, opts DecisionLogOptions) (*DecisionLog, error) {
	raw := opts.Config
	if len(raw) == 0 {
		raw = []byte("{}")
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		return nil, fmt.Errorf("decision log configuration: %w", err)
	}
	if cfg == nil { // a file holding only comments or null
		cfg = map[string]any{}
	}
	if opts.Console {
		dl, _ := cfg["decision_logs"].(map[string]any)
		if dl == nil {
			dl = map[string]any{}
		}
		dl["console"] = true
		cfg["decision_logs"] = dl
	}
	if cfg["decision_logs"] == nil {
		return nil, fmt.Errorf("decision log configuration: no decision_logs section (and no console)")
	}
	labels, _ := cfg["labels"].(map[string]any)
	if labels == nil {
		labels = map[string]any{}
	}
	// OPA sets labels.id and labels.version (its own) itself.
	labels["app"] = "nodeguard"
	if opts.Version != "" {
		labels["nodeguard_version"] = opts.Version
	}
	cfg["labels"] = labels
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("decision log configuration: %w", err)
	}
	maskSrc := opts.Mask
	if maskSrc == "" {
		maskSrc = DefaultDecisionLogMask
	}
	mask, err := ast.ParseModuleWithOpts("mask.rego", maskSrc, ast.ParserOptions{RegoVersion: ast.RegoV1})
	if err != nil {
		return nil, fmt.Errorf("decision log mask: %w", err)
	}
	if got := mask.Package.Path.String(); got != "data.system.log" {
		return nil, fmt.Errorf("decision log mask: package %s, want system.log (OPA's mask_decision)", strings.TrimPrefix(got, "data."))
	}
	console := logging.New()
	console.SetFormatter(&logrus.JSONFormatter{})
	if opts.ConsoleOutput != nil {
		console.SetOutput(opts.ConsoleOutput)
	}
	// The plugin's own complaints (an upload failed), as JSON lines.
	quiet := logging.New()
	quiet.SetLevel(logging.Warn)
	quiet.SetFormatter(&logrus.JSONFormatter{})
	id := opts.ID
	if id == "" {
		id = uuid.NewString()
	}
	manager, err := plugins.New(raw, id, inmem.New(),
		plugins.Logger(quiet), plugins.ConsoleLogger(console),
		plugins.InitFiles(loader.Result{Modules: map[string]*loader.RegoFile{"mask.rego": {Name: "mask.rego", Parsed: mask, Raw: []byte(maskSrc)}}}))
	if err != nil {
		return nil, fmt.Errorf("decision log configuration: %w", err)
	}
	parsed, err := logs.NewConfigBuilder().WithBytes(manager.Config.DecisionLogs).WithServices(manager.Services()).
		WithPlugins(manager.Plugins()).Parse()
	if err != nil {
		return nil, fmt.Errorf("decision log configuration: %w", err)
	}
	m := metrics.New()
	plugin := logs.New(parsed, manager).WithMetrics(m)
	manager.Register(logs.Name, plugin)
	if err := manager.Init(ctx); err != nil {
		return nil, fmt.Errorf("start decision logs: %w", err)
	}
	if err := manager.Start(ctx); err != nil {
		return nil, fmt.Errorf("start decision logs: %w", err)
	}
	queue := opts.Queue
	if queue <= 0 {
		queue = DefaultDecisionLogQueue
	}
	d := &DecisionLog{policy: opts.Policy, manager: manager, plugin: plugin, metrics: m, queue: make(chan DecisionEvent, queue),
		stop: make(chan struct{}), done: make(chan struct{})}
	go d.run()
	return d, nil
}

// Log queues e for the plugin and returns at once; with the queue full, e
// is dropped and counted. An event without an ID, a time or a policy gets a
// new ID, now and the policy in force.
func (d *DecisionLog) Log(e DecisionEvent) {
	if d == nil {
		return
	}
	if e.ID == "" {
		e.ID = NewDecisionID()
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	if e.Policy == (Policy{}) && d.policy != nil {
		e.Policy = d.policy()
	}
	select {
	case d.queue <- e:
	default:
		d.dropped.Add(1)
	}
}

// Enabled reports whether d logs (false for nil).
func (d *DecisionLog) Enabled() bool { return d != nil }

func (d *DecisionLog) run() {
	defer close(d.done)
	for {
		select {
		case e := <-d.queue:
			d.hand(e)
		case <-d.stop:
			for {
				select {
				case e := <-d.queue:
					d.hand(e)
				default:
					return
				}
			}
		}
	}
}

// hand converts e and gives it to the plugin; what cannot be is dropped.
func (d *DecisionLog) hand(e DecisionEvent) {
	info, err := e.info()
	if err == nil {
		err = d.plugin.Log(context.Background(), info)
	}
	if err != nil {
		d.dropped.Add(1)
	}
}

// info converts e to the plugin's record. The input is converted to an AST
// once (a rule Input as the rule converts it: its parameters are converted
// already), which the mask and drop rules read, and the event's JSON form is
// made from that: a copy, which masking may change.
func (e DecisionEvent) info() (*server.Info, error) {
	var in ast.Value
	var err error
	switch x := e.Input.(type) {
	case ast.Value:
		in = x
	case Input:
		in, err = InputValue(map[string]any{"review": x.Review, "inventory": x.Inventory, "parameters": x.Parameters})
	default:
		in, err = ast.InterfaceToValue(x)
	}
	if err != nil {
		return nil, fmt.Errorf("decision %s: input: %w", e.ID, err)
	}
	input, err := ast.JSON(in)
	if err != nil {
		return nil, fmt.Errorf("decision %s: input: %w", e.ID, err)
	}
	res, err := ast.InterfaceToValue(e.Result)
	if err != nil {
		return nil, fmt.Errorf("decision %s: result: %w", e.ID, err)
	}
	result, err := ast.JSON(res)
	if err != nil {
		return nil, fmt.Errorf("decision %s: result: %w", e.ID, err)
	}
	revision := e.Policy.Revision
	if revision == "" {
		revision = e.Policy.Version
	}
	return &server.Info{
		DecisionID: e.ID,
		Path:       e.Path,
		Input:      &input,
		InputAST:   in,
		Results:    &result,
		Bundles:    map[string]server.BundleInfo{"nodeguard": {Revision: revision}},
		Timestamp:  e.Time,
		Custom:     e.Custom,
	}, nil
}

// Stop hands the queued events to the plugin and stops it, uploading what
// it holds until ctx ends; events logged meanwhile or after may be lost.
// Call it once.
func (d *DecisionLog) Stop(ctx context.Context) {
	if d == nil {
		return
	}
	close(d.stop)
	select {
	case <-d.done:
	case <-ctx.Done():
	}
	d.manager.Stop(ctx)
}

// Collectors are the decision logs' counters for Prometheus: events dropped
// before the plugin (queue full, or not encodable) and by it (its buffer
// full, its rate limit), and events waiting in its buffer.
func (d *DecisionLog) Collectors() []prometheus.Collector {
	if d == nil {
		return nil
	}
	counter := func(name string) func() float64 {
		return func() float64 { n, _ := d.metrics.Counter(name).Value().(uint64); return float64(n) }
	}
	return []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "nodeguard_decision_logs_dropped_total",
			Help:        "Decision log events dropped before OPA's decision log plugin: its queue was full (logging never waits) or an event could not be encoded.",
			ConstLabels: prometheus.Labels{"where": "queue"}}, func() float64 { return float64(d.dropped.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "nodeguard_decision_logs_dropped_total",
			Help:        "Decision log events dropped before OPA's decision log plugin: its queue was full (logging never waits) or an event could not be encoded.",
			ConstLabels: prometheus.Labels{"where": "buffer"}}, func() float64 {
			return counter("decision_logs_dropped_buffer_size_limit_exceeded")() + counter("decision_logs_dropped_buffer_size_limit_bytes_exceeded")()
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "nodeguard_decision_logs_dropped_total",
			Help:        "Decision log events dropped before OPA's decision log plugin: its queue was full (logging never waits) or an event could not be encoded.",
			ConstLabels: prometheus.Labels{"where": "rate-limit"}}, counter("decision_logs_dropped_rate_limit_exceeded")),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "nodeguard_decision_logs_buffered",
			Help: "Decision log events (or bytes, with buffer_type size) in OPA's plugin buffer, waiting for upload."}, func() float64 {
			_, n := d.plugin.BufferSize()
			return float64(n)
		}),
	}
}
