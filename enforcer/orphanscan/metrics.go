package orphanscan

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// The stages of a judgment: the screen (the criteria that read only the
// Node) and, for Nodes it passes, the full criteria.
const (
	stageScreen = "screen"
	stageFull   = "full"
)

// Metrics are the scan's Prometheus series.
type Metrics struct {
	judgments *prometheus.CounterVec
	errors    prometheus.Counter
}

// NewMetrics registers nodeguard_orphan_judgments_total{stage} and
// nodeguard_orphan_judge_errors_total: with nothing changing, the first
// grows only by the full passes.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		judgments: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeguard_orphan_judgments_total",
			Help: "Nodes judged against the orphan criteria, by stage: screen (what the Node alone decides), full (the inventory too).",
		}, []string{"stage"}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodeguard_orphan_judge_errors_total",
			Help: "Judgments of a Node against the orphan criteria that failed (tried again later).",
		}),
	}
	if err := errors.Join(reg.Register(m.judgments), reg.Register(m.errors)); err != nil {
		return nil, fmt.Errorf("register orphan scan metrics: %w", err)
	}
	return m, nil
}

func (m *Metrics) judged(stage string) {
	if m != nil {
		m.judgments.WithLabelValues(stage).Inc()
	}
}

func (m *Metrics) failed() {
	if m != nil {
		m.errors.Inc()
	}
}
