package provider

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the provider's Prometheus metrics, all prefixed
// nodeguard_externaldata_. Requests answered with an HTTP error are also
// counted by reason in nodeguard_rejected_requests_total (intake).
type Metrics struct {
	requests  *prometheus.CounterVec
	keys      *prometheus.CounterVec
	keyErrors *prometheus.CounterVec
	duration  *prometheus.HistogramVec
}

// NewMetrics registers the metrics on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeguard_externaldata_requests_total",
			Help: "External data requests from Gatekeeper, by route and result (answered, rejected: an HTTP error, error: no answer could be written).",
		}, []string{"route", "result"}),
		keys: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeguard_externaldata_keys_total",
			Help: "Keys (one per Node DELETE review) answered, by route, with facts or an error.",
		}, []string{"route"}),
		keyErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeguard_externaldata_key_errors_total",
			Help: "Keys answered with an error instead of facts (Gatekeeper then denies the delete), by route and reason.",
		}, []string{"route", "reason"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "nodeguard_externaldata_request_duration_seconds",
			Help: "Time to answer one external data request, fresh reads included.",
			// From a cached answer (~0.1 ms) to the request deadline.
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"route"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.keys, m.keyErrors, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	return m, nil
}

// request counts one request; a nil Metrics counts nothing.
func (m *Metrics) request(route, result string, took time.Duration) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(route, result).Inc()
	m.duration.WithLabelValues(route).Observe(took.Seconds())
}

// key counts one key answered, with err when it got no facts.
func (m *Metrics) key(route string, err *keyError) {
	if m == nil {
		return
	}
	m.keys.WithLabelValues(route).Inc()
	if err != nil {
		m.keyErrors.WithLabelValues(route, err.reason).Inc()
	}
}
