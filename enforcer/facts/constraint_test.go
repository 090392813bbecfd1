package facts_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

var gvr = schema.GroupVersionResource{Group: "constraints.gatekeeper.sh", Version: "v1beta1", Resource: "k8snodeguard"}

func constraint(name, action string, params map[string]any) *unstructured.Unstructured {
	spec := map[string]any{"parameters": params}
	if action != "" {
		spec["enforcementAction"] = action
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "constraints.gatekeeper.sh/v1beta1", "kind": "K8sNodeGuard",
		"metadata": map[string]any{"name": name}, "spec": spec,
	}}
}

// served is a mapper that knows the Constraint's CRD, or not.
func served(yes bool) meta.RESTMapper {
	m := meta.NewDefaultRESTMapper([]schema.GroupVersion{gvr.GroupVersion()})
	if yes {
		m.AddSpecific(gvr.GroupVersion().WithKind("K8sNodeGuard"), gvr, gvr, meta.RESTScopeRoot)
	}
	return m
}

// client holds objs under Gatekeeper's resource name, k8snodeguard (the
// fake would guess k8snodeguards from the kind).
func client(t *testing.T, objs ...runtime.Object) *dynamicfake.FakeDynamicClient {
	c := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{gvr: "K8sNodeGuardList"})
	for _, o := range objs {
		require.NoError(t, c.Tracker().Create(gvr, o, ""))
	}
	return c
}

func TestFromObject(t *testing.T) {
	s, err := facts.ConstraintSpecOf(constraint("node-deletion-guard", "warn", map[string]any{"exemptUsers": []any{"alice"}}))
	require.NoError(t, err)
	assert.Equal(t, rule.ActionWarn, s.Action)
	assert.Equal(t, map[string]any{"exemptUsers": []any{"alice"}}, s.Parameters)
	assert.Contains(t, s.From, "K8sNodeGuard node-deletion-guard")

	s, err = facts.ConstraintSpecOf(constraint("node-deletion-guard", "", nil))
	require.NoError(t, err)
	assert.Equal(t, rule.Action(""), s.Action, "none set: the flag's stays in force")

	// Gatekeeper's "scoped" names actions per enforcement point, which
	// nodeguard does not read: refused rather than guessed.
	_, err = facts.ConstraintSpecOf(constraint("node-deletion-guard", "scoped", nil))
	assert.ErrorContains(t, err, `spec.enforcementAction: enforcement action "scoped"`)
}

func TestRead(t *testing.T) {
	ctx := context.Background()
	s, err := facts.ReadConstraint(ctx, client(t), served(false), "node-deletion-guard")
	require.NoError(t, err)
	assert.Equal(t, "no K8sNodeGuard.constraints.gatekeeper.sh CRD", s.From)
	assert.Nil(t, s.Parameters)

	s, err = facts.ReadConstraint(ctx, client(t), served(true), "node-deletion-guard")
	require.NoError(t, err)
	assert.Equal(t, "no K8sNodeGuard node-deletion-guard", s.From)

	s, err = facts.ReadConstraint(ctx, client(t, constraint("node-deletion-guard", "dryrun", map[string]any{"exemptGroups": []any{"oncall"}})),
		served(true), "node-deletion-guard")
	require.NoError(t, err)
	assert.Equal(t, rule.ActionDryRun, s.Action)
	assert.Equal(t, []any{"oncall"}, s.Parameters["exemptGroups"])
}

// applied records what Watch puts in force; refuse makes the next Apply fail.
type applied struct {
	mu     sync.Mutex
	specs  []facts.ConstraintSpec
	refuse bool
}

func (a *applied) apply(_ context.Context, s facts.ConstraintSpec) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.refuse {
		return errors.New("refused for the test")
	}
	a.specs = append(a.specs, s)
	return nil
}

func (a *applied) last() (facts.ConstraintSpec, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.specs) == 0 {
		return facts.ConstraintSpec{}, 0
	}
	return a.specs[len(a.specs)-1], len(a.specs)
}

func TestWatchAppliesEachEditOnceAndTheDefaultsOnDelete(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := constraint("node-deletion-guard", "deny", map[string]any{"exemptUsers": []any{"alice"}})
	c := client(t, start, constraint("someone-elses", "dryrun", nil))
	initial, err := facts.ReadConstraint(ctx, c, served(true), "node-deletion-guard")
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	m, err := facts.NewConstraintMetrics(reg)
	require.NoError(t, err)
	var got applied
	done := make(chan struct{})
	go func() {
		defer close(done)
		facts.WatchConstraint(ctx, facts.ConstraintWatchOptions{Client: c, Mapper: served(true), Name: "node-deletion-guard", Applied: initial,
			Apply: got.apply, Metrics: m, Log: slog.New(slog.DiscardHandler)})
	}()
	res := c.Resource(gvr)

	// The Constraint as read at start is in force already: an edit is the
	// first thing applied, another Constraint never.
	edited := constraint("node-deletion-guard", "warn", map[string]any{"exemptUsers": []any{"alice", "bob"}})
	edited.SetResourceVersion("2")
	_, err = res.Update(ctx, edited, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		s, n := got.last()
		assert.Equal(c, 1, n)
		assert.Equal(c, rule.ActionWarn, s.Action)
		assert.Equal(c, []any{"alice", "bob"}, s.Parameters["exemptUsers"])
	}, 5*time.Second, 10*time.Millisecond)
	assert.InDelta(t, 1, counter(t, reg, "nodeguard_constraint_reloads_total"), 0)

	// A refused edit leaves the one before in force, counted as an error.
	got.mu.Lock()
	got.refuse = true
	got.mu.Unlock()
	_, err = res.Update(ctx, constraint("node-deletion-guard", "dryrun", nil), metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return counter(t, reg, "nodeguard_constraint_reload_errors_total") == 1 }, 5*time.Second, 10*time.Millisecond)
	got.mu.Lock()
	got.refuse = false
	got.mu.Unlock()

	require.NoError(t, res.Delete(ctx, "node-deletion-guard", metav1.DeleteOptions{}))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		s, n := got.last()
		assert.Equal(c, 2, n)
		assert.Nil(c, s.Parameters, "deleted: the rule's defaults")
		assert.Equal(c, rule.Action(""), s.Action)
		assert.Equal(c, "K8sNodeGuard node-deletion-guard deleted", s.From)
	}, 5*time.Second, 10*time.Millisecond)
	cancel()
	<-done
}

func TestWatchWaitsForTheCRD(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mapper := &switchable{off: served(false), on: served(true)}
	c := client(t, constraint("node-deletion-guard", "warn", nil))
	reg := prometheus.NewRegistry()
	m, err := facts.NewConstraintMetrics(reg)
	require.NoError(t, err)
	var got applied
	go facts.WatchConstraint(ctx, facts.ConstraintWatchOptions{Client: c, Mapper: mapper, Name: "node-deletion-guard",
		Applied: facts.ConstraintSpec{From: "no CRD"}, Apply: got.apply, Recheck: 10 * time.Millisecond, Metrics: m, Log: slog.New(slog.DiscardHandler)})
	// Gatekeeper creates the CRD from the template later: the Constraint is
	// then read and applied.
	mapper.turnOn()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		s, n := got.last()
		assert.Equal(c, 1, n)
		assert.Equal(c, rule.ActionWarn, s.Action)
	}, 5*time.Second, 10*time.Millisecond)
}

// switchable serves the CRD once turned on.
type switchable struct {
	meta.RESTMapper
	mu      sync.Mutex
	off, on meta.RESTMapper
	isOn    bool
}

func (s *switchable) turnOn() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.isOn = true
}

func (s *switchable) RESTMapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	s.mu.Lock()
	m := s.off
	if s.isOn {
		m = s.on
	}
	s.mu.Unlock()
	return m.RESTMapping(gk, versions...)
}

// counter is a counter's value as reg exports it.
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == name {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
