package nodes

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/internal/testcluster"
	"github.com/nodeguard/nodeguard/internal/testlog"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// fixture is an API server (client-go's fake) serving testdata/, a Finder
// with fresh reads over it, and a Reaper on a fake clock.
type fixture struct {
	client   *dynamicfake.FakeDynamicClient
	finder   *guard.Finder
	clock    *clocktesting.FakeClock
	reaper   *Reaper
	recorder *events.FakeRecorder
	logs     *bytes.Buffer
	metrics  *ReaperMetrics

	mu      sync.Mutex
	deletes []string // names of delete calls the API server accepted
}

func newFixture(t *testing.T, opts ReaperOptions) *fixture {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	client, mapper := testcluster.CAPD(t, "testdata")
	f := &fixture{client: client, clock: clocktesting.NewFakeClock(t0), recorder: events.NewFakeRecorder(10), logs: &bytes.Buffer{}}
	// The fake does not check delete preconditions; the API server does.
	client.PrependReactor("delete", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		del := a.(k8stesting.DeleteActionImpl)
		cur, err := client.Tracker().Get(guard.NodeGVR, "", del.Name)
		if err != nil {
			return true, nil, err
		}
		m := cur.(*unstructured.Unstructured)
		pre := del.DeleteOptions.Preconditions
		if pre == nil || pre.UID == nil || pre.ResourceVersion == nil {
			return true, nil, fmt.Errorf("test: delete of Node %s without UID and resourceVersion preconditions", del.Name)
		}
		if *pre.UID != m.GetUID() || *pre.ResourceVersion != m.GetResourceVersion() {
			return true, nil, apierrors.NewConflict(guard.NodeGVR.GroupResource(), del.Name, fmt.Errorf("precondition failed"))
		}
		f.mu.Lock()
		f.deletes = append(f.deletes, del.Name)
		f.mu.Unlock()
		return false, nil, nil // the tracker deletes it
	})
	e, err := guard.StartEnforcer(ctx, kube.Clients{Dynamic: client, Mapper: mapper}, guard.EnforcerOptions{Engine: testcluster.Engine(t)})
	require.NoError(t, err)
	require.NoError(t, guard.WaitReady(ctx, e.Syncer.Ready, 10*time.Second))
	finder, err := guard.NewFinder(guard.FinderOptions{Guard: e.Guard, Inventory: e.Inventory, Grace: 5 * time.Minute})
	require.NoError(t, err)
	f.finder = finder
	f.metrics, err = NewReaperMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	opts.Finder, opts.Clock, opts.Metrics = finder, f.clock, f.metrics
	opts.Log = slog.New(slog.NewJSONHandler(f.logs, nil))
	f.reaper, err = NewReaper(opts)
	require.NoError(t, err)
	return f
}

func (f *fixture) target() ReapTarget {
	return ReapTarget{Nodes: f.client, Recorder: f.recorder}
}

// ReapResult says what one pass did.
type ReapResult struct {
	Orphans []string // Nodes found orphan in this pass
	Deleted []string // Nodes deleted (never in dry-run)
	Would   []string // Nodes a dry-run would have deleted
}

// pass judges every Node from the caches and tells the reaper each verdict,
// as a full pass of Scanner does (whose tests cover when Nodes
// are judged; these cover what the reaper makes of the verdicts).
func (f *fixture) pass(t *testing.T) ReapResult {
	t.Helper()
	ctx := context.Background()
	now := f.clock.Now()
	list, err := f.client.Resource(guard.NodeGVR).List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	nodes := make([]*unstructured.Unstructured, len(list.Items))
	for i := range list.Items {
		nodes[i] = &list.Items[i]
	}
	verdicts, err := f.finder.Scan(ctx, nodes, "", now)
	require.NoError(t, err)
	var res ReapResult
	for _, v := range verdicts {
		if v.Orphan {
			res.Orphans = append(res.Orphans, v.Node)
		}
		outcome, _, err := f.reaper.Observe(ctx, f.target(), v, now)
		require.NoError(t, err)
		switch outcome {
		case Deleted:
			res.Deleted = append(res.Deleted, v.Node)
		case WouldDelete:
			res.Would = append(res.Would, v.Node)
		}
	}
	sort.Strings(res.Orphans)
	return res
}

func (f *fixture) nodes(t *testing.T) []string {
	t.Helper()
	list, err := f.client.Resource(guard.NodeGVR).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	var names []string
	for _, n := range list.Items {
		names = append(names, n.GetName())
	}
	return names
}

// onFreshRead runs change when the reaper re-reads Node name from the API
// server, just before it acts on what it read.
func (f *fixture) onFreshRead(name string, change func()) {
	f.client.PrependReactor("get", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.GetAction).GetName() == name {
			change()
		}
		return false, nil, nil
	})
}

// keeps runs a pass that must leave Node name in place, saying why in its
// log.
func (f *fixture) keeps(t *testing.T, name, why string) {
	t.Helper()
	res := f.pass(t)
	assert.NotContains(t, res.Deleted, name)
	assert.NotContains(t, f.deleted(), name)
	assert.Contains(t, f.logs.String(), why)
}

func (f *fixture) deleted() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.deletes...)
}

func leader() bool { return true }

var mustStay = []string{
	"dev-md-0-ready",          // Ready
	"dev-md-0-owned",          // its Machine exists
	"dev-md-0-deleting",       // its Machine (and DockerMachine) are being deleted
	"dev-md-0-infra",          // a linked DockerMachine exists
	"dev-md-0-infra-deleting", // a linked DockerMachine is being deleted
	"dev-md-0-unannotated",    // not CAPI-managed (default match)
}

func TestDeletesTheLeftBehindNodeAfterTwoObservationsAGraceApart(t *testing.T) {
	f := newFixture(t, ReaperOptions{Delete: true, IsLeader: leader})

	res := f.pass(t)
	assert.Equal(t, []string{"dev-md-0-left"}, res.Orphans)
	assert.Empty(t, res.Deleted, "first observation: nothing is deleted")
	assert.Equal(t, 1.0, testutil.ToFloat64(f.metrics.orphans.WithLabelValues("")))

	f.clock.Step(4*time.Minute + 59*time.Second)
	assert.Empty(t, f.pass(t).Deleted, "second observation less than the grace after the first")

	f.clock.Step(time.Second)
	res = f.pass(t)
	assert.Equal(t, []string{"dev-md-0-left"}, res.Deleted)
	assert.Equal(t, []string{"dev-md-0-left"}, f.deleted())
	assert.NotContains(t, f.nodes(t), "dev-md-0-left")
	for _, n := range mustStay {
		assert.Contains(t, f.nodes(t), n)
	}
	assert.Equal(t, 1.0, testutil.ToFloat64(f.metrics.deleted.WithLabelValues("")))
	event := <-f.recorder.Events
	assert.Equal(t, "Normal OrphanNodeDeleted nodeguard deleted orphan Node dev-md-0-left: Machine default/dev-md-0-left is gone, "+
		"nothing links an InfraMachine to the Node, and it has not been Ready since 2026-11-30T11:00:00Z (grace 5m0s)", event)

	var line map[string]any
	for _, l := range strings.Split(strings.TrimSpace(f.logs.String()), "\n") {
		require.NoError(t, json.Unmarshal([]byte(l), &line), l)
		if line["msg"] == "deleted orphan node" {
			break
		}
	}
	assert.Equal(t, "deleted orphan node", line["msg"])
	assert.Equal(t, "dev-md-0-left", line["node"])
	assert.Equal(t, "00000000-0000-4000-8000-000000000001", line["uid"])
	assert.Equal(t, "default/dev-md-0-left", line["machine"])
	assert.Equal(t, "101", line["resourceVersion"])

	// dev-md-0-recent went NotReady at 11:58: an orphan from 12:05 on, so
	// first seen at 12:05 and deleted no earlier than 12:10.
	assert.Equal(t, []string{"dev-md-0-left", "dev-md-0-recent"}, res.Orphans)
	f.clock.Step(4 * time.Minute)
	assert.Empty(t, f.pass(t).Deleted)
	f.clock.Step(time.Minute)
	assert.Equal(t, []string{"dev-md-0-recent"}, f.pass(t).Deleted)
}

func TestNeverDeletesWhatIsNotAnOrphan(t *testing.T) {
	f := newFixture(t, ReaperOptions{Delete: true, IsLeader: leader})
	for i := 0; i < 3; i++ {
		f.pass(t)
		f.clock.Step(10 * time.Minute)
	}
	// Only the two orphans went (dev-md-0-recent after its own grace).
	assert.ElementsMatch(t, []string{"dev-md-0-left", "dev-md-0-recent"}, f.deleted())
	for _, n := range mustStay {
		assert.Contains(t, f.nodes(t), n, "%s must never be deleted", n)
	}
}

func TestNeverDeletesInDryRun(t *testing.T) {
	f := newFixture(t, ReaperOptions{Delete: true, DryRun: true, IsLeader: leader})
	f.pass(t)
	f.clock.Step(10 * time.Minute)
	res := f.pass(t)
	assert.Equal(t, []string{"dev-md-0-left", "dev-md-0-recent"}, res.Orphans)
	assert.Equal(t, []string{"dev-md-0-left"}, res.Would)
	assert.Empty(t, res.Deleted)
	f.clock.Step(10 * time.Minute)
	f.pass(t)
	assert.Empty(t, f.deleted())
	assert.Contains(t, f.nodes(t), "dev-md-0-left")
	assert.Contains(t, f.logs.String(), `"msg":"dry run: would delete orphan node"`)
	assert.Empty(t, f.recorder.Events)
}

func TestNeverDeletesWithoutTheLease(t *testing.T) {
	f := newFixture(t, ReaperOptions{Delete: true, IsLeader: func() bool { return false }})
	f.pass(t)
	f.clock.Step(10 * time.Minute)
	res := f.pass(t)
	assert.Equal(t, []string{"dev-md-0-left", "dev-md-0-recent"}, res.Orphans)
	assert.Empty(t, f.deleted())
}

func TestObservesWithoutReaping(t *testing.T) {
	f := newFixture(t, ReaperOptions{IsLeader: leader}) // --reap-orphan-nodes off
	f.pass(t)
	f.clock.Step(10 * time.Minute)
	f.pass(t)
	assert.Empty(t, f.deleted())
	assert.Equal(t, 2.0, testutil.ToFloat64(f.metrics.orphans.WithLabelValues("")))
}

// reRegister replaces Node name with a new object of the same name: a new
// UID and resourceVersion, as when a host re-joins under its old name.
func reRegister(t *testing.T, f *fixture, name string) *unstructured.Unstructured {
	t.Helper()
	old, err := f.client.Tracker().Get(guard.NodeGVR, "", name)
	require.NoError(t, err)
	n := old.(*unstructured.Unstructured).DeepCopy()
	n.SetUID(types.UID("11111111-0000-4000-8000-000000000001"))
	n.SetResourceVersion("900")
	require.NoError(t, f.client.Tracker().Delete(guard.NodeGVR, "", name))
	require.NoError(t, f.client.Tracker().Add(n))
	return old.(*unstructured.Unstructured)
}

func TestNeverDeletesANodeReRegisteredBetweenObservations(t *testing.T) {
	f := newFixture(t, ReaperOptions{Delete: true, IsLeader: leader})
	f.pass(t)
	reRegister(t, f, "dev-md-0-left")
	f.clock.Step(10 * time.Minute)
	res := f.pass(t)
	assert.Contains(t, res.Orphans, "dev-md-0-left")
	assert.NotContains(t, res.Deleted, "dev-md-0-left", "the new Node was observed once only")
	assert.NotContains(t, f.deleted(), "dev-md-0-left")
}

func TestNeverDeletesANodeReRegisteredBeforeTheFreshRead(t *testing.T) {
	f := newFixture(t, ReaperOptions{Delete: true, IsLeader: leader})
	f.pass(t)
	f.clock.Step(10 * time.Minute)
	// The list still shows the old Node; by the fresh read it was replaced.
	f.onFreshRead("dev-md-0-left", func() { reRegister(t, f, "dev-md-0-left") })
	f.keeps(t, "dev-md-0-left", "re-registered under the same name")
}

func TestNeverDeletesANodeReRegisteredBeforeTheDelete(t *testing.T) {
	f := newFixture(t, ReaperOptions{Delete: true, IsLeader: leader})
	f.pass(t)
	f.clock.Step(10 * time.Minute)
	// The fresh read still returns the old Node; the API server holds the
	// new one by the time the delete arrives: only its preconditions stop it.
	var old *unstructured.Unstructured
	f.client.PrependReactor("get", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.GetAction).GetName() != "dev-md-0-left" {
			return false, nil, nil
		}
		if old == nil {
			old = reRegister(t, f, "dev-md-0-left")
		}
		return true, old.DeepCopy(), nil
	})
	res := f.pass(t)
	assert.NotContains(t, res.Deleted, "dev-md-0-left")
	assert.NotContains(t, f.deleted(), "dev-md-0-left")
	n, err := f.client.Tracker().Get(guard.NodeGVR, "", "dev-md-0-left")
	require.NoError(t, err)
	assert.Equal(t, types.UID("11111111-0000-4000-8000-000000000001"), n.(*unstructured.Unstructured).GetUID())
	assert.Contains(t, f.logs.String(), "precondition failed")
}

func TestNeverDeletesWhenAMachineAppearsBeforeTheDelete(t *testing.T) {
	f := newFixture(t, ReaperOptions{Delete: true, IsLeader: leader})
	f.pass(t)
	f.clock.Step(10 * time.Minute)
	// A Machine linking the Node by nodeRef appears; the informer has not seen
	// it, the fresh read of the annotated Machine does.
	m := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
		"metadata": map[string]any{"namespace": "default", "name": "dev-md-0-left", "labels": map[string]any{"cluster.x-k8s.io/cluster-name": "dev"}},
		"spec":     map[string]any{"clusterName": "dev", "infrastructureRef": map[string]any{"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": "dev-md-0-left"}},
	}}
	f.onFreshRead("dev-md-0-left", func() { _ = f.client.Tracker().Add(m) })
	f.keeps(t, "dev-md-0-left", "no longer an orphan on a fresh read")
}

// Observe says when the Node must be judged again: at the end of the grace
// for a second observation, and after a failed attempt at a time that backs
// off, at most retryLimit away.
func TestObserveSaysWhenToLookAgain(t *testing.T) {
	f := newFixture(t, ReaperOptions{Delete: true, IsLeader: leader})
	ctx := context.Background()
	v := guard.OrphanVerdict{Node: "dev-md-0-left", Orphan: true, UID: "00000000-0000-4000-8000-000000000001"}
	outcome, next, err := f.reaper.Observe(ctx, f.target(), v, t0)
	require.NoError(t, err)
	assert.Equal(t, FirstSeen, outcome)
	assert.Equal(t, t0.Add(5*time.Minute), next)
	outcome, next, err = f.reaper.Observe(ctx, f.target(), v, t0.Add(time.Minute))
	require.NoError(t, err)
	assert.Equal(t, Waiting, outcome)
	assert.Equal(t, t0.Add(5*time.Minute), next)

	f.client.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("etcd is slow")
	})
	var waits []time.Duration
	now := t0.Add(5 * time.Minute)
	for range 12 {
		outcome, next, err = f.reaper.Observe(ctx, f.target(), v, now)
		assert.Equal(t, Failed, outcome)
		assert.ErrorContains(t, err, "etcd is slow")
		waits = append(waits, next.Sub(now))
	}
	assert.Equal(t, []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second}, waits[:4])
	assert.Equal(t, retryLimit, waits[11])
	assert.Equal(t, []string{"dev-md-0-left"}, f.reaper.Orphans(""), "still an orphan, still counted")

	// Another Node under the name: observation starts over.
	outcome, _, err = f.reaper.Observe(ctx, f.target(), guard.OrphanVerdict{Node: "dev-md-0-left", Orphan: true, UID: "other"}, now)
	require.NoError(t, err)
	assert.Equal(t, FirstSeen, outcome)

	f.reaper.ForgetCluster("")
	assert.Empty(t, f.reaper.Orphans(""))
	assert.Zero(t, testutil.CollectAndCount(f.metrics.orphans), "no series left for a cluster gone")

	// A verdict judged before the cluster went and told after it changes
	// nothing: no sighting, no series back.
	outcome, _, err = f.reaper.Observe(ctx, f.target(), v, now)
	require.NoError(t, err)
	assert.Equal(t, Kept, outcome)
	assert.Empty(t, f.reaper.Orphans(""))
	f.reaper.Report("")
	assert.Zero(t, testutil.CollectAndCount(f.metrics.orphans), "a verdict in flight brings no series back")
	// Added again, it is judged again.
	f.reaper.AddCluster("")
	outcome, _, err = f.reaper.Observe(ctx, f.target(), v, now)
	require.NoError(t, err)
	assert.Equal(t, FirstSeen, outcome)
	assert.Equal(t, 1.0, testutil.ToFloat64(f.metrics.orphans.WithLabelValues("")))
}

func TestNotTheLeaderOnlyObserves(t *testing.T) {
	f := newFixture(t, ReaperOptions{Delete: true, IsLeader: func() bool { return false }})
	v := guard.OrphanVerdict{Node: "dev-md-0-left", Orphan: true, UID: "00000000-0000-4000-8000-000000000001"}
	_, _, err := f.reaper.Observe(context.Background(), f.target(), v, t0)
	require.NoError(t, err)
	outcome, next, err := f.reaper.Observe(context.Background(), f.target(), v, t0.Add(time.Hour))
	require.NoError(t, err)
	assert.Equal(t, Observed, outcome)
	assert.True(t, next.IsZero(), "judged again when leadership comes (orphanscan), not polled")
	assert.False(t, f.reaper.Leading())
}

// The switch (Options.Permitted) is asked right before each delete: off, no
// Node goes and the sighting stays, so turning it on again deletes at the
// next pass without waiting a new grace.
func TestNeverDeletesWhileTheSwitchIsOff(t *testing.T) {
	var on atomic.Bool
	f := newFixture(t, ReaperOptions{Delete: true, IsLeader: leader, Permitted: func(context.Context) error {
		if on.Load() {
			return nil
		}
		return errors.New("switch off")
	}})
	observe := func() []error { return f.observeAll(t, f.target()) }
	assert.Empty(t, observe())
	f.clock.Step(5 * time.Minute)
	errs := observe()
	require.Len(t, errs, 1)
	assert.ErrorContains(t, errs[0], `not deleting orphan Node "dev-md-0-left": switch off`)
	assert.Empty(t, f.deleted())
	on.Store(true)
	assert.Empty(t, observe())
	assert.Equal(t, []string{"dev-md-0-left"}, f.deleted())
}

// A cluster watched only for its releases is never reaped, whatever the
// reaper may do elsewhere.
func TestAnObservedOnlyClusterIsNeverReaped(t *testing.T) {
	f := newFixture(t, ReaperOptions{Delete: true, IsLeader: leader})
	observed := f.target()
	observed.ObserveOnly = true
	for range 2 {
		assert.Empty(t, f.observeAll(t, observed))
		f.clock.Step(5 * time.Minute)
	}
	assert.Contains(t, f.reaper.Orphans(""), "dev-md-0-left", "seen and counted")
	assert.Empty(t, f.deleted())
}

// observeAll tells the reaper the verdict of every Node, judged from the
// caches, against t, and returns what failed.
func (f *fixture) observeAll(t *testing.T, target ReapTarget) (errs []error) {
	t.Helper()
	ctx := context.Background()
	list, err := f.client.Resource(guard.NodeGVR).List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	nodes := make([]*unstructured.Unstructured, len(list.Items))
	for i := range list.Items {
		nodes[i] = &list.Items[i]
	}
	verdicts, err := f.finder.Scan(ctx, nodes, "", f.clock.Now())
	require.NoError(t, err)
	for _, v := range verdicts {
		if _, _, err := f.reaper.Observe(ctx, target, v, f.clock.Now()); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

func TestDeleteNeedsPreconditions(t *testing.T) {
	client, _ := testcluster.CAPD(t, "../guard/testdata")
	err := DeleteNode(context.Background(), client, guard.OrphanVerdict{Node: "dev-md-0-recent"})
	assert.ErrorContains(t, err, "no UID or resourceVersion")
}

// With a decision log, an orphan first seen and the reaper's act on it are
// logged: the verdict, and what was done.
func TestOrphanVerdictsAreDecisionLogged(t *testing.T) {
	var console testlog.Buffer
	dlog, err := rule.StartDecisionLog(context.Background(), rule.DecisionLogOptions{Console: true, ConsoleOutput: &console})
	require.NoError(t, err)
	f := newFixture(t, ReaperOptions{Delete: true, IsLeader: leader, DecisionLog: dlog})
	f.pass(t)
	f.clock.Step(5 * time.Minute)
	assert.Equal(t, []string{"dev-md-0-left"}, f.pass(t).Deleted)
	lines := console.LinesAfter(t, dlog.Stop)
	var outcomes []string
	for _, l := range lines {
		if l["input"].(map[string]any)["node"] == "dev-md-0-left" {
			assert.Equal(t, "nodeguard/orphan", l["path"])
			assert.Equal(t, true, l["result"].(map[string]any)["orphan"], "the verdict")
			outcomes = append(outcomes, l["custom"].(map[string]any)["outcome"].(string))
		}
	}
	assert.Equal(t, []string{"first-seen", "deleted"}, outcomes)
}
