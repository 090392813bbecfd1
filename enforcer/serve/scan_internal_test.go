package serve

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/enforcer/kube"
)

// An unreachable cluster costs a count per failed request and at most one
// log line per cluster per watchErrorLogEvery, which says how many failed.
func TestWatchErrorsAreCountedAndLoggedSparingly(t *testing.T) {
	metrics, err := kube.NewClusterMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	var logs bytes.Buffer
	w := &watchErrors{metrics: metrics, log: slog.New(slog.NewJSONHandler(&logs, nil)), last: map[string]time.Time{}}
	ctx := context.Background()
	for range 50 {
		w.report(ctx, "fleet/prod-1", errors.New("connection refused"))
	}
	w.report(ctx, "", errors.New("forbidden"))
	assert.Equal(t, 50.0, testutil.ToFloat64(metrics.Errors().WithLabelValues("fleet/prod-1", "watch")))
	assert.Equal(t, 1.0, testutil.ToFloat64(metrics.Errors().WithLabelValues("", "watch")))
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	assert.Len(t, lines, 2, "one line per cluster")
	assert.Contains(t, lines[0], `"cluster":"fleet/prod-1"`)

	w.last["fleet/prod-1"] = time.Now().Add(-watchErrorLogEvery)
	w.report(ctx, "fleet/prod-1", errors.New("connection refused"))
	assert.Contains(t, logs.String(), `"failuresSinceLastLine":50`)

	stopped, cancel := context.WithCancel(ctx)
	cancel()
	w.report(stopped, "fleet/prod-1", errors.New("context canceled"))
	assert.Equal(t, 51.0, testutil.ToFloat64(metrics.Errors().WithLabelValues("fleet/prod-1", "watch")), "a watch ended by stopping is no failure")
}
