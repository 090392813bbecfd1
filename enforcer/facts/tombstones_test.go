package facts

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nodeguard/nodeguard/enforcer/record"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

var t0 = time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)

func newStore(t *testing.T, opts TombstoneOptions) (*Tombstones, *clocktesting.FakeClock, *[]string) {
	t.Helper()
	clock := clocktesting.NewFakeClock(t0)
	var changed []string
	opts.Clock = clock
	opts.Changed = func(pid string) { changed = append(changed, pid) }
	return NewTombstones(opts), clock, &changed
}

func TestARecordLastsItsWindow(t *testing.T) {
	s, clock, changed := newStore(t, TombstoneOptions{Window: time.Hour})
	s.Record(Tombstone{ProviderID: "aws:///a/i-1", Object: "AWSMachine ns/m1", DeletedAt: t0.Add(-time.Minute)})
	got, ok := s.Get("aws:///a/i-1")
	require.True(t, ok)
	assert.Equal(t, t0.Add(time.Hour), got.Until, "the window counts from when it was seen gone")
	assert.Equal(t, []string{"aws:///a/i-1"}, *changed)
	clock.SetTime(got.Until)
	_, ok = s.Get("aws:///a/i-1")
	assert.False(t, ok, "the window ended")
	assert.Empty(t, s.List())
	_, ok = s.Get("")
	assert.False(t, ok)
}

// A deletion stuck for longer than the window (its finalizer removed by hand
// days later) is tombstoned for the whole window from when it went, as
// deleted when its deletion began.
func TestAStuckDeletionIsTombstonedForTheWholeWindow(t *testing.T) {
	s, _, _ := newStore(t, TombstoneOptions{Window: time.Hour})
	s.Record(Tombstone{ProviderID: "p", Object: "AWSMachine ns/m1", DeletedAt: t0.Add(-72 * time.Hour)})
	got, ok := s.Get("p")
	require.True(t, ok, "tombstoned although its deletion began three windows ago")
	assert.Equal(t, t0.Add(-72*time.Hour), got.DeletedAt)
	assert.Equal(t, t0.Add(time.Hour), got.Until)
}

// The InfraMachine goes after its Machine's deletion began: its deletion,
// the later, names the tombstone; a second record of the same deletion
// changes nothing.
func TestTheLaterDeletionNamesTheTombstone(t *testing.T) {
	s, _, changed := newStore(t, TombstoneOptions{})
	infra := Tombstone{ProviderID: "p", Object: "DockerMachine default/m", DeletedAt: t0.Add(-time.Minute)}
	machine := Tombstone{ProviderID: "p", Object: "Machine default/m", Node: "m", DeletedAt: t0.Add(-10 * time.Minute)}
	s.Record(infra)
	s.Record(machine)
	got, _ := s.Get("p")
	assert.Equal(t, "DockerMachine default/m", got.Object)
	assert.Equal(t, t0.Add(-time.Minute), got.DeletedAt)
	assert.Equal(t, "m", got.Node, "the Node's name, known from the Machine, is kept")
	s.Record(machine)
	assert.Len(t, *changed, 2, "the first record and the Node name: the third changed nothing")
}

func TestANewLinkEndsTheTombstone(t *testing.T) {
	s, _, changed := newStore(t, TombstoneOptions{})
	s.Record(Tombstone{ProviderID: "p", Object: "x", DeletedAt: t0})
	assert.True(t, s.End("p"))
	assert.False(t, s.End("p"))
	assert.Equal(t, []string{"p", "p"}, *changed)
	assert.Zero(t, s.Len())
}

func TestTheOldestGoFirstBeyondMax(t *testing.T) {
	s, _, changed := newStore(t, TombstoneOptions{Max: 3})
	for i := range 5 {
		s.Record(Tombstone{ProviderID: fmt.Sprint("p", i), Object: "x", DeletedAt: t0.Add(time.Duration(i) * time.Minute)})
	}
	var pids []string
	for _, ts := range s.List() {
		pids = append(pids, ts.ProviderID)
	}
	assert.Equal(t, []string{"p4", "p3", "p2"}, pids, "the newest first")
	assert.Contains(t, *changed, "p0", "an eviction is a change")
}

// What someone else wrote (another replica, `nodeguard ghosts --clear`)
// becomes the base, and the changes made here since the last write are
// replayed on it; a write clears them.
func TestAReloadKeepsTheChangesMadeSinceTheLastWrite(t *testing.T) {
	s, _, changed := newStore(t, TombstoneOptions{})
	a := Tombstone{ProviderID: "a", Object: "x", DeletedAt: t0}
	b := Tombstone{ProviderID: "b", Object: "y", DeletedAt: t0}
	s.Record(a)
	ts, n, differs := s.pending()
	require.True(t, differs)
	s.written(ts, n)
	_, _, differs = s.pending()
	assert.False(t, differs, "written: the ConfigMap holds it")

	s.Record(b)
	*changed = nil
	s.reload(nil) // `nodeguard ghosts --clear a`
	_, okA := s.Get("a")
	_, okB := s.Get("b")
	assert.False(t, okA, "cleared elsewhere")
	assert.True(t, okB, "recorded here since the last write")
	assert.Equal(t, []string{"a"}, *changed)
	ts, n, differs = s.pending()
	assert.True(t, differs)
	s.written(ts, n)
	s.reload([]Tombstone{{ProviderID: "b", Object: "y", DeletedAt: t0.UTC(), Until: t0.Add(DefaultTombstoneWindow)}})
	assert.Equal(t, 1, s.Len())
}

func TestPendingDropsWhatEnded(t *testing.T) {
	s, clock, changed := newStore(t, TombstoneOptions{Window: time.Minute})
	s.Record(Tombstone{ProviderID: "a", Object: "x", DeletedAt: t0})
	ts, n, _ := s.pending()
	s.written(ts, n)
	clock.Step(time.Minute)
	*changed = nil
	ts, _, differs := s.pending()
	assert.Empty(t, ts)
	assert.True(t, differs, "the ConfigMap still holds it")
	assert.Equal(t, []string{"a"}, *changed, "its Nodes are judged again")
}

func TestFitKeepsTheNewestUnderMaxBytes(t *testing.T) {
	var ts []Tombstone
	for i := range 6000 {
		ts = append(ts, Tombstone{ProviderID: fmt.Sprintf("aws:///eu-west-1a/i-%017d", i), Object: fmt.Sprintf("AWSMachine ns/m-%d", i),
			Node: fmt.Sprintf("ip-10-0-%d", i), DeletedAt: t0.Add(time.Duration(i) * time.Second), Until: t0.Add(24 * time.Hour)})
	}
	raw, kept, err := fit(ts)
	require.NoError(t, err)
	assert.LessOrEqual(t, len(raw), MaxBytes)
	assert.GreaterOrEqual(t, len(raw), MaxBytes*95/100, "no more dropped than needed")
	assert.Less(t, len(kept), len(ts))
	assert.Greater(t, len(kept), len(ts)/2)
	assert.Equal(t, ts[len(ts)-1].ProviderID, kept[0].ProviderID, "the newest kept")
	back, err := DecodeTombstones(string(raw))
	require.NoError(t, err)
	assert.Equal(t, kept, back)
}

func TestDecodeRefusesWhatItCannotRead(t *testing.T) {
	_, err := DecodeTombstones(`{"not": "a list"}`)
	assert.Error(t, err)
	_, err = DecodeTombstones(`[{"object": "x"}]`)
	assert.ErrorContains(t, err, "no providerID")
	ts, err := DecodeTombstones("")
	assert.NoError(t, err)
	assert.Empty(t, ts)
}

// reduced reduces obj as the inventory caches it.
func reduced(t *testing.T, model *rule.Model, role rule.Role, obj map[string]any) *record.Record {
	t.Helper()
	return model.Shape(role).FromUnstructured(&unstructured.Unstructured{Object: obj})
}

// Follow tombstones each providerID an object carried in a providerID link
// and carries no more, and ends those a new link carries; a name link gives
// the Node's name.
func TestFollowTombstonesWhatWentAndEndsWhatCame(t *testing.T) {
	model := rule.MustEmbeddedModel()
	s, _, _ := newStore(t, TombstoneOptions{})
	machine := reduced(t, model, rule.Machine, map[string]any{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
		"metadata": map[string]any{"namespace": "default", "name": "m1", "deletionTimestamp": "2026-12-04T11:00:00Z",
			"labels": map[string]any{"cluster.x-k8s.io/cluster-name": "dev"}},
		"spec":   map[string]any{"providerID": "docker:////m1", "clusterName": "dev"},
		"status": map[string]any{"nodeRef": map[string]any{"name": "node-1"}}})
	s.Follow(model, Change{Role: rule.Machine, New: machine}, nil)
	assert.Zero(t, s.Len(), "an add tombstones nothing")
	s.Follow(model, Change{Role: rule.Machine, Old: machine}, nil)
	got, ok := s.Get("docker:////m1")
	require.True(t, ok)
	assert.Equal(t, Tombstone{ProviderID: "docker:////m1", Object: "Machine default/m1", Node: "node-1", Cluster: "default/dev",
		DeletedAt: time.Date(2026, 12, 4, 11, 0, 0, 0, time.UTC), Until: t0.Add(DefaultTombstoneWindow)}, got, "deleted when its deletion began, the window from when it was seen gone")

	pool := func(ids ...any) *record.Record {
		return reduced(t, model, rule.InfraMachinePool, map[string]any{"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
			"kind": "DockerMachinePool", "metadata": map[string]any{"namespace": "default", "name": "pool"},
			"spec": map[string]any{"providerIDList": ids}})
	}
	s.Follow(model, Change{Role: rule.InfraMachinePool, Old: pool("a", "b"), New: pool("a")},
		func(pid string) string { return "node-of-" + pid })
	got, ok = s.Get("b")
	require.True(t, ok, "a pool that stops listing an instance tombstones it")
	assert.Equal(t, "node-of-b", got.Node)
	assert.Equal(t, t0, got.DeletedAt, "no deletion: when it was seen")
	_, ok = s.Get("a")
	assert.False(t, ok)

	s.Follow(model, Change{Role: rule.InfraMachinePool, Old: pool("a"), New: pool("a", "b")}, nil)
	_, ok = s.Get("b")
	assert.False(t, ok, "listed again: a legitimate reuse")
	s.Follow(model, Change{Role: rule.Machine, Old: machine, New: machine}, nil)
	_, ok = s.Get("docker:////m1")
	assert.True(t, ok, "an update that carried it before is no new link")
}

func TestEncodeIsNewestFirstAndNeverNull(t *testing.T) {
	raw, err := EncodeTombstones(nil)
	require.NoError(t, err)
	assert.Equal(t, "[]", string(raw))
	raw, err = EncodeTombstones([]Tombstone{{ProviderID: "old", DeletedAt: t0}, {ProviderID: "new", DeletedAt: t0.Add(time.Second)}})
	require.NoError(t, err)
	assert.Less(t, strings.Index(string(raw), `"new"`), strings.Index(string(raw), `"old"`))
}

// A ConfigMap that cannot be read at start is never written over: the
// keeper goes on without it and writes nothing until it has read it, which
// each Flush tries again (no watch event comes for one that does not exist).
func TestAKeeperThatCouldNotReadWritesNothing(t *testing.T) {
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{configMaps: "ConfigMapList"})
	forbidden := true
	client.PrependReactor("get", "configmaps", func(clienttesting.Action) (bool, runtime.Object, error) {
		if !forbidden {
			return false, nil, nil
		}
		return true, nil, apierrors.NewForbidden(configMaps.GroupResource(), ConfigMapName, errors.New("no Role"))
	})
	writes := 0
	for _, verb := range []string{"patch", "create"} {
		client.PrependReactor(verb, "configmaps", func(clienttesting.Action) (bool, runtime.Object, error) {
			writes++
			return true, nil, errors.New("the write reached the API")
		})
	}
	s, _, _ := newStore(t, TombstoneOptions{})
	k := &TombstoneKeeper{Store: s, Client: client, Namespace: "nodeguard-system"}
	require.ErrorContains(t, k.Load(context.Background()), "no Role")
	s.Record(Tombstone{ProviderID: "p", Object: "x", DeletedAt: t0})
	k.Flush(context.Background())
	assert.Zero(t, writes, "nothing written over what could not be read")
	_, ok := s.Get("p")
	assert.True(t, ok, "detection goes on from what is seen")

	forbidden = false // the Role arrived; the ConfigMap does not exist yet
	k.Flush(context.Background())
	assert.Equal(t, 1, writes, "read again, found absent, written")
}

// The watch event of an earlier write of this keeper, arriving after a newer
// one, is not taken as news: the store does not roll back to it.
func TestAKeepersOwnOlderWriteIsNotNews(t *testing.T) {
	s, _, _ := newStore(t, TombstoneOptions{})
	k := &TombstoneKeeper{Store: s, Namespace: "nodeguard-system", seen: "11", wrote: []string{"10", "11"}}
	s.Record(Tombstone{ProviderID: "p", Object: "x", DeletedAt: t0})
	older := &unstructured.Unstructured{Object: map[string]any{"data": map[string]any{ConfigMapKey: "[]"}}}
	older.SetResourceVersion("10")
	k.take(older)
	_, ok := s.Get("p")
	assert.True(t, ok, "kept")
	assert.Equal(t, "11", k.seen)

	byOthers := older.DeepCopy()
	byOthers.SetResourceVersion("12") // nodeguard ghosts --clear
	k.take(byOthers)
	assert.Equal(t, "12", k.seen)
}

// A command that reads the tombstones once keeps all the ConfigMap holds,
// whatever bound serve writes it with (--ghost-tombstones-max above 2000).
func TestLoadKeepsAllTheConfigMapHolds(t *testing.T) {
	var ts []Tombstone
	for i := range DefaultTombstoneMax + 500 {
		ts = append(ts, Tombstone{ProviderID: fmt.Sprintf("p-%d", i), Object: "x", DeletedAt: t0, Until: t0.Add(time.Hour)})
	}
	raw, err := EncodeTombstones(ts)
	require.NoError(t, err)
	cm := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"namespace": "nodeguard-system", "name": ConfigMapName}, "data": map[string]any{ConfigMapKey: string(raw)}}}
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{configMaps: "ConfigMapList"}, cm)
	s, err := LoadTombstones(context.Background(), client, "nodeguard-system")
	require.NoError(t, err)
	assert.Equal(t, len(ts), s.Len())
}
