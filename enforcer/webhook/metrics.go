package webhook

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeguard/nodeguard/enforcer/intake"
)

// Metrics are the webhook's Prometheus metrics, all prefixed nodeguard_.
type Metrics struct {
	decisions *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	// Intake counts the requests of the port that got an HTTP error; share
	// it with the Intake the routes share.
	Intake *intake.Metrics
}

// NewMetrics registers the metrics on reg, with the Intake's. cached, when
// set, is read at each scrape for the number of cached objects per kind.
func NewMetrics(reg prometheus.Registerer, cached func() map[schema.GroupVersionKind]int) (*Metrics, error) {
	in, err := intake.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	m := &Metrics{
		Intake: in,
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeguard_decisions_total",
			Help: "Admission reviews answered, by result (allowed, denied, error), reason and route.",
		}, []string{"result", "reason", "route"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "nodeguard_decision_duration_seconds",
			Help: "Time to answer one admission review, fresh reads included.",
			// From the cache path (~0.5 ms) to the request deadline (4 s).
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"route"}),
	}
	// Both routes' histograms exist from the start, at zero.
	for _, route := range []string{RouteSelf, RouteCluster} {
		m.latency.WithLabelValues(route)
	}
	collectors := []prometheus.Collector{m.decisions, m.latency}
	if cached != nil {
		collectors = append(collectors, cachedObjects{count: cached, desc: prometheus.NewDesc("nodeguard_cached_objects",
			"Objects in the informer caches, by kind.", []string{"group", "version", "kind"}, nil)})
	}
	for _, c := range collectors {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	return m, nil
}

// observe counts one answer; a nil Metrics counts nothing.
func (m *Metrics) observe(route, result, reason string, took time.Duration) {
	if m == nil {
		return
	}
	m.decisions.WithLabelValues(result, reason, route).Inc()
	m.latency.WithLabelValues(route).Observe(took.Seconds())
}

// intake is the Intake's share of m; nil counts nothing.
func (m *Metrics) intake() *intake.Metrics {
	if m == nil {
		return nil
	}
	return m.Intake
}

type cachedObjects struct {
	count func() map[schema.GroupVersionKind]int
	desc  *prometheus.Desc
}

func (c cachedObjects) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c cachedObjects) Collect(ch chan<- prometheus.Metric) {
	for gvk, n := range c.count() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), gvk.Group, gvk.Version, gvk.Kind)
	}
}
