package rule

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/internal/testlog"
)

func denial() DecisionEvent {
	return DecisionEvent{
		ID:   NewDecisionID(),
		Path: DecisionEntry.Path(),
		Input: map[string]any{"review": map[string]any{"operation": "DELETE", "name": "md-0-abc",
			"userInfo": map[string]any{"username": "alice", "extra": map[string]any{"authentication.kubernetes.io/credential-id": []string{"JTI=secret"}}}}},
		Result: Decision{Allowed: false, Reason: ReasonBlocked, Messages: []string{"DockerMachine default/md-0-abc still exists"}},
		Policy: Policy{Source: SourceEmbedded, Version: "1.1.2"},
		Time:   time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC),
		Custom: map[string]any{"route": "/validate"},
	}
}

func TestAnEntryPathIsTheDataPath(t *testing.T) {
	assert.Equal(t, "nodeguard/decision", DecisionEntry.Path())
	assert.Equal(t, "nodeguard/orphan_screen", ScreenEntry.Path())
}

// A console decision log line is OPA's event: decision_id, path, input
// with the requester's extra attributes masked, result, bundle revision,
// labels, nodeguard's own context.
func TestTheConsoleGetsOPAsEventMasked(t *testing.T) {
	var out testlog.Buffer
	d, err := StartDecisionLog(context.Background(), DecisionLogOptions{Console: true, ConsoleOutput: &out, ID: "replica-1", Version: "v1.1.2"})
	require.NoError(t, err)
	e := denial()
	d.Log(e)
	lines := out.LinesAfter(t, d.Stop)
	require.Len(t, lines, 1, out.String())
	line := lines[0]
	assert.Equal(t, "Decision Log", line["msg"])
	assert.Equal(t, e.ID, line["decision_id"])
	assert.Equal(t, "nodeguard/decision", line["path"])
	assert.Equal(t, map[string]any{"nodeguard": map[string]any{"revision": "1.1.2"}}, line["bundles"])
	assert.Equal(t, map[string]any{"operation": "DELETE", "name": "md-0-abc", "userInfo": map[string]any{"username": "alice"}},
		line["input"].(map[string]any)["review"])
	assert.Equal(t, []any{"/input/review/userInfo/extra"}, line["erased"])
	assert.NotContains(t, out.String(), "JTI=secret")
	assert.Equal(t, false, line["result"].(map[string]any)["allowed"])
	assert.Equal(t, "blocked", line["result"].(map[string]any)["reason"])
	labels := line["labels"].(map[string]any)
	assert.Equal(t, "replica-1", labels["id"])
	assert.Equal(t, "v1.1.2", labels["nodeguard_version"])
	assert.Equal(t, "nodeguard", labels["app"])
	assert.Equal(t, map[string]any{"route": "/validate"}, line["custom"])
}

// Events go to an HTTP service in OPA's batches (gzip'd JSON arrays),
// with a mask of the operator's own.
func TestAServiceGetsBatches(t *testing.T) {
	var (
		mu     sync.Mutex
		events []map[string]any
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		assert.Equal(t, "/logs", r.URL.Path)
		zr, err := gzip.NewReader(r.Body)
		require.NoError(t, err)
		raw, err := io.ReadAll(zr)
		require.NoError(t, err)
		var batch []map[string]any
		require.NoError(t, json.Unmarshal(raw, &batch))
		mu.Lock()
		events = append(events, batch...)
		mu.Unlock()
	}))
	defer srv.Close()
	cfg := "services:\n  collector:\n    url: " + srv.URL + "\ndecision_logs:\n  service: collector\n  reporting:\n    min_delay_seconds: 1\n    max_delay_seconds: 1\n"
	d, err := StartDecisionLog(context.Background(), DecisionLogOptions{Config: []byte(cfg),
		Mask: "package system.log\n\nmask contains \"/input/review/name\"\n"})
	require.NoError(t, err)
	e := denial()
	d.Log(e)
	d.Log(denial())
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(events) == 2
	}, 10*time.Second, 50*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d.Stop(ctx)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, e.ID, events[0]["decision_id"])
	review := events[0]["input"].(map[string]any)["review"].(map[string]any)
	assert.NotContains(t, review, "name", "the operator's mask")
	assert.Contains(t, review["userInfo"], "extra", "the operator's mask replaces the default")
}

// Logging never waits: a full queue drops the event and counts it; a
// service that is down keeps what its bounded buffer holds and counts what
// falls out of it.
func TestLoggingDropsRatherThanWaits(t *testing.T) {
	d := &DecisionLog{queue: make(chan DecisionEvent, 1)}
	d.Log(denial())
	start := time.Now()
	d.Log(denial())
	assert.Less(t, time.Since(start), 100*time.Millisecond)
	assert.EqualValues(t, 1, d.dropped.Load())

	cfg := "services:\n  collector:\n    url: http://127.0.0.1:1\ndecision_logs:\n  service: collector\n  reporting:\n    buffer_type: event\n    buffer_size_limit_events: 2\n    min_delay_seconds: 60\n    max_delay_seconds: 120\n"
	down, err := StartDecisionLog(context.Background(), DecisionLogOptions{Config: []byte(cfg)})
	require.NoError(t, err)
	for range 5 {
		down.Log(denial())
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(down.Collectors()...)
	require.Eventually(t, func() bool {
		n, err := testutil.GatherAndCount(reg, "nodeguard_decision_logs_dropped_total")
		return err == nil && n == 3 && bufferDrops(t, reg) == 3
	}, 5*time.Second, 20*time.Millisecond, "two kept, three dropped by the buffer")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	down.Stop(ctx)
}

func bufferDrops(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if mf.GetName() == "nodeguard_decision_logs_dropped_total" && l.GetName() == "where" && l.GetValue() == "buffer" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return -1
}

func TestADecisionLogNeedsDecisionLogs(t *testing.T) {
	_, err := StartDecisionLog(context.Background(), DecisionLogOptions{Config: []byte("services: {}\n")})
	assert.ErrorContains(t, err, "no decision_logs section")
	_, err = StartDecisionLog(context.Background(), DecisionLogOptions{Config: []byte("# nothing yet\n")})
	assert.ErrorContains(t, err, "no decision_logs section", "an empty file is no configuration")
	d, err := StartDecisionLog(context.Background(), DecisionLogOptions{Config: []byte("null\n"), Console: true, ConsoleOutput: io.Discard})
	require.NoError(t, err, "nothing but the console")
	d.Stop(context.Background())
	_, err = StartDecisionLog(context.Background(), DecisionLogOptions{Console: true, Mask: "package other\n\nmask contains \"/input\"\n"})
	assert.ErrorContains(t, err, "package other, want system.log")
	var none *DecisionLog
	none.Log(denial()) // off: nothing, no panic
	assert.False(t, none.Enabled())
}

// blockedInput is the size of what a blocked decision read: the review, the
// Node's Machine and InfraMachine as the rule gets them, the parameters.
func blockedInput() map[string]any {
	object := func(kind, name string) map[string]any {
		return map[string]any{"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": kind,
			"metadata": map[string]any{"name": name, "namespace": "default", "uid": "0b7cc6a2-5b1e-4a5a-8d0f-43a1b2c3d4e5",
				"labels": map[string]any{"cluster.x-k8s.io/cluster-name": "dev"}, "deletionTimestamp": nil},
			"spec":   map[string]any{"providerID": "docker:////" + name, "infrastructureRef": map[string]any{"kind": "DockerMachine", "name": name}},
			"status": map[string]any{"nodeRef": map[string]any{"name": name}, "phase": "Running"}}
	}
	return map[string]any{
		"review": map[string]any{"operation": "DELETE", "name": "dev-md-0-abc", "kind": map[string]any{"group": "", "version": "v1", "kind": "Node"},
			"userInfo": map[string]any{"username": "kubernetes-admin", "groups": []any{"system:masters"}},
			"oldObject": map[string]any{"metadata": map[string]any{"name": "dev-md-0-abc", "annotations": map[string]any{
				"cluster.x-k8s.io/machine": "dev-md-0-abc", "cluster.x-k8s.io/cluster-namespace": "default"}},
				"spec": map[string]any{"providerID": "docker:////dev-md-0-abc"}}},
		"inventory": map[string]any{"namespace": map[string]any{"default": map[string]any{
			"cluster.x-k8s.io/v1beta2":                map[string]any{"Machine": map[string]any{"dev-md-0-abc": object("Machine", "dev-md-0-abc")}},
			"infrastructure.cluster.x-k8s.io/v1beta2": map[string]any{"DockerMachine": map[string]any{"dev-md-0-abc": object("DockerMachine", "dev-md-0-abc")}}}}},
		"parameters": map[string]any{"exemptGroups": []any{}, "exemptUsers": []any{}},
	}
}

// BenchmarkDecisionLogEvent is the decision log's work per event, on its
// own goroutine, to an HTTP service: what logging takes from the cores a
// decision shares.
func BenchmarkDecisionLogEvent(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(io.Discard, r.Body) }))
	defer srv.Close()
	cfg := "services:\n  c:\n    url: " + srv.URL + "\ndecision_logs:\n  service: c\n  reporting:\n    buffer_type: event\n    buffer_size_limit_events: 1000000\n    min_delay_seconds: 1\n    max_delay_seconds: 1\n"
	d, err := StartDecisionLog(context.Background(), DecisionLogOptions{Config: []byte(cfg), Queue: b.N + 1})
	require.NoError(b, err)
	e := denial()
	in := blockedInput()
	params, err := NewParameters(in["parameters"].(map[string]any))
	require.NoError(b, err)
	e.Input = Input{Review: in["review"].(map[string]any), Inventory: in["inventory"].(map[string]any), Parameters: params}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		d.Log(e)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d.Stop(ctx)
}
