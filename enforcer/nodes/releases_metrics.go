package nodes

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodeguard/nodeguard/enforcer/metrics"
)

// ReleaseMetrics are the publisher's Prometheus series, by workload cluster.
type ReleaseMetrics struct {
	writes   *prometheus.CounterVec
	releases *prometheus.GaugeVec
}

// NewReleaseMetrics registers nodeguard_release_writes_total{cluster,result}
// and nodeguard_released_nodes{cluster}: a cluster whose writes fail has
// Node deletes denied there that the rule allows.
func NewReleaseMetrics(reg prometheus.Registerer) (*ReleaseMetrics, error) {
	r := metrics.New(reg)
	m := &ReleaseMetrics{
		writes: r.CounterVec("nodeguard_release_writes_total",
			"Verdicts written on Nodes of a workload cluster in mode admission-policy, by result: ok, error (tried again after a backoff).", "cluster", "result"),
		releases: r.GaugeVec("nodeguard_released_nodes",
			"Nodes of a workload cluster carrying nodeguard's release, as last written.", "cluster"),
	}
	if err := r.Err("release metrics"); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *ReleaseMetrics) wrote(cluster string, err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.writes.WithLabelValues(cluster, result).Inc()
}

func (m *ReleaseMetrics) released(cluster string, n int) {
	if m != nil {
		m.releases.WithLabelValues(cluster).Set(float64(n))
	}
}

func (m *ReleaseMetrics) forget(cluster string) {
	if m == nil {
		return
	}
	for _, result := range []string{"ok", "error"} {
		m.writes.DeleteLabelValues(cluster, result)
	}
	m.releases.DeleteLabelValues(cluster)
}

// Writes is the counter of a cluster's writes with result (for tests and
// checks of the series' names).
func (m *ReleaseMetrics) Writes(cluster, result string) prometheus.Counter {
	return m.writes.WithLabelValues(cluster, result)
}
