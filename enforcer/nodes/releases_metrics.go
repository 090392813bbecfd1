package nodes

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodeguard/nodeguard/enforcer/metrics"
)

// ReleaseMetrics are the publisher's Prometheus series, by workload cluster.
type ReleaseMetrics struct {
	writes   *prometheus.CounterVec
	released *prometheus.GaugeVec
	omitted  *prometheus.GaugeVec
}

// NewReleaseMetrics registers nodeguard_release_writes_total{cluster,result},
// nodeguard_released_nodes{cluster} and
// nodeguard_release_omitted_nodes{cluster}: a cluster whose writes fail, or
// whose released Nodes no longer fit the ConfigMap, has Node deletes denied
// there that the rule allows.
func NewReleaseMetrics(reg prometheus.Registerer) (*ReleaseMetrics, error) {
	r := metrics.New(reg)
	m := &ReleaseMetrics{
		writes: r.CounterVec("nodeguard_release_writes_total",
			"Writes of the released Nodes into a workload cluster in mode admission-policy, by result: ok, error (tried again at the next batch).", "cluster", "result"),
		released: r.GaugeVec("nodeguard_released_nodes",
			"Nodes listed as released in a workload cluster at its last write.", "cluster"),
		omitted: r.GaugeVec("nodeguard_release_omitted_nodes",
			"Released Nodes left out of a workload cluster's last write because the ConfigMap was full: their deletes are denied there.", "cluster"),
	}
	if err := r.Err("release metrics"); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *ReleaseMetrics) wrote(cluster string, released, omitted int, err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.writes.WithLabelValues(cluster, "error").Inc()
		return
	}
	m.writes.WithLabelValues(cluster, "ok").Inc()
	m.released.WithLabelValues(cluster).Set(float64(released))
	m.omitted.WithLabelValues(cluster).Set(float64(omitted))
}

func (m *ReleaseMetrics) forget(cluster string) {
	if m == nil {
		return
	}
	for _, result := range []string{"ok", "error"} {
		m.writes.DeleteLabelValues(cluster, result)
	}
	m.released.DeleteLabelValues(cluster)
	m.omitted.DeleteLabelValues(cluster)
}
