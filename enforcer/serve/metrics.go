package serve

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/events"
	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/fleet"
	"github.com/nodeguard/nodeguard/enforcer/metrics"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// Sources are what nodeguard serve's gauges read at each scrape.
type Sources struct {
	Policy func() rule.Policy
	Cached func() map[schema.GroupVersionKind]int
	// Watched says which kinds the informers watch and why.
	Watched func() []facts.Watched
	Ready   func() error
	// DecisionLog, when on, adds its drops and buffer.
	DecisionLog *rule.DecisionLog
}

// Metrics are the series of every part of nodeguard serve.
type Metrics struct {
	Webhook *admission.WebhookMetrics
	// Intake counts the requests of the review port that got an HTTP
	// error, for the routes that share its Intake.
	Intake  *admission.IntakeMetrics
	Policy  *rule.VersionMetrics
	Orphans *OrphanMetrics
	Events  *events.Metrics
	// Provider counts Gatekeeper's external data requests.
	Provider *admission.ProviderMetrics
	// Fleet holds each workload cluster's guard.
	Fleet *fleet.Metrics
	// Constraint counts the Constraint edits applied and refused.
	Constraint *facts.ConstraintMetrics
}

// Register registers on reg every series nodeguard serve exports, whether or
// not the part that feeds it runs: the alerts and dashboard
// (internal/monitoring) are checked against the names registered here.
func Register(reg prometheus.Registerer, src Sources) (*Metrics, error) {
	r := metrics.New(reg)
	r.GaugeFunc("nodeguard_ready",
		"1 when this replica is ready (every informer synced, /readyz answers ok), else 0; a replica not ready denies the reviews it gets.",
		func() float64 {
			if src.Ready() != nil {
				return 0
			}
			return 1
		})
	r.Collector(collectors.NewGoCollector())
	r.Collector(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if src.Cached != nil {
		r.Collector(cachedObjects{count: src.Cached, desc: prometheus.NewDesc("nodeguard_cached_objects",
			"Objects in the informer caches, by kind.", []string{"group", "version", "kind"}, nil)})
	}
	if src.Watched != nil {
		r.Collector(watchedKinds{watched: src.Watched, desc: prometheus.NewDesc("nodeguard_watched_kinds",
			"Kinds the informers watch (1: synced, 0: not yet, so an absence of them proves nothing), by role and why: referrer (Machine, MachinePool), parameter (infraMachineKinds, infraMachinePoolKinds), referenced (by a cached Machine or MachinePool), contract (a CRD with a Cluster API contract label and spec.providerID or spec.providerIDList).",
			[]string{"group", "version", "kind", "role", "source"}, nil)})
	}
	for _, c := range src.DecisionLog.Collectors() {
		r.Collector(c)
	}
	if err := r.Err("nodeguard serve's metrics"); err != nil {
		return nil, err
	}
	policy, err := rule.RegisterVersion(reg, src.Policy)
	m := &Metrics{
		Policy:     policy,
		Webhook:    register(&err, reg, admission.NewWebhookMetrics),
		Intake:     register(&err, reg, admission.NewIntakeMetrics),
		Orphans:    register(&err, reg, registerOrphanMetrics),
		Events:     register(&err, reg, events.NewMetrics),
		Provider:   register(&err, reg, admission.NewProviderMetrics),
		Fleet:      register(&err, reg, fleet.NewMetrics),
		Constraint: register(&err, reg, facts.NewConstraintMetrics),
	}
	if err != nil {
		return nil, err
	}
	return m, nil
}

// register registers newMetrics' series on reg unless an earlier
// registration failed (*err): the first error stops the rest.
func register[T any](err *error, reg prometheus.Registerer, newMetrics func(prometheus.Registerer) (T, error)) T {
	var m T
	if *err == nil {
		m, *err = newMetrics(reg)
	}
	return m
}

// cachedObjects reads the number of cached objects per kind at each scrape.
type cachedObjects struct {
	count func() map[schema.GroupVersionKind]int
	desc  *prometheus.Desc
}

type watchedKinds struct {
	watched func() []facts.Watched
	desc    *prometheus.Desc
}

func (c watchedKinds) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c watchedKinds) Collect(ch chan<- prometheus.Metric) {
	for _, w := range c.watched() {
		synced := 0.0
		if w.Synced {
			synced = 1
		}
		for _, source := range w.Sources {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, synced, w.GVK.Group, w.GVK.Version, w.GVK.Kind, string(w.Role), source)
		}
	}
}

func (c cachedObjects) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c cachedObjects) Collect(ch chan<- prometheus.Metric) {
	for gvk, n := range c.count() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), gvk.Group, gvk.Version, gvk.Kind)
	}
}
