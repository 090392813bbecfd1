package facts

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodeguard/nodeguard/enforcer/metrics"
)

// TombstoneMetrics are the tombstones' Prometheus series.
type TombstoneMetrics struct {
	held    prometheus.Gauge
	evicts  prometheus.Counter
	writes  *prometheus.CounterVec
	ignored prometheus.Counter
}

// NewTombstoneMetrics registers nodeguard_tombstones, nodeguard_tombstones_evicted_total,
// nodeguard_tombstone_writes_total{result} and
// nodeguard_tombstone_reads_unreadable_total.
func NewTombstoneMetrics(reg prometheus.Registerer) (*TombstoneMetrics, error) {
	r := metrics.New(reg)
	m := &TombstoneMetrics{
		held: r.GaugeVec("nodeguard_tombstones",
			"providerIDs tombstoned now: what carried them went away within the window (ghost Nodes are judged against them).").WithLabelValues(),
		evicts: r.Counter("nodeguard_tombstones_evicted_total",
			"Tombstones dropped before their window ended, the oldest first, to stay within --ghost-tombstones-max or the ConfigMap's size."),
		writes: r.CounterVec("nodeguard_tombstone_writes_total",
			"Writes of the tombstones' ConfigMap, by result (ok, conflict: someone else wrote it first, error).", "result"),
		ignored: r.Counter("nodeguard_tombstone_reads_unreadable_total",
			"Reads of the tombstones' ConfigMap that could not be decoded: nodeguard keeps what it has and does not write over it."),
	}
	if err := r.Err("tombstone metrics"); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *TombstoneMetrics) set(n int) {
	if m != nil {
		m.held.Set(float64(n))
	}
}

func (m *TombstoneMetrics) evicted(n int) {
	if m != nil && n > 0 {
		m.evicts.Add(float64(n))
	}
}

func (m *TombstoneMetrics) wrote(result string) {
	if m != nil {
		m.writes.WithLabelValues(result).Inc()
	}
}

func (m *TombstoneMetrics) unreadable() {
	if m != nil {
		m.ignored.Inc()
	}
}
