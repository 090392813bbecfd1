package admission

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodeguard/nodeguard/enforcer/metrics"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// WebhookMetrics are the review routes' Prometheus metrics.
type WebhookMetrics struct {
	decisions *prometheus.CounterVec
	latency   *prometheus.HistogramVec
}

// NewWebhookMetrics registers nodeguard_decisions_total and
// nodeguard_decision_duration_seconds on reg.
func NewWebhookMetrics(reg prometheus.Registerer) (*WebhookMetrics, error) {
	r := metrics.New(reg)
	m := &WebhookMetrics{
		decisions: r.CounterVec("nodeguard_decisions_total",
			"Admission reviews answered, by result (allowed, denied, error: the answer given), reason (the rule's), route, cluster (the CAPI Cluster NAMESPACE/NAME of a cluster route, \"\" on /validate: as many clusters as the fleet has) "+
				"and enforcement_action (deny, warn, dryrun: a reason that denies, answered allowed, is a denial warn or dryrun admitted).",
			"result", "reason", "route", "cluster", "enforcement_action"),
		latency: r.HistogramVec("nodeguard_decision_duration_seconds",
			"Time to answer one admission review, fresh reads included.",
			metrics.LatencyBuckets(), "route"),
	}
	// Every route's histogram exists from the start, at zero.
	for _, route := range []string{WebhookRouteSelf, WebhookRouteCluster, RouteRegister, RouteRegisterCluster} {
		m.latency.WithLabelValues(route)
	}
	if err := r.Err("review metrics"); err != nil {
		return nil, err
	}
	return m, nil
}

// observe counts one answer; a nil Metrics counts nothing.
func (m *WebhookMetrics) observe(route, cluster, result, reason string, action rule.Action, took time.Duration) {
	if m == nil {
		return
	}
	m.decisions.WithLabelValues(result, reason, route, cluster, string(action)).Inc()
	m.latency.WithLabelValues(route).Observe(took.Seconds())
}
