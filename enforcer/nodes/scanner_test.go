package nodes_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/nodes"
	"github.com/nodeguard/nodeguard/internal/testcluster"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

const interval = 30 * time.Minute

// fixture is reaper/testdata served by client-go's fake API server, the
// inventory's informers and a Node watch over it, and a Scanner on a fake
// clock, driven by RunDue.
type fixture struct {
	client  *dynamicfake.FakeDynamicClient
	clock   *clocktesting.FakeClock
	scanner *nodes.Scanner
	reaper  *nodes.Reaper
	nodes   *facts.NodeWatch
	leading bool
	// untrusted, when set, is what Ready answers: a cache recovering from a
	// broken watch (serve passes Syncer.Recovering through Ready).
	untrusted error
	// releases writes the verdicts on the Nodes (info names them).
	releases *nodes.Publisher
	info     admission.PolicyInfo
	// The ghosts: the tombstones kept from the inventory's changes, what was
	// done about each ghost, and the Events recorded.
	tombstones *facts.Tombstones
	ghosts     *nodes.GhostTracker
	protection nodes.Protection
	events     *events.FakeRecorder
	// The changes told to the scanner (the inventory's, the Node cache's),
	// and how many objects the inventory held when the scanner subscribed
	// (each is told once, as an add).
	objectChanges, nodeChanges atomic.Int64
	objects                    int
	// judging, when set, is told of each release judgment (fresh: a
	// confirmation); set it before the scan runs.
	judging func(node string, fresh bool)
}

func newFixture(t *testing.T, del bool) *fixture {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	client, mapper := testcluster.CAPD(t, "testdata")
	f := &fixture{client: client, clock: clocktesting.NewFakeClock(t0), leading: true, protection: nodes.ProtectionOff, events: events.NewFakeRecorder(100)}
	e, err := guard.StartEnforcer(ctx, kube.Clients{Dynamic: client, Mapper: mapper}, guard.EnforcerOptions{Engine: testcluster.Engine(t)})
	require.NoError(t, err)
	require.NoError(t, guard.WaitReady(ctx, e.Syncer.Ready, 10*time.Second))
	model := e.Inventory.Model()
	f.info, err = admission.LoadPolicyInfo()
	require.NoError(t, err)
	shape, err := facts.NodeShapeOf(e.Engine, f.info.VerdictPaths()...)
	require.NoError(t, err)
	evidence := guard.NewEvidence(model)
	f.tombstones = facts.NewTombstones(facts.TombstoneOptions{Clock: f.clock, Changed: func(pid string) { f.scanner.TombstoneChanged(pid) }})
	f.ghosts = nodes.NewGhostTracker(nodes.GhostOptions{Protection: func(string) nodes.Protection { return f.protection }})
	finder, err := guard.NewFinder(guard.FinderOptions{Guard: e.Guard, Inventory: e.Inventory, Evidence: evidence, Grace: 5 * time.Minute,
		Tombstones: f.tombstones})
	require.NoError(t, err)
	f.reaper, err = nodes.NewReaper(nodes.ReaperOptions{Finder: finder, Delete: del, IsLeader: func() bool { return f.leading }, Clock: f.clock})
	require.NoError(t, err)
	judge := func(ctx context.Context, ns []*unstructured.Unstructured, cluster string, fresh bool) ([]guard.Release, error) {
		if f.judging != nil {
			f.judging(ns[0].GetName(), fresh)
		}
		return finder.Releases(ctx, ns, cluster, fresh)
	}
	f.releases, err = nodes.NewPublisher(nodes.PublisherOptions{Judge: judge, Ready: e.Syncer.Ready, Info: f.info})
	require.NoError(t, err)
	f.releases.Enroll("", func(ctx context.Context, node string, v admission.ReleaseVerdict) error {
		patch, err := admission.VerdictPatch(f.info, v)
		if err != nil {
			return err
		}
		_, err = client.Resource(nodesGVR).Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
	f.scanner, err = nodes.NewScanner(nodes.ScanOptions{Finder: finder, Evidence: evidence, Reaper: f.reaper, Model: model, Releases: f.releases,
		Ready: func() error {
			if f.untrusted != nil {
				return f.untrusted
			}
			return e.Syncer.Ready()
		}, SyncedKinds: e.Syncer.SyncedKinds, Interval: interval, Clock: f.clock, Tombstones: f.tombstones, Ghosts: f.ghosts})
	require.NoError(t, err)
	// Synced, the inventory changes nothing until a test does: a handler
	// subscribed now is told each cached object once, as an add.
	for _, n := range e.Inventory.Count() {
		f.objects += n
	}
	require.NoError(t, e.Syncer.Subscribe(func(c facts.Change) {
		f.scanner.ObjectChanged(c)
		f.objectChanges.Add(1)
	}))
	f.nodes, err = facts.NewNodeWatch(facts.NodeWatchOptions{Shape: shape, Dynamic: client,
		OnChange: func(n string) {
			f.scanner.NodeChanged("", n)
			f.nodeChanges.Add(1)
		},
		Verdicts: f.releases.Verdicts(), OnVerdict: func(n string) { f.scanner.VerdictChanged("", n) }})
	require.NoError(t, err)
	f.scanner.AddCluster("", f.nodes, nodes.ReapTarget{Nodes: client, Recorder: f.events})
	go f.nodes.Run(ctx)
	require.Eventually(t, f.nodes.HasSynced, 5*time.Second, 10*time.Millisecond)
	return f
}

// settle waits until the informers' first objects, which arrive as adds
// asynchronously, have all been told to the scanner, then runs what is due
// at the clock's time until nothing more is, and returns how many Nodes
// were judged.
func (f *fixture) settle(t *testing.T) nodes.ScanResult {
	t.Helper()
	require.Eventually(t, func() bool {
		return f.objectChanges.Load() >= int64(f.objects) && f.nodeChanges.Load() >= int64(len(f.nodes.Names()))
	}, 5*time.Second, 10*time.Millisecond, "every cached object and Node is told to the scanner as an add")
	var total nodes.ScanResult
	for range 10 {
		res := f.scanner.RunDue(context.Background(), f.clock.Now())
		total.Judged += res.Judged
		total.Deleted = append(total.Deleted, res.Deleted...)
		total.Full = total.Full || res.Full
		if res.Judged == 0 {
			return total
		}
	}
	require.FailNow(t, "Nodes are still due at the same time after ten runs")
	return total
}

func (f *fixture) at(t *testing.T, d time.Duration) nodes.ScanResult {
	t.Helper()
	f.clock.SetTime(t0.Add(d))
	return f.scanner.RunDue(context.Background(), f.clock.Now())
}

// A scale-down's Nodes wait for their verdicts, not for the orphan and
// ghost judgments of the Nodes before them: a pass judges the release of
// every Node due before anything else.
func TestAPassJudgesTheReleasesFirst(t *testing.T) {
	f := newFixture(t, false)
	var seen [][]string // the orphans known at each release judgment
	f.judging = func(_ string, fresh bool) {
		if !fresh {
			seen = append(seen, f.reaper.Orphans(""))
		}
	}
	f.settle(t)
	require.Len(t, seen, len(f.nodes.Names()), "every Node's release judged once")
	for i, orphans := range seen {
		assert.Empty(t, orphans, "release judgment %d came after an orphan judgment", i)
	}
	assert.NotEmpty(t, f.reaper.Orphans(""), "the fixture holds orphans, so the order shows")
}

// A Node that comes due during a pass (the next InfraMachine of a
// scale-down gone) has its release judged in that pass, before the rest of
// the pass's judgments, not in the next one.
func TestANodeDueDuringAPassIsReleasedInIt(t *testing.T) {
	f := newFixture(t, false)
	f.settle(t)
	var released []string
	f.judging = func(node string, fresh bool) {
		if fresh {
			return
		}
		if len(released) == 0 {
			f.scanner.NodeChanged("", "dev-md-0-infra")
		}
		released = append(released, node)
	}
	f.scanner.NodeChanged("", "dev-md-0-left")
	res := f.scanner.RunDue(context.Background(), f.clock.Now())
	assert.Equal(t, []string{"dev-md-0-left", "dev-md-0-infra"}, released)
	assert.Equal(t, 2, res.Judged, "both judged in full in the same pass")
}

// Under steady churn (every release judgment sees another Node come due) a
// pass still ends: it takes in a bounded number of Nodes.
func TestAPassEndsUnderChurn(t *testing.T) {
	f := newFixture(t, false)
	f.settle(t)
	names := f.nodes.Names()
	n := 0
	f.judging = func(_ string, fresh bool) {
		if !fresh {
			n++
			f.scanner.NodeChanged("", names[n%len(names)])
		}
	}
	f.scanner.NodeChanged("", names[0])
	done := make(chan nodes.ScanResult)
	go func() { done <- f.scanner.RunDue(context.Background(), f.clock.Now()) }()
	select {
	case res := <-done:
		assert.Greater(t, res.Judged, 100, "what came due taken in")
		assert.LessOrEqual(t, res.Judged, 1+256+1, "the planned Node and at most 256 more (one may be taken in at the last)")
	case <-time.After(10 * time.Second):
		t.Fatal("the pass never ended")
	}
}

var machines = schema.GroupVersionResource{Group: "cluster.x-k8s.io", Version: "v1beta2", Resource: "machines"}

// With nothing changing, nothing is judged until the full pass.
func TestWithNothingChangingNothingIsJudged(t *testing.T) {
	f := newFixture(t, false)
	first := f.settle(t)
	assert.True(t, first.Full)
	assert.Equal(t, 8, first.Judged, "every Node, once, when the cache syncs")
	assert.Equal(t, []string{"dev-md-0-left"}, f.reaper.Orphans(""))

	assert.Zero(t, f.at(t, time.Minute).Judged)
	// dev-md-0-recent at the end of its grace, then dev-md-0-left for the
	// reaper's second look (reaping is off: nothing more after that).
	assert.Equal(t, 1, f.at(t, 3*time.Minute).Judged)
	assert.Equal(t, 2, f.at(t, 8*time.Minute).Judged)
	assert.Zero(t, f.at(t, interval-time.Millisecond).Judged)
	res := f.at(t, interval)
	assert.True(t, res.Full)
	assert.Equal(t, 8, res.Judged, "the safety net judges every Node")
}

func TestTheEndOfTheGraceIsJudged(t *testing.T) {
	f := newFixture(t, true)
	f.settle(t)
	assert.Equal(t, []string{"dev-md-0-left"}, f.reaper.Orphans(""))
	// dev-md-0-recent went NotReady at 11:58: an orphan at 12:03, not before.
	assert.Zero(t, f.at(t, 3*time.Minute-time.Second).Judged)
	res := f.at(t, 3*time.Minute)
	assert.Equal(t, 1, res.Judged)
	assert.Equal(t, []string{"dev-md-0-left", "dev-md-0-recent"}, f.reaper.Orphans(""))
	// Each is deleted at its second observation, a grace after its first.
	res = f.at(t, 5*time.Minute)
	assert.Equal(t, []string{"dev-md-0-left"}, res.Deleted)
	assert.Equal(t, 1, res.Judged)
	res = f.at(t, 8*time.Minute)
	assert.Equal(t, []string{"dev-md-0-recent"}, res.Deleted)
}

// While the inventory is not trusted (recovering from a broken watch, it
// may lack a link made meanwhile) no Node is judged, so none is deleted; what
// was due then is judged once it is trusted again.
func TestNothingIsJudgedWhileTheInventoryIsUntrusted(t *testing.T) {
	f := newFixture(t, true)
	f.settle(t)
	require.Equal(t, []string{"dev-md-0-left"}, f.reaper.Orphans(""))
	f.untrusted = errors.New("the Machine watch broke; verifying the cache")
	res := f.at(t, 5*time.Minute)
	assert.Zero(t, res.Judged)
	assert.Empty(t, res.Deleted)
	f.untrusted = nil
	res = f.at(t, 5*time.Minute+time.Second)
	assert.Equal(t, []string{"dev-md-0-left"}, res.Deleted)
}

// A Machine that goes re-judges the Nodes it could link, and only those.
func TestAMachineThatGoesReJudgesItsNode(t *testing.T) {
	f := newFixture(t, true)
	f.settle(t)
	f.clock.SetTime(t0.Add(time.Minute))
	require.NoError(t, f.client.Resource(machines).Namespace("default").Delete(context.Background(), "dev-md-0-owned", metav1.DeleteOptions{}))
	var judged int
	require.Eventually(t, func() bool {
		judged += f.scanner.RunDue(context.Background(), f.clock.Now()).Judged
		return len(f.reaper.Orphans("")) == 2
	}, 5*time.Second, 20*time.Millisecond)
	assert.Equal(t, []string{"dev-md-0-left", "dev-md-0-owned"}, f.reaper.Orphans(""))
	assert.Equal(t, 1, judged, "one Node judged for one Machine gone")
	// Each a grace after its first observation: dev-md-0-left at 12:05, the
	// other at 12:06.
	res := f.at(t, 6*time.Minute)
	assert.Equal(t, []string{"dev-md-0-left", "dev-md-0-owned"}, res.Deleted)
}

// Not the leader, the reaper only observes; when leadership comes, the
// orphans it saw are judged at once, not at the next full pass.
func TestLeadershipComingActsOnTheOrphansSeen(t *testing.T) {
	f := newFixture(t, true)
	f.leading = false
	f.settle(t)
	assert.Empty(t, f.at(t, 10*time.Minute).Deleted)
	assert.Zero(t, f.at(t, 11*time.Minute).Judged)
	f.leading = true
	res := f.at(t, 11*time.Minute+time.Second)
	// dev-md-0-recent was first seen at 12:10, when it was next judged after
	// its grace ended at 12:03: its second observation is due at 12:15.
	assert.Equal(t, []string{"dev-md-0-left"}, res.Deleted)
	assert.Equal(t, 2, res.Judged, "only the orphans seen")
	assert.Equal(t, []string{"dev-md-0-recent"}, f.at(t, 15*time.Minute).Deleted)
}

// notSynced is a cluster whose Node cache has not synced.
type notSynced struct{ *facts.NodeWatch }

func (notSynced) HasSynced() bool { return false }

// A cluster whose cache has not synced is not judged (an empty cache proves
// nothing); once it syncs, all its Nodes are.
func TestAClusterIsJudgedOnceItsCacheSynced(t *testing.T) {
	f := newFixture(t, false)
	f.scanner.AddCluster("default/dev", notSynced{f.nodes}, nodes.ReapTarget{Nodes: f.client})
	f.settle(t)
	assert.Empty(t, f.reaper.Orphans("default/dev"))
	f.scanner.AddCluster("default/dev", f.nodes, nodes.ReapTarget{Nodes: f.client})
	res := f.at(t, time.Second)
	assert.Equal(t, 8, res.Judged)
	assert.Equal(t, []string{"dev-md-0-left"}, f.reaper.Orphans("default/dev"))
	f.scanner.RemoveCluster("default/dev")
	assert.Empty(t, f.reaper.Orphans("default/dev"))
}

// syncsQuietly is a cluster whose Node cache syncs with no event after the
// scan first asked it.
type syncsQuietly struct {
	*facts.NodeWatch
	asked, synced *atomic.Bool
}

func (s syncsQuietly) HasSynced() bool {
	s.asked.Store(true)
	return s.synced.Load()
}

// A cluster found unsynced is asked again within a second, not at the next
// full pass: the wake of its last first-listed Node can come before its cache
// says it has synced (seen in serve's tests under load).
func TestAClusterThatSyncsWithoutAnEventIsJudgedWithinASecond(t *testing.T) {
	f := newFixture(t, false)
	f.settle(t)
	var asked, synced atomic.Bool
	f.scanner.AddCluster("default/dev", syncsQuietly{f.nodes, &asked, &synced}, nodes.ReapTarget{Nodes: f.client})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go f.scanner.Run(ctx)
	require.Eventually(t, asked.Load, 5*time.Second, time.Millisecond, "Run found the cluster unsynced")
	// Each step below fires the second's timer once Run has set it, however
	// late that is; the full pass is 30 fake minutes away.
	synced.Store(true)
	require.Eventually(t, func() bool {
		f.clock.Step(time.Second)
		return len(f.reaper.Orphans("default/dev")) == 1
	}, 5*time.Second, 100*time.Millisecond, "judged within a few fake seconds (the full pass is %s away)", interval)
}

// The scan's triggers drive the verdicts on the Nodes of a cluster in mode
// admission-policy: an InfraMachine that goes releases its Node, one that
// appears revokes it.
func TestTheScanWritesTheVerdictsOnTheNodes(t *testing.T) {
	f := newFixture(t, false)
	f.settle(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	// Only this test writes the verdicts: each write is a Node change the
	// others count.
	go f.releases.Run(ctx, time.Second)
	verdicts := func() map[string]admission.ReleaseVerdict {
		list, err := f.client.Resource(nodesGVR).List(ctx, metav1.ListOptions{})
		require.NoError(t, err)
		out := map[string]admission.ReleaseVerdict{}
		for _, n := range list.Items {
			if v := admission.VerdictOf(f.info, n.GetAnnotations()); v.UID == string(n.GetUID()) || v.Blocker != "" {
				out[n.GetName()] = v
			}
		}
		return out
	}
	released := func(name string) bool { return verdicts()[name].UID != "" }
	// The workers write one Node at a time: every verdict comes to be.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		have := verdicts()
		for _, n := range []string{"dev-md-0-left", "dev-md-0-unannotated", "dev-md-0-owned"} {
			assert.NotEmpty(c, have[n].UID, "nothing linked to %s exists", n)
		}
		assert.Contains(c, have["dev-md-0-infra-deleting"].Blocker, "being deleted")
		assert.True(c, f.releases.Settled(""))
	}, 5*time.Second, 20*time.Millisecond)
	have := verdicts()
	for _, n := range []string{"dev-md-0-infra", "dev-md-0-deleting", "dev-md-0-infra-deleting"} {
		assert.Empty(t, have[n].UID, "its DockerMachine exists")
	}
	assert.Empty(t, have["dev-md-0-infra"].Blocker, "a running Node carries no text")

	require.NoError(t, f.client.Resource(dockers).Namespace("default").Delete(ctx, "dev-md-0-infra", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool {
		f.scanner.RunDue(ctx, f.clock.Now())
		return released("dev-md-0-infra")
	}, 5*time.Second, 20*time.Millisecond, "released once its DockerMachine is gone")

	// Linked only through its Machine's infrastructureRef (no providerID
	// yet): the DockerMachine appearing after its Machine revokes the Node's
	// release.
	late := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "DockerMachine",
		"metadata": map[string]any{"namespace": "default", "name": "dev-md-0-owned"}}}
	_, err := f.client.Resource(dockers).Namespace("default").Create(ctx, late, metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		f.scanner.RunDue(ctx, f.clock.Now())
		return !released("dev-md-0-owned")
	}, 5*time.Second, 20*time.Millisecond, "revoked once its Machine's DockerMachine exists")
}

var (
	nodesGVR = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
	dockers  = schema.GroupVersionResource{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Resource: "dockermachines"}
)

const reregisteredUID = "00000000-0000-4000-8000-0000000000ff"

// reregister deletes Node name and creates it again with a new UID, as a
// kubelet whose host outlived its deletion does, created at the clock's
// time with the Ready condition given; annotated keeps CAPI's annotations.
func (f *fixture) reregister(t *testing.T, name string, ready corev1.ConditionStatus, annotated bool) {
	t.Helper()
	ctx := context.Background()
	old, err := f.client.Resource(nodesGVR).Get(ctx, name, metav1.GetOptions{})
	require.NoError(t, err)
	require.NoError(t, f.client.Resource(nodesGVR).Delete(ctx, name, metav1.DeleteOptions{}))
	now := f.clock.Now().UTC().Format(time.RFC3339)
	n := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": name, "uid": reregisteredUID, "resourceVersion": "900", "creationTimestamp": now},
		"spec":     map[string]any{"providerID": "docker:////" + name},
		"status":   map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": string(ready), "lastTransitionTime": now}}}}}
	if annotated {
		n.SetAnnotations(old.GetAnnotations())
	}
	_, err = f.client.Resource(nodesGVR).Create(ctx, n, metav1.CreateOptions{})
	require.NoError(t, err)
}

// ghostOf deletes Node name's DockerMachine and Machine (tombstoning its
// providerID), and has its host register the Node again, Ready, a minute
// later.
func (f *fixture) ghostOf(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, f.client.Resource(dockers).Namespace("default").Delete(ctx, name, metav1.DeleteOptions{}))
	require.NoError(t, f.client.Resource(machines).Namespace("default").Delete(ctx, name, metav1.DeleteOptions{}))
	require.Eventually(t, func() bool { return f.tombstones.Len() == 1 }, 5*time.Second, 10*time.Millisecond)
	f.clock.SetTime(t0.Add(time.Minute))
	f.reregister(t, name, corev1.ConditionTrue, false)
}

// failNodeUpdates has the next n Node updates fail; it returns how many
// are left to fail (below zero: all failed, and later ones went through).
func (f *fixture) failNodeUpdates(n int32) *atomic.Int32 {
	var left atomic.Int32
	left.Store(n)
	f.client.PrependReactor("update", "nodes", func(clienttesting.Action) (bool, runtime.Object, error) {
		if left.Add(-1) >= 0 {
			return true, nil, errors.New("the API server is unavailable")
		}
		return false, nil, nil
	})
	return &left
}

// taints are the keys of Node name's taints.
func (f *fixture) taints(t *testing.T, name string) []string {
	t.Helper()
	n, err := f.client.Resource(nodesGVR).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	list, _, _ := unstructured.NestedSlice(n.Object, "spec", "taints")
	var keys []string
	for _, x := range list {
		keys = append(keys, x.(map[string]any)["key"].(string))
	}
	return keys
}

// until runs what is due until cond holds.
func (f *fixture) until(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	require.Eventually(t, func() bool {
		f.scanner.RunDue(context.Background(), f.clock.Now())
		return cond()
	}, 5*time.Second, 20*time.Millisecond, msg)
}

// A Machine deleted in Cluster API's order tombstones its providerID; the
// Node its host registers again is a ghost: reported with an Event, tainted
// in taint mode, and never reaped, though it stays NotReady past the grace
// with CAPI's annotations on (an orphan in every other way). A new Machine
// carrying the providerID again is a legitimate reuse: the tombstone ends,
// the ghost is no more and loses the taint.
func TestAGhostIsReportedTaintedAndNeverReaped(t *testing.T) {
	f := newFixture(t, true)
	f.protection = nodes.ProtectionTaint
	f.settle(t)
	ctx := context.Background()
	const node, pid = "dev-md-0-deleting", "docker:////dev-md-0-deleting"
	require.NoError(t, f.client.Resource(dockers).Namespace("default").Delete(ctx, node, metav1.DeleteOptions{}))
	require.NoError(t, f.client.Resource(machines).Namespace("default").Delete(ctx, node, metav1.DeleteOptions{}))
	require.Eventually(t, func() bool { _, ok := f.tombstones.Get(pid); return ok }, 5*time.Second, 10*time.Millisecond)
	stone, _ := f.tombstones.Get(pid)
	assert.Equal(t, time.Date(2026, 11, 30, 11, 0, 0, 0, time.UTC), stone.DeletedAt, "from the deletionTimestamp")
	assert.Contains(t, []string{"DockerMachine default/" + node, "Machine default/" + node}, stone.Object)
	assert.Equal(t, node, stone.Node)
	assert.Equal(t, "default/dev", stone.Cluster)
	// The old Node, NotReady since before the tombstone, is an orphan.
	f.until(t, func() bool { return len(f.reaper.Orphans("")) == 2 }, "the Node left behind is an orphan")
	assert.Empty(t, f.ghosts.Ghosts())

	f.clock.SetTime(t0.Add(time.Minute))
	told := f.nodeChanges.Load()
	f.reregister(t, node, corev1.ConditionUnknown, true)
	// The cache holds the new Node before its handler tells the scanner: a
	// Node told after the clock's step below would first be seen a
	// confirmation late.
	f.until(t, func() bool {
		n, ok := f.nodes.Get(node)
		return ok && n.UID() == reregisteredUID && f.nodeChanges.Load() >= told+2
	}, "the Node cache has it, and the scanner was told of its delete and its add")
	f.scanner.RunDue(ctx, f.clock.Now())
	assert.Empty(t, f.ghosts.Ghosts(), "a ghost first seen is reported once it stayed one for the confirmation")
	f.clock.Step(nodes.DefaultGhostConfirm)
	f.until(t, func() bool { return len(f.ghosts.Ghosts()) == 1 }, "the re-registered Node is a ghost")
	g := f.ghosts.Ghosts()[0]
	assert.Equal(t, node, g.Ghost.Node)
	assert.Contains(t, g.Ghost.Reason, `providerID "docker:////dev-md-0-deleting" was carried by`)
	assert.Equal(t, []string{nodes.GhostTaintKey}, f.taints(t, node))
	select {
	case e := <-f.events.Events:
		assert.Contains(t, e, "Warning GhostNode")
		assert.Contains(t, e, "deleted at 2026-11-30T11:00:00Z")
	default:
		t.Fatal("no GhostNode Event")
	}

	// NotReady since 12:01, past every grace: never an orphan, never deleted.
	for _, d := range []time.Duration{7 * time.Minute, 13 * time.Minute, 20 * time.Minute} {
		res := f.at(t, d)
		assert.NotContains(t, res.Deleted, node)
	}
	assert.NotContains(t, f.reaper.Orphans(""), node)
	_, err := f.client.Resource(nodesGVR).Get(ctx, node, metav1.GetOptions{})
	require.NoError(t, err, "the ghost is still there")

	// The first removal of the taint fails: it is tried again.
	f.failNodeUpdates(1)
	reuse := testcluster.Object(testcluster.MachineGVK, "default", "dev-md-0-new", map[string]any{
		"spec": map[string]any{"clusterName": "dev", "providerID": pid,
			"infrastructureRef": map[string]any{"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": "dev-md-0-new"}}})
	_, err = f.client.Resource(machines).Namespace("default").Create(ctx, reuse, metav1.CreateOptions{})
	require.NoError(t, err)
	f.until(t, func() bool { return len(f.ghosts.Ghosts()) == 0 }, "a Machine carrying the providerID again: no ghost")
	_, ok := f.tombstones.Get(pid)
	assert.False(t, ok, "the tombstone ended")
	assert.Equal(t, []string{nodes.GhostTaintKey}, f.taints(t, node), "the first removal failed")
	f.until(t, func() bool {
		f.clock.Step(time.Second)
		return len(f.taints(t, node)) == 0
	}, "nodeguard's taint removed on a later try")
}

// Off, a ghost is reported and left alone: no taint.
func TestAGhostIsOnlyReportedWhenProtectionIsOff(t *testing.T) {
	f := newFixture(t, true)
	f.settle(t)
	const node = "dev-md-0-deleting"
	f.ghostOf(t, node)
	f.until(t, func() bool {
		f.clock.Step(time.Second)
		return len(f.ghosts.Ghosts()) == 1
	}, "the re-registered Node is a ghost")
	assert.Empty(t, f.taints(t, node))
}

// A ghost that a Machine links again by the Node's name alone (its tombstone
// stays: nothing carries the providerID) is no ghost: it loses the taint,
// though the first removal fails and nothing about its tombstone changes.
func TestAGhostLinkedAgainLosesItsTaintThoughTheFirstRemovalFails(t *testing.T) {
	f := newFixture(t, true)
	f.protection = nodes.ProtectionTaint
	f.settle(t)
	const node = "dev-md-0-deleting"
	f.ghostOf(t, node)
	f.until(t, func() bool {
		f.clock.Step(time.Second)
		return len(f.taints(t, node)) == 1
	}, "the re-registered Node is a ghost, tainted")

	failUpdates := f.failNodeUpdates(1)
	byName := testcluster.Object(testcluster.MachineGVK, "default", "dev-md-0-adopted", map[string]any{
		"spec": map[string]any{"clusterName": "dev",
			"infrastructureRef": map[string]any{"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": "dev-md-0-adopted"}},
		"status": map[string]any{"nodeRef": map[string]any{"name": node}}})
	_, err := f.client.Resource(machines).Namespace("default").Create(context.Background(), byName, metav1.CreateOptions{})
	require.NoError(t, err)
	f.until(t, func() bool { return len(f.ghosts.Ghosts()) == 0 && failUpdates.Load() == 0 }, "linked again: no ghost, and the first removal of the taint failed")
	assert.Equal(t, 1, f.tombstones.Len(), "the tombstone stays")
	f.until(t, func() bool {
		f.clock.Step(time.Second)
		return len(f.taints(t, node)) == 0
	}, "nodeguard's taint removed on a later try")
}
