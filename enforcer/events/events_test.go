package events

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	eventsv1client "k8s.io/client-go/kubernetes/typed/events/v1"
	clienttesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/nodeguard/nodeguard/enforcer/rule"
)

var start = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// blocked is a denial of Node node by user, as the rule words it.
func blocked(node, user string) Denial {
	return Denial{Node: node, NodeUID: "uid-node", User: user, Reason: rule.ReasonBlocked,
		Messages: []string{fmt.Sprintf("Node %q cannot be deleted: DockerMachine default/%s (infrastructure.cluster.x-k8s.io) still exists.", node, node)},
		Blockers: []rule.Blocker{{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Kind: "DockerMachine", Namespace: "default", Name: node,
			Links: []rule.BlockerLink{{Type: "machineNodeRef", Machine: "default/" + node}}}}}
}

type fixture struct {
	r       *Recorder
	clock   *testingclock.FakeClock
	kube    *fake.Clientset
	metrics *Metrics
	ctx     context.Context
}

func newFixture(t *testing.T, opts Options) *fixture {
	t.Helper()
	f := &fixture{clock: testingclock.NewFakeClock(start), kube: fake.NewClientset(), ctx: context.Background()}
	var err error
	f.metrics, err = NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	if opts.Events == nil {
		opts.Events = f.kube.EventsV1()
	}
	opts.Clock, opts.Metrics, opts.Instance = f.clock, f.metrics, "nodeguard-0"
	f.r, err = New(opts)
	require.NoError(t, err)
	return f
}

// events lists the Events the fake API server holds in namespace ns.
func events(t *testing.T, c eventsv1client.EventsV1Interface, ns string) []eventsv1.Event {
	t.Helper()
	list, err := c.Events(ns).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	return list.Items
}

func (f *fixture) dropped(reason string) float64 {
	return testutil.ToFloat64(f.metrics.dropped.WithLabelValues(reason))
}

func (f *fixture) writes(op, result string) float64 {
	return testutil.ToFloat64(f.metrics.writes.WithLabelValues(op, result))
}

// A burst of 30 identical denials is one Event: created at once, its series
// count written within one patch interval, the API written twice.
func TestBurstIsOneEventWithItsCount(t *testing.T) {
	f := newFixture(t, Options{})
	for range 30 {
		f.r.observe(denied(blocked("md-0-a", "alice")))
	}
	f.r.flush(f.ctx)
	got := events(t, f.kube.EventsV1(), "default")
	require.Len(t, got, 1)
	ev := got[0]
	assert.Equal(t, Reason, ev.Reason)
	assert.Equal(t, corev1.EventTypeWarning, ev.Type)
	assert.Equal(t, Action, ev.Action)
	assert.Equal(t, Controller, ev.ReportingController)
	assert.Equal(t, "nodeguard-0", ev.ReportingInstance)
	assert.Equal(t, corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: "md-0-a", UID: "uid-node"}, ev.Regarding)
	require.NotNil(t, ev.Related)
	assert.Equal(t, corev1.ObjectReference{APIVersion: "infrastructure.cluster.x-k8s.io/v1beta2", Kind: "DockerMachine", Namespace: "default", Name: "md-0-a"}, *ev.Related)
	assert.Equal(t, `Delete by "alice" denied (blocked): Node "md-0-a" cannot be deleted: DockerMachine default/md-0-a (infrastructure.cluster.x-k8s.io) still exists.`, ev.Note)
	require.NotNil(t, ev.Series, "the 30 were aggregated before the first write")
	assert.EqualValues(t, 30, ev.Series.Count)

	// More of the same: counted, written once per interval.
	for range 5 {
		f.r.observe(denied(blocked("md-0-a", "alice")))
	}
	f.r.flush(f.ctx)
	assert.EqualValues(t, 30, events(t, f.kube.EventsV1(), "default")[0].Series.Count, "not before the patch interval")
	f.clock.Step(f.r.Limits().PatchInterval)
	f.r.flush(f.ctx)
	got = events(t, f.kube.EventsV1(), "default")
	require.Len(t, got, 1)
	assert.EqualValues(t, 35, got[0].Series.Count)
	assert.Equal(t, 1.0, f.writes(OpCreate, "ok"))
	assert.Equal(t, 1.0, f.writes(OpPatch, "ok"))
	f.clock.Step(f.r.Limits().PatchInterval)
	f.r.flush(f.ctx)
	assert.Equal(t, 1.0, f.writes(OpPatch, "ok"), "nothing new, nothing written")
}

// Another user (another note) is another Event; a Node gets at most
// PerObject live Events; Series bounds them all; the rest is counted.
func TestBoundsPerNodeAndOverall(t *testing.T) {
	f := newFixture(t, Options{Limits: Limits{PerObject: 3, Series: 5}})
	for i := range 5 {
		f.r.observe(denied(blocked("md-0-a", fmt.Sprintf("user-%d", i))))
	}
	assert.Equal(t, 2.0, f.dropped(DropPerObject))
	for _, n := range []string{"md-0-b", "md-0-c", "md-0-d"} {
		f.r.observe(denied(blocked(n, "alice")))
	}
	assert.Equal(t, 1.0, f.dropped(DropSeries), "3 + 2 live, the sixth is dropped")
	f.r.flush(f.ctx)
	got := events(t, f.kube.EventsV1(), "default")
	assert.Len(t, got, 5)
	users := map[string]bool{}
	for _, ev := range got {
		if ev.Regarding.Name == "md-0-a" {
			users[strings.Split(ev.Note, `"`)[1]] = true
		}
	}
	assert.Equal(t, map[string]bool{"user-0": true, "user-1": true, "user-2": true}, users)
}

// Denials and nodeguard's own Events have budgets of their own: a flood of
// denials (anyone who can send reviews can make one) that fills its series
// and a Node's per-object bound leaves room for a GhostNode on that Node.
func TestAFloodOfDenialsLeavesRoomForOwnEvents(t *testing.T) {
	f := newFixture(t, Options{Limits: Limits{PerObject: 2, Series: 3}})
	for i := range 6 {
		f.r.observe(denied(blocked(fmt.Sprintf("md-0-%d", i/2), fmt.Sprintf("user-%d", i))))
	}
	f.r.observe(denied(blocked("md-0-0", "mallory")))
	assert.Equal(t, 4.0, f.dropped(DropSeries)+f.dropped(DropPerObject), "the denials' budget is full")
	f.r.In("", nil).Eventf(&corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: "md-0-0", UID: "uid-node"}, nil,
		corev1.EventTypeWarning, "GhostNode", "Detect", "ghost")
	f.observeQueued()
	f.r.flush(f.ctx)
	var ghost int
	for _, e := range events(t, f.kube.EventsV1(), "default") {
		if e.Reason == "GhostNode" && e.Regarding.Name == "md-0-0" {
			ghost++
		}
	}
	assert.Equal(t, 1, ghost, "the GhostNode Event is written")
	assert.Equal(t, 4.0, f.dropped(DropSeries)+f.dropped(DropPerObject), "and nothing else dropped")
	// The names these series had while only denials were recorded still
	// count the denials alone.
	deprecated := func(v *prometheus.CounterVec, labels ...string) float64 {
		return testutil.ToFloat64(v.WithLabelValues(labels...))
	}
	assert.Equal(t, 4.0, deprecated(f.metrics.deprecatedDropped, DropSeries)+deprecated(f.metrics.deprecatedDropped, DropPerObject))
	assert.Equal(t, f.writes(OpCreate, "ok")-1, deprecated(f.metrics.deprecatedWrites, OpCreate, "ok"), "every create but the GhostNode's")
}

// A cluster whose write fails is not tried again within the same flush: an
// unreachable workload cluster (each try waits for its timeout) does not
// hold up the Events of the others.
func TestAFailingClusterIsTriedOncePerFlush(t *testing.T) {
	f := newFixture(t, Options{})
	down := fake.NewClientset()
	tries := 0
	down.PrependReactor("create", "events", func(clienttesting.Action) (bool, runtime.Object, error) {
		tries++
		return true, nil, errors.New("dial tcp: i/o timeout")
	})
	up := fake.NewClientset()
	for i := range 3 {
		ref := &corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: fmt.Sprintf("n-%d", i)}
		f.r.In("fleet/down", down.EventsV1()).Eventf(ref, nil, corev1.EventTypeNormal, "OrphanNodeDeleted", "Delete", "deleted")
		f.clock.Step(time.Millisecond)
		f.r.In("fleet/up", up.EventsV1()).Eventf(ref, nil, corev1.EventTypeNormal, "OrphanNodeDeleted", "Delete", "deleted")
		f.clock.Step(time.Millisecond)
		f.observeQueued()
	}
	f.r.flush(f.ctx)
	assert.Len(t, events(t, up.EventsV1(), "default"), 3, "the reachable cluster's Events are all written")
	assert.Equal(t, 1, tries, "the unreachable cluster tried once")
	f.clock.Step(time.Second)
	f.r.flush(f.ctx)
	assert.Equal(t, 2, tries, "its next Event on the next flush, once")
}

// Every write takes a token from one bucket: a flood of Nodes is written as
// the bucket refills, oldest first.
func TestWritesShareOneBucket(t *testing.T) {
	f := newFixture(t, Options{Limits: Limits{WritesPerSecond: 1, WriteBurst: 2}})
	for i := range 5 {
		f.r.observe(denied(blocked(fmt.Sprintf("md-0-%d", i), "alice")))
		f.clock.Step(time.Millisecond)
	}
	f.r.flush(f.ctx)
	got := events(t, f.kube.EventsV1(), "default")
	require.Len(t, got, 2)
	assert.ElementsMatch(t, []string{"md-0-0", "md-0-1"}, []string{got[0].Regarding.Name, got[1].Regarding.Name}, "oldest first")
	f.clock.Step(time.Second)
	f.r.flush(f.ctx)
	assert.Len(t, events(t, f.kube.EventsV1(), "default"), 3, "one more token a second")
	f.clock.Step(2 * time.Second)
	f.r.flush(f.ctx)
	assert.Len(t, events(t, f.kube.EventsV1(), "default"), 5)
}

// Record never blocks: past the queue's size denials are dropped, counted.
func TestFullQueueDrops(t *testing.T) {
	f := newFixture(t, Options{Limits: Limits{Queue: 4}})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 7 {
			f.r.Record(blocked("md-0-a", "alice"))
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Record blocked with nothing draining the queue")
	}
	assert.Equal(t, 3.0, f.dropped(DropQueueFull))
}

// An Event untouched for a window ends; the next denial starts another. One
// whose API copy was removed (the API server's event TTL) is created again.
func TestWindowAndRecreate(t *testing.T) {
	f := newFixture(t, Options{})
	f.r.observe(denied(blocked("md-0-a", "alice")))
	f.r.flush(f.ctx)
	first := events(t, f.kube.EventsV1(), "default")
	require.Len(t, first, 1)

	require.NoError(t, f.kube.EventsV1().Events("default").Delete(f.ctx, first[0].Name, metav1.DeleteOptions{}))
	f.clock.Step(time.Minute)
	f.r.observe(denied(blocked("md-0-a", "alice")))
	f.r.flush(f.ctx)
	again := events(t, f.kube.EventsV1(), "default")
	require.Len(t, again, 1, "the patch found no Event: created again")
	assert.EqualValues(t, 2, again[0].Series.Count)
	assert.Equal(t, 2.0, f.writes(OpCreate, "ok"), "counted as a create")
	assert.Zero(t, f.writes(OpPatch, "ok")+f.writes(OpPatch, "error"))

	f.clock.Step(f.r.Limits().Window)
	f.r.flush(f.ctx)
	f.r.observe(denied(blocked("md-0-a", "alice")))
	f.r.flush(f.ctx)
	assert.Len(t, events(t, f.kube.EventsV1(), "default"), 2, "the window ended: a new Event")
}

// An API server that refuses every write: the Event is retried once per
// patch interval, and given up (its denials counted) after twice the window.
func TestWritesThatKeepFailing(t *testing.T) {
	f := newFixture(t, Options{})
	f.kube.PrependReactor("create", "events", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("etcdserver: request timed out")
	})
	for range 3 {
		f.r.observe(denied(blocked("md-0-a", "alice")))
	}
	f.r.flush(f.ctx)
	f.r.flush(f.ctx)
	assert.Equal(t, 1.0, f.writes(OpCreate, "error"), "no retry before the patch interval")
	f.clock.Step(f.r.Limits().PatchInterval)
	f.r.flush(f.ctx)
	assert.Equal(t, 2.0, f.writes(OpCreate, "error"))
	assert.Zero(t, f.dropped(DropWriteFailed))
	f.clock.Step(2 * f.r.Limits().Window)
	f.r.flush(f.ctx)
	assert.Equal(t, 3.0, f.dropped(DropWriteFailed), "the three denials it held")
	f.r.mu.Lock()
	defer f.r.mu.Unlock()
	assert.Empty(t, f.r.series)
	assert.Empty(t, f.r.perObject)
}

// A workload route's denial goes on the Node in that workload cluster; when
// nodeguard cannot reach it, on the Machine the denial names in the
// management cluster, else on the Cluster.
func TestWorkloadClusterOrManagementFallback(t *testing.T) {
	workload := fake.NewClientset()
	reachable := map[string]bool{"fleet/prod-1": true}
	resolved := 0
	f := newFixture(t, Options{
		Workload: func(_ context.Context, cluster string) (eventsv1client.EventsV1Interface, error) {
			if reachable[cluster] {
				return workload.EventsV1(), nil
			}
			return nil, errors.New(`secret "prod-2-kubeconfig" not found`)
		},
		Resolve: func(_ context.Context, gk schema.GroupKind, ns, name string) corev1.ObjectReference {
			resolved++
			return corev1.ObjectReference{APIVersion: gk.Group + "/v1beta2", Kind: gk.Kind, Namespace: ns, Name: name, UID: types.UID("uid-" + name)}
		},
	})
	d := blocked("md-0-a", "kubernetes-admin")
	d.Cluster = "fleet/prod-1"
	f.r.observe(denied(d))
	d.Cluster = "fleet/prod-2"
	f.r.observe(denied(d))
	notReady := Denial{Cluster: "fleet/prod-3", Node: "md-0-b", User: "kubernetes-admin", Reason: rule.ReasonNotReady, Messages: []string{"not ready"}}
	f.r.observe(denied(notReady))
	f.r.flush(f.ctx)

	inWorkload := events(t, workload.EventsV1(), "default")
	require.Len(t, inWorkload, 1)
	assert.Equal(t, "Node", inWorkload[0].Regarding.Kind)
	assert.Nil(t, inWorkload[0].Related, "the blocker is not in the workload cluster")

	onMachine := events(t, f.kube.EventsV1(), "default")
	require.Len(t, onMachine, 1)
	assert.Equal(t, corev1.ObjectReference{APIVersion: "cluster.x-k8s.io/v1beta2", Kind: "Machine", Namespace: "default", Name: "md-0-a", UID: "uid-md-0-a"}, onMachine[0].Regarding)
	assert.True(t, strings.HasPrefix(onMachine[0].Note, `Node "md-0-a" of workload cluster fleet/prod-2: Delete by "kubernetes-admin" denied (blocked)`), onMachine[0].Note)
	require.NotNil(t, onMachine[0].Related)
	assert.Equal(t, "DockerMachine", onMachine[0].Related.Kind)

	onCluster := events(t, f.kube.EventsV1(), "fleet")
	require.Len(t, onCluster, 1)
	assert.Equal(t, "Cluster", onCluster[0].Regarding.Kind)
	assert.Equal(t, "prod-3", onCluster[0].Regarding.Name)
	assert.Equal(t, 2, resolved)
}

// The API server refuses a note over 1 KiB: a long message is cut, on a
// character boundary.
func TestNoteFitsTheAPI(t *testing.T) {
	d := blocked("md-0-a", "alice")
	d.Messages = []string{strings.Repeat("é", 2000)}
	n := Note(d)
	assert.LessOrEqual(t, len(n), NoteMax)
	assert.True(t, utf8.ValidString(n))
	assert.True(t, strings.HasSuffix(n, "..."))
	assert.Equal(t, Note(blocked("md-0-a", "alice")), truncate(Note(blocked("md-0-a", "alice"))), "a short note is kept whole")
}

// Run aggregates and writes in the background: a recorded denial becomes an
// Event without any call but Record.
func TestRunWritesInTheBackground(t *testing.T) {
	kube := fake.NewClientset()
	r, err := New(Options{Events: kube.EventsV1()})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	r.Record(blocked("md-0-a", "alice"))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		list, err := kube.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
		require.NoError(c, err)
		assert.Len(c, list.Items, 1)
	}, 5*time.Second, 10*time.Millisecond)
}

// What the webhook's goroutine pays per denial: one non-blocking send, taken
// (measured with its receive) or, the queue full, dropped and counted.
// go test ./enforcer/events/ -run '^$' -bench Record
func BenchmarkRecord(b *testing.B) {
	m, err := NewMetrics(prometheus.NewRegistry())
	require.NoError(b, err)
	r, err := New(Options{Events: fake.NewClientset().EventsV1(), Metrics: m})
	require.NoError(b, err)
	d := blocked("md-0-a", "alice")
	b.Run("taken", func(b *testing.B) {
		for b.Loop() {
			r.Record(d)
			<-r.queue
		}
	})
	b.Run("queue-full", func(b *testing.B) {
		for range r.Limits().Queue {
			r.Record(d)
		}
		for b.Loop() {
			r.Record(d)
		}
	})
}

// A denial the enforcement action warn admitted is its own Event, saying so.
func TestAWarnAdmittedDenialSaysItWouldBeDenied(t *testing.T) {
	f := newFixture(t, Options{})
	d := blocked("md-0-a", "alice")
	f.r.observe(denied(d))
	d.Admitted = true
	f.r.observe(denied(d))
	f.r.flush(f.ctx)
	got := events(t, f.kube.EventsV1(), "default")
	require.Len(t, got, 2, "a denial and an admitted one are two series")
	reasons := map[string]string{}
	for _, ev := range got {
		reasons[ev.Reason] = ev.Note
	}
	assert.Contains(t, reasons[ReasonWouldBeDenied], `Delete by "alice" admitted under enforcement action warn, would be denied (blocked): Node "md-0-a"`)
	assert.Contains(t, reasons, Reason)
}

// denied is a denial as Record queues it.
func denied(d Denial) occurrence { return occurrence{denial: d} }

// observeQueued observes what Record and Eventf queued, as Run does.
func (f *fixture) observeQueued() {
	for {
		select {
		case o := <-f.r.queue:
			f.r.observe(o)
		default:
			return
		}
	}
}

// nodeguard's own Events (OrphanNodeDeleted, GhostNode, the fleet's) go
// through the same recorder as denials: in the cluster In names, identical
// ones one Event with a series, under the same per-object bound.
func TestOwnEventsShareTheRecorder(t *testing.T) {
	f := newFixture(t, Options{})
	assert.Nil(t, (*Recorder)(nil).In("", nil), "no recorder, no EventRecorder")
	workload := fake.NewClientset()
	node := &unstructured.Unstructured{}
	node.SetAPIVersion("v1")
	node.SetKind("Node")
	node.SetName("md-0-a")
	node.SetUID("uid-md-0-a")
	inWorkload := f.r.In("fleet/prod-1", workload.EventsV1())
	for range 3 {
		inWorkload.Eventf(node, nil, corev1.EventTypeNormal, "OrphanNodeDeleted", "Delete", "nodeguard deleted orphan Node %s: %s", "md-0-a", "its Machine is gone")
	}
	cluster := &corev1.ObjectReference{APIVersion: "cluster.x-k8s.io/v1beta2", Kind: "Cluster", Namespace: "fleet", Name: "prod-1", UID: "uid-prod-1"}
	inManagement := f.r.In("", nil)
	for i := range f.r.Limits().PerObject + 1 {
		inManagement.Eventf(cluster, nil, corev1.EventTypeWarning, "WorkloadClusterUnguarded", "Guard", "not guarded (%d)", i)
	}
	// A workload cluster without a client: on its Cluster, in the management cluster.
	node.SetName("md-0-b")
	f.r.In("fleet/prod-2", nil).Eventf(node, nil, corev1.EventTypeWarning, "GhostNode", "Detect", "ghost")
	f.observeQueued()
	f.r.flush(f.ctx)

	got := events(t, workload.EventsV1(), "default")
	require.Len(t, got, 1, "three identical Events are one")
	e := got[0]
	assert.Equal(t, corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: "md-0-a", UID: "uid-md-0-a"}, e.Regarding)
	assert.Equal(t, []string{corev1.EventTypeNormal, "OrphanNodeDeleted", "Delete", "nodeguard deleted orphan Node md-0-a: its Machine is gone", Controller, "nodeguard-0"},
		[]string{e.Type, e.Reason, e.Action, e.Note, e.ReportingController, e.ReportingInstance})
	require.NotNil(t, e.Series)
	assert.EqualValues(t, 3, e.Series.Count)

	onCluster := events(t, f.kube.EventsV1(), "fleet")
	require.Len(t, onCluster, f.r.Limits().PerObject+1, "the Cluster's own Events up to the bound, and the ghost's fallback")
	assert.Equal(t, 1.0, f.dropped(DropPerObject))
	var fallback []string
	for _, e := range onCluster {
		assert.Equal(t, "Cluster", e.Regarding.Kind)
		if e.Reason == "GhostNode" {
			fallback = append(fallback, e.Regarding.Name+": "+e.Note)
		}
	}
	assert.Equal(t, []string{`prod-2: Node "md-0-b" of workload cluster fleet/prod-2: ghost`}, fallback)
}

// A denial's decision_id is on its Event: the first of the series, the
// later ones counted into it.
func TestTheEventCarriesTheFirstDecisionID(t *testing.T) {
	f := newFixture(t, Options{})
	for _, id := range []string{"decision-1", "decision-2"} {
		d := blocked("md-0-a", "alice")
		d.DecisionID = id
		f.r.observe(denied(d))
	}
	f.r.observe(denied(blocked("md-0-b", "alice"))) // no decision log: no annotation
	f.r.flush(f.ctx)
	got := events(t, f.kube.EventsV1(), "default")
	require.Len(t, got, 2)
	for _, ev := range got {
		switch ev.Regarding.Name {
		case "md-0-a":
			assert.Equal(t, map[string]string{DecisionIDAnnotation: "decision-1"}, ev.Annotations)
			assert.EqualValues(t, 2, ev.Series.Count)
		default:
			assert.Empty(t, ev.Annotations)
		}
	}
}
