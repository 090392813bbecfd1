package nodes

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodeguard/nodeguard/enforcer/metrics"
)

// The stages of a judgment: the screen (the criteria that read only the
// Node) and, for Nodes it passes, the full criteria.
const (
	stageScreen = "screen"
	stageFull   = "full"
)

// ScanMetrics are the scan's Prometheus series.
type ScanMetrics struct {
	judgments *prometheus.CounterVec
	errors    prometheus.Counter
}

// NewScanMetrics registers nodeguard_orphan_judgments_total{stage} and
// nodeguard_orphan_judge_errors_total: with nothing changing, the first
// grows only by the full passes.
func NewScanMetrics(reg prometheus.Registerer) (*ScanMetrics, error) {
	r := metrics.New(reg)
	m := &ScanMetrics{
		judgments: r.CounterVec("nodeguard_orphan_judgments_total",
			"Nodes judged against the orphan criteria, by stage: screen (what the Node alone decides), full (the inventory too).", "stage"),
		errors: r.Counter("nodeguard_orphan_judge_errors_total",
			"Judgments of a Node against the orphan criteria that failed (tried again later)."),
	}
	if err := r.Err("orphan scan metrics"); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *ScanMetrics) judged(stage string) {
	if m != nil {
		m.judgments.WithLabelValues(stage).Inc()
	}
}

func (m *ScanMetrics) failed() {
	if m != nil {
		m.errors.Inc()
	}
}
