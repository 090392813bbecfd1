package admission

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodeguard/nodeguard/enforcer/metrics"
)

// ProviderMetrics are the provider's Prometheus metrics, all prefixed
// nodeguard_externaldata_. Requests answered with an HTTP error are also
// counted by reason in nodeguard_rejected_requests_total (intake).
type ProviderMetrics struct {
	requests  *prometheus.CounterVec
	keys      *prometheus.CounterVec
	keyErrors *prometheus.CounterVec
	duration  *prometheus.HistogramVec
}

// NewProviderMetrics registers the metrics on reg.
func NewProviderMetrics(reg prometheus.Registerer) (*ProviderMetrics, error) {
	r := metrics.New(reg)
	m := &ProviderMetrics{
		requests: r.CounterVec("nodeguard_externaldata_requests_total",
			"External data requests from Gatekeeper, by route and result (answered, rejected: an HTTP error, error: no answer could be written).", "route", "result"),
		keys: r.CounterVec("nodeguard_externaldata_keys_total",
			"Keys (one per Node DELETE review) answered, by route, with facts or an error.", "route"),
		keyErrors: r.CounterVec("nodeguard_externaldata_key_errors_total",
			"Keys answered with an error instead of facts (Gatekeeper then denies the delete), by route and reason.", "route", "reason"),
		duration: r.HistogramVec("nodeguard_externaldata_request_duration_seconds",
			"Time to answer one external data request, fresh reads included.",
			metrics.LatencyBuckets(), "route"),
	}
	if err := r.Err("external data metrics"); err != nil {
		return nil, err
	}
	return m, nil
}

// request counts one request; a nil Metrics counts nothing.
func (m *ProviderMetrics) request(route, result string, took time.Duration) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(route, result).Inc()
	m.duration.WithLabelValues(route).Observe(took.Seconds())
}

// key counts one key answered, with err when it got no facts.
func (m *ProviderMetrics) key(route string, err *keyError) {
	if m == nil {
		return
	}
	m.keys.WithLabelValues(route).Inc()
	if err != nil {
		m.keyErrors.WithLabelValues(route, err.reason).Inc()
	}
}
