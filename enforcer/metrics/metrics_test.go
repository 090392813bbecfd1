package metrics_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/enforcer/metrics"
)

func TestMetricsAreRegisteredAsDeclared(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := metrics.New(reg)
	r.Counter("a_total", "A.").Inc()
	r.CounterVec("b_total", "B.", "x").WithLabelValues("1").Add(2)
	r.GaugeVec("c", "C.", "y").WithLabelValues("2").Set(3)
	r.HistogramVec("d_seconds", "D.", []float64{1}, "z").WithLabelValues("3").Observe(0.5)
	require.NoError(t, r.Err("test metrics"))
	assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP a_total A.
# TYPE a_total counter
a_total 1
# HELP b_total B.
# TYPE b_total counter
b_total{x="1"} 2
# HELP c C.
# TYPE c gauge
c{y="2"} 3
# HELP d_seconds D.
# TYPE d_seconds histogram
d_seconds_bucket{z="3",le="1"} 1
d_seconds_bucket{z="3",le="+Inf"} 1
d_seconds_sum{z="3"} 0.5
d_seconds_count{z="3"} 1
`)))
}

// A name registered twice is an error naming what was being registered,
// not a panic.
func TestADuplicateIsAnError(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := metrics.New(reg)
	r.Counter("a_total", "A.")
	r.Counter("a_total", "A.")
	assert.ErrorContains(t, r.Err("test metrics"), "register test metrics: duplicate metrics collector registration attempted")
}
