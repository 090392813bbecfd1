package events

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodeguard/nodeguard/enforcer/metrics"
)

// Why an occurrence (a denial, or an Event nodeguard makes) was not
// recorded as (part of) an Event: the reason label of
// nodeguard_events_dropped_total.
const (
	DropQueueFull   = "queue-full"       // Limits.Queue occurrences were already waiting
	DropPerObject   = "per-object-limit" // its object already had Limits.PerObject live Events
	DropSeries      = "series-limit"     // Limits.Series Events were live
	DropWriteFailed = "write-failed"     // its Event could not be created within twice the window
)

// Writes, the operation label of nodeguard_event_writes_total.
const (
	OpCreate = "create"
	OpPatch  = "patch"
)

// Metrics are the recorder's Prometheus series.
type Metrics struct {
	dropped *prometheus.CounterVec
	writes  *prometheus.CounterVec
	// The names these had while the recorder wrote only denials, kept for
	// a release as Kubernetes components keep a renamed metric: they count
	// the denials' share, as they did.
	deprecatedDropped *prometheus.CounterVec
	deprecatedWrites  *prometheus.CounterVec
}

// deprecatedHelp is how the help of a metric kept under its old name begins
// (internal/monitoring keeps dashboards and alerts off such metrics by it).
const deprecatedHelp = "(Deprecated: goes in a later release; use %s, which counts nodeguard's own Events too.) "

// NewMetrics registers nodeguard_events_dropped_total{reason} and
// nodeguard_event_writes_total{operation,result}, and their deprecated names
// of the denials alone, every label value at zero, so rates and alerts see
// the first increment.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	r := metrics.New(reg)
	const (
		droppedHelp = "not recorded as (part of) an Event, by reason (queue-full, per-object-limit, series-limit, write-failed)."
		writesHelp  = "to an API server, by operation (create, patch of the series count) and result (ok, error)."
	)
	m := &Metrics{
		dropped: r.CounterVec("nodeguard_events_dropped_total",
			"Occurrences (denied Node deletes, nodeguard's own findings and actions) "+droppedHelp, "reason"),
		writes: r.CounterVec("nodeguard_event_writes_total", "Event writes "+writesHelp, "operation", "result"),
		deprecatedDropped: r.CounterVec("nodeguard_denial_events_dropped_total",
			fmt.Sprintf(deprecatedHelp, "nodeguard_events_dropped_total")+"Denied Node deletes "+droppedHelp, "reason"),
		deprecatedWrites: r.CounterVec("nodeguard_denial_event_writes_total",
			fmt.Sprintf(deprecatedHelp, "nodeguard_event_writes_total")+"Event writes for denied Node deletes "+writesHelp, "operation", "result"),
	}
	for _, r := range []string{DropQueueFull, DropPerObject, DropSeries, DropWriteFailed} {
		m.dropped.WithLabelValues(r)
		m.deprecatedDropped.WithLabelValues(r)
	}
	for _, op := range []string{OpCreate, OpPatch} {
		for _, res := range []string{"ok", "error"} {
			m.writes.WithLabelValues(op, res)
			m.deprecatedWrites.WithLabelValues(op, res)
		}
	}
	if err := r.Err("event metrics"); err != nil {
		return nil, err
	}
	return m, nil
}

// drop counts one occurrence not recorded (own: one of nodeguard's own
// Events, not a denial); a nil Metrics counts nothing.
func (m *Metrics) drop(reason string, own bool) { m.dropN(reason, 1, own) }

func (m *Metrics) dropN(reason string, n int32, own bool) {
	if m == nil {
		return
	}
	m.dropped.WithLabelValues(reason).Add(float64(n))
	if !own {
		m.deprecatedDropped.WithLabelValues(reason).Add(float64(n))
	}
}

func (m *Metrics) wrote(op string, err error, own bool) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.writes.WithLabelValues(op, result).Inc()
	if !own {
		m.deprecatedWrites.WithLabelValues(op, result).Inc()
	}
}
