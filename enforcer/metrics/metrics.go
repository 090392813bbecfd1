// Package metrics declares a package's Prometheus metrics in one line
// each and registers them as it goes, keeping the first errors: every
// NewMetrics then reads as the list of its metrics' names and help.
//
// It is small and stands alone because every layer registers metrics and it
// must import none of them.
package metrics

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Registrar registers on one Registerer; it is not safe for concurrent use
// (a NewMetrics runs once, at start-up).
type Registrar struct {
	reg prometheus.Registerer
	err error
}

// New returns a Registrar for reg.
func New(reg prometheus.Registerer) *Registrar { return &Registrar{reg: reg} }

// Counter registers a counter without labels.
func (r *Registrar) Counter(name, help string) prometheus.Counter {
	return register(r, prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help}))
}

// CounterVec registers a counter with labels.
func (r *Registrar) CounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return register(r, prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels))
}

// GaugeVec registers a gauge with labels.
func (r *Registrar) GaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return register(r, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels))
}

// HistogramVec registers a histogram with labels.
func (r *Registrar) HistogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return register(r, prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels))
}

// GaugeFunc registers a gauge without labels whose value f gives at each
// scrape.
func (r *Registrar) GaugeFunc(name, help string, f func() float64) prometheus.GaugeFunc {
	return register(r, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f))
}

// Info registers a gauge that is always 1, its constant labels saying what
// runs (the *_info convention).
func (r *Registrar) Info(name, help string, labels prometheus.Labels) {
	g := register(r, prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}))
	g.Set(1)
}

// Collector registers a collector of its own (series read at each scrape,
// the runtime's).
func (r *Registrar) Collector(c prometheus.Collector) { register(r, c) }

// LatencyBuckets are the buckets of a request's answer time: from a cached
// answer (~0.1-0.5 ms) to past the 4 s request deadline.
func LatencyBuckets() []float64 {
	return []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}
}

// Err returns every registration that failed, wrapped with what (e.g.
// "orphan scan metrics"); nil when all were registered.
func (r *Registrar) Err(what string) error {
	if r.err != nil {
		return fmt.Errorf("register %s: %w", what, r.err)
	}
	return nil
}

func register[C prometheus.Collector](r *Registrar, c C) C {
	r.err = errors.Join(r.err, r.reg.Register(c))
	return c
}
