package webhook

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the review routes' Prometheus metrics.
type Metrics struct {
	decisions *prometheus.CounterVec
	latency   *prometheus.HistogramVec
}

// NewMetrics registers nodeguard_decisions_total and
// nodeguard_decision_duration_seconds on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
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
	for _, c := range []prometheus.Collector{m.decisions, m.latency} {
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
