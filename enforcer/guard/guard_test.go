package guard_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/internal/testcluster"
)

var (
	machineGVK = testcluster.MachineGVK
	dockerGVK  = testcluster.DockerMachineGVK
)

func newObj(gvk schema.GroupVersionKind, name string, fields map[string]any) *unstructured.Unstructured {
	return testcluster.Object(gvk, "default", name, fields)
}

func capdMachine() *unstructured.Unstructured {
	return newObj(machineGVK, "m1", map[string]any{
		"spec": map[string]any{"infrastructureRef": map[string]any{
			"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": "m1",
		}},
		"status": map[string]any{"nodeRef": map[string]any{"name": "n1"}},
	})
}

func capdInfra() *unstructured.Unstructured {
	return newObj(dockerGVK, "m1", map[string]any{"spec": map[string]any{}})
}

func capdNode() *unstructured.Unstructured {
	n := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": "n1"}}}
	return n
}

// cache builds an inventory holding the given objects.
func cache(t *testing.T, objs ...*unstructured.Unstructured) *facts.Inventory {
	t.Helper()
	inv := facts.NewInventory(rule.MustEmbeddedModel())
	machines, infras := inv.NewStore(facts.Machine), inv.NewStore(facts.InfraMachine)
	inv.AddKind(machineGVK, facts.Machine, machines)
	inv.AddKind(dockerGVK, facts.InfraMachine, infras)
	for _, o := range objs {
		store, role := infras, facts.InfraMachine
		if o.GetKind() == "Machine" {
			store, role = machines, facts.Machine
		}
		require.NoError(t, store.Add(inv.Record(o, role)))
	}
	return inv
}

// apiServer is a fake dynamic client with a mapper that knows both kinds.
func apiServer(objs ...runtime.Object) (*dynamicfake.FakeDynamicClient, meta.RESTMapper) {
	return testcluster.Serve([]testcluster.Kind{{GVK: machineGVK, Resource: "machines"}, {GVK: dockerGVK, Resource: "dockermachines"}}, objs...)
}

func decide(t *testing.T, inv *facts.Inventory, opts guard.Options, req guard.Request) (bool, []string) {
	t.Helper()
	d := decideFull(t, inv, opts, req)
	return d.Allowed, d.Messages
}

func decideFull(t *testing.T, inv *facts.Inventory, opts guard.Options, req guard.Request) rule.Decision {
	t.Helper()
	g, err := newGuard(context.Background(), inv, opts)
	require.NoError(t, err)
	d, err := g.Decide(context.Background(), req)
	require.NoError(t, err)
	return d
}

func TestReasons(t *testing.T) {
	node := guard.Request{Node: capdNode()}
	notReady := guard.Options{Ready: func() error { return errors.New("not synced") }}
	none := func() ([]schema.GroupVersionKind, []schema.GroupVersionKind) { return nil, nil }
	client, mapper := apiServer(capdMachine(), capdInfra())
	client.PrependReactor("get", "dockermachines", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("timeout")
	})
	exempt := guard.Request{Node: capdNode(), UserInfo: authenticationv1.UserInfo{Username: "ops"}}
	update := guard.Request{Operation: "UPDATE", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Node"}, Node: capdNode()}
	noNode := guard.Request{Name: "n1"}
	for want, got := range map[string]rule.Decision{
		rule.ReasonNotJudged:       decideFull(t, cache(t, capdMachine(), capdInfra()), guard.Options{}, update),
		rule.ReasonUnjudgeable:     decideFull(t, cache(t, capdMachine(), capdInfra()), guard.Options{}, noNode),
		rule.ReasonBlocked:         decideFull(t, cache(t, capdMachine(), capdInfra()), guard.Options{}, node),
		rule.ReasonNoLink:          decideFull(t, cache(t, capdMachine()), guard.Options{}, node),
		rule.ReasonUnverified:      decideFull(t, cache(t, capdMachine()), guard.Options{SyncedKinds: none}, node),
		rule.ReasonNotReady:        decideFull(t, cache(t), notReady, node),
		rule.ReasonFreshReadFailed: decideFull(t, cache(t, capdMachine()), guard.Options{Fresh: facts.NewFreshReader(client, mapper)}, node),
		rule.ReasonExempt: decideFull(t, cache(t, capdMachine(), capdInfra()),
			guard.Options{Parameters: map[string]any{"exemptUsers": []any{"ops"}}}, exempt),
	} {
		assert.Equal(t, want, got.Reason, "%v", got.Messages)
	}
}

func TestCacheOnlyDecisions(t *testing.T) {
	allowed, msgs := decide(t, cache(t, capdMachine(), capdInfra()), guard.Options{}, guard.Request{Node: capdNode()})
	assert.False(t, allowed)
	assert.Contains(t, msgs[0], "DockerMachine default/m1")

	allowed, _ = decide(t, cache(t, capdMachine()), guard.Options{}, guard.Request{Node: capdNode()})
	assert.True(t, allowed)
}

func TestFreshReadSeesAnInfraMachineTheCacheMissed(t *testing.T) {
	client, mapper := apiServer(capdMachine(), capdInfra())
	allowed, msgs := decide(t, cache(t, capdMachine()), guard.Options{Fresh: facts.NewFreshReader(client, mapper)}, guard.Request{Node: capdNode()})
	assert.False(t, allowed, "a stale 'gone' in the cache must not allow")
	assert.Contains(t, msgs[0], "DockerMachine default/m1")
}

func TestFreshReadFindsTheAnnotatedMachineTheCacheLacks(t *testing.T) {
	// Created while the watches were down: neither object is cached yet.
	client, mapper := apiServer(capdMachine(), capdInfra())
	node := capdNode()
	node.SetAnnotations(map[string]string{"cluster.x-k8s.io/machine": "m1", "cluster.x-k8s.io/cluster-namespace": "default"})
	allowed, _ := decide(t, cache(t), guard.Options{}, guard.Request{Node: node})
	require.True(t, allowed, "the cache alone knows no link")

	allowed, msgs := decide(t, cache(t), guard.Options{Fresh: facts.NewFreshReader(client, mapper)}, guard.Request{Node: node})
	assert.False(t, allowed, "the Machine the Node names, and its InfraMachine, are read from the API server")
	assert.Contains(t, msgs[0], "DockerMachine default/m1")
}

func TestFreshReadKeepsWhatTheRuleReads(t *testing.T) {
	// A full object as the API server returns it: managed fields, status and
	// a deletionTimestamp; the fresh copy is stripped like the cached one.
	infra := newObj(dockerGVK, "m1", map[string]any{
		"spec":   map[string]any{"customImage": "kindest/node:v1.34.1"},
		"status": map[string]any{"ready": true},
	})
	infra.SetDeletionTimestamp(&metav1.Time{Time: time.Date(2026, 11, 30, 7, 0, 0, 0, time.UTC)})
	infra.SetFinalizers([]string{"dockermachine.infrastructure.cluster.x-k8s.io"})
	infra.SetManagedFields([]metav1.ManagedFieldsEntry{{Manager: "capd", Operation: metav1.ManagedFieldsOperationUpdate}})
	client, mapper := apiServer(capdMachine(), infra)
	d := decideFull(t, cache(t, capdMachine()), guard.Options{Fresh: facts.NewFreshReader(client, mapper)}, guard.Request{Node: capdNode()})
	assert.False(t, d.Allowed)
	require.Len(t, d.Blockers, 1)
	assert.True(t, d.Blockers[0].Deleting, "the deletionTimestamp survives the strip")
	assert.Contains(t, d.Messages[0], "is being deleted but still exists")
}

func TestFreshReadDropsAnInfraMachineAlreadyGone(t *testing.T) {
	client, mapper := apiServer(capdMachine())
	allowed, _ := decide(t, cache(t, capdMachine(), capdInfra()), guard.Options{Fresh: facts.NewFreshReader(client, mapper)}, guard.Request{Node: capdNode()})
	assert.True(t, allowed, "a stale 'present' in the cache must not deny CAPI's own delete")
}

func TestFreshReadFailureDenies(t *testing.T) {
	client, mapper := apiServer(capdMachine(), capdInfra())
	client.PrependReactor("get", "dockermachines", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("etcdserver: request timed out")
	})
	allowed, msgs := decide(t, cache(t, capdMachine()), guard.Options{Fresh: facts.NewFreshReader(client, mapper)}, guard.Request{Node: capdNode()})
	assert.False(t, allowed)
	assert.Contains(t, msgs[0], "could not re-read")
	assert.Contains(t, msgs[0], "etcdserver: request timed out")
}

func TestNotReadyDenies(t *testing.T) {
	allowed, msgs := decide(t, cache(t), guard.Options{Ready: func() error { return errors.New("DockerMachine informer not synced") }},
		guard.Request{Node: capdNode()})
	assert.False(t, allowed)
	assert.Contains(t, msgs[0], "nodeguard is not ready (DockerMachine informer not synced)")
}

// While a cache is catching up after a broken watch, nothing linked proves
// nothing: such a decision is a denial of its own; one that found a blocker
// names it, and an exemption still holds.
func TestARecoveringCacheCannotProveAnAbsence(t *testing.T) {
	recovering := guard.Options{Recovering: func() error { return errors.New("the cache of DockerMachine is catching up") },
		Parameters: map[string]any{"exemptUsers": []any{"oncall"}}}
	g, err := newGuard(context.Background(), cache(t, capdMachine()), recovering)
	require.NoError(t, err)
	d, err := g.Decide(context.Background(), guard.Request{Node: capdNode()})
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	assert.Equal(t, rule.ReasonCacheRecovering, d.Reason)
	assert.Contains(t, d.Messages[0], "the cache of DockerMachine is catching up, so nodeguard cannot prove nothing links to the Node")

	g, err = newGuard(context.Background(), cache(t, capdMachine(), capdInfra()), recovering)
	require.NoError(t, err)
	d, err = g.Decide(context.Background(), guard.Request{Node: capdNode()})
	require.NoError(t, err)
	assert.Equal(t, rule.ReasonBlocked, d.Reason, "what the cache shows still blocks")
	d, err = g.Decide(context.Background(), guard.Request{Node: capdNode(), UserInfo: authenticationv1.UserInfo{Username: "oncall"}})
	require.NoError(t, err)
	assert.True(t, d.Allowed, "an exemption holds")
	_, err = g.Objects(context.Background(), capdNode(), false)
	assert.ErrorContains(t, err, "catching up", "no answer of what is linked while it may lack some")
}

// A watch-filter install that does not hold a Cluster whole proves no
// absence there: a decision that found nothing linked is a denial naming
// why; one that found a blocker names it; the orphan criteria get no route.
func TestAClusterNotHeldWholeCannotProveAnAbsence(t *testing.T) {
	notHeld := guard.Options{Holds: func(cluster string) error {
		if cluster == "default/c1" {
			return nil
		}
		return fmt.Errorf("Cluster %s is moving between nodeguard shards", cluster)
	}}
	g, err := newGuard(context.Background(), cache(t, capdMachine()), notHeld)
	require.NoError(t, err)
	d, err := g.Decide(context.Background(), guard.Request{Node: capdNode(), Cluster: "default/c2"})
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	assert.Equal(t, rule.ReasonNotHeld, d.Reason)
	assert.Contains(t, d.Messages[0], "Cluster default/c2 is moving between nodeguard shards")
	d, err = g.Decide(context.Background(), guard.Request{Node: capdNode(), Cluster: "default/c1"})
	require.NoError(t, err)
	assert.True(t, d.Allowed, "a Cluster held whole is judged by the rule alone")

	inv := cache(t, capdMachine(), capdInfra())
	g, err = newGuard(context.Background(), inv, notHeld)
	require.NoError(t, err)
	d, err = g.Decide(context.Background(), guard.Request{Node: capdNode()})
	require.NoError(t, err)
	assert.Equal(t, rule.ReasonBlocked, d.Reason, "what the cache shows still blocks")
	f, err := guard.NewFinder(guard.FinderOptions{Guard: g, Inventory: inv})
	require.NoError(t, err)
	_, err = f.Route("default/c2")
	assert.ErrorContains(t, err, "moving between nodeguard shards", "no orphan, release or ghost where the caches hold part")
}

func TestSyncedKindsReplaceTheParameters(t *testing.T) {
	none := func() ([]schema.GroupVersionKind, []schema.GroupVersionKind) { return nil, nil }
	allowed, msgs := decide(t, cache(t, capdMachine()), guard.Options{SyncedKinds: none}, guard.Request{Node: capdNode()})
	assert.False(t, allowed, "DockerMachine is not synced, so its absence proves nothing")
	assert.Contains(t, msgs[0], "a kind nodeguard does not see")

	docker := func() ([]schema.GroupVersionKind, []schema.GroupVersionKind) {
		return []schema.GroupVersionKind{dockerGVK}, nil
	}
	allowed, _ = decide(t, cache(t, capdMachine()), guard.Options{SyncedKinds: docker}, guard.Request{Node: capdNode()})
	assert.True(t, allowed)
}

// The guard keeps converted parameters per route; a change of the synced
// kinds, or another route, must still reach the rule.
func TestOneGuardFollowsSyncedKindsAndRoutes(t *testing.T) {
	var synced []schema.GroupVersionKind
	m := capdMachine()
	m.SetLabels(map[string]string{"cluster.x-k8s.io/cluster-name": "dev"})
	g, err := newGuard(context.Background(), cache(t, m), guard.Options{
		SyncedKinds: func() ([]schema.GroupVersionKind, []schema.GroupVersionKind) { return synced, nil },
	})
	require.NoError(t, err)
	decideOn := func(cluster string) rule.Decision {
		d, err := g.Decide(context.Background(), guard.Request{Node: capdNode(), Cluster: cluster})
		require.NoError(t, err)
		return d
	}
	assert.Equal(t, rule.ReasonUnverified, decideOn("default/dev").Reason, "DockerMachine not synced yet")
	synced = []schema.GroupVersionKind{dockerGVK}
	assert.Equal(t, rule.ReasonNoLink, decideOn("default/dev").Reason, "DockerMachine synced now, and absent")
	synced = nil
	assert.Equal(t, rule.ReasonUnverified, decideOn("default/dev").Reason, "DockerMachine no longer synced")
	assert.Equal(t, rule.ReasonNoLink, decideOn("default/other").Reason, "the Machine belongs to another cluster")
	assert.Equal(t, rule.ReasonUnverified, decideOn("default/dev").Reason)
}

// Routes and synced kinds changing under concurrent decisions (run with -race).
func TestConcurrentDecisionsShareConvertedParameters(t *testing.T) {
	var dockerSynced atomic.Bool
	m := capdMachine()
	m.SetLabels(map[string]string{"cluster.x-k8s.io/cluster-name": "dev"})
	g, err := newGuard(context.Background(), cache(t, m), guard.Options{
		SyncedKinds: func() ([]schema.GroupVersionKind, []schema.GroupVersionKind) {
			if dockerSynced.Load() {
				return []schema.GroupVersionKind{dockerGVK}, nil
			}
			return nil, nil
		},
	})
	require.NoError(t, err)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				if w == 0 {
					dockerSynced.Store(i%2 == 0)
				}
				cluster := []string{"default/dev", "default/other"}[(w+i)%2]
				d, err := g.Decide(context.Background(), guard.Request{Node: capdNode(), Cluster: cluster})
				if !assert.NoError(t, err) {
					return
				}
				if cluster == "default/other" {
					assert.Equal(t, rule.ReasonNoLink, d.Reason, "the Machine belongs to another cluster")
				} else {
					assert.Contains(t, []string{rule.ReasonNoLink, rule.ReasonUnverified}, d.Reason)
				}
			}
		}()
	}
	wg.Wait()
}

func TestClusterScopeAndExemptions(t *testing.T) {
	m := capdMachine()
	m.SetLabels(map[string]string{"cluster.x-k8s.io/cluster-name": "other"})
	allowed, _ := decide(t, cache(t, m, capdInfra()), guard.Options{}, guard.Request{Node: capdNode(), Cluster: "default/dev"})
	assert.True(t, allowed, "a Machine of another cluster does not count")
	allowed, _ = decide(t, cache(t, m, capdInfra()), guard.Options{}, guard.Request{Node: capdNode(), Cluster: "default/other"})
	assert.False(t, allowed)

	g, err := newGuard(context.Background(), cache(t, capdMachine(), capdInfra()), guard.Options{Parameters: map[string]any{"exemptGroups": []any{"ops"}}})
	require.NoError(t, err)
	d, err := g.Decide(context.Background(), guard.Request{Node: capdNode(), UserInfo: authenticationv1.UserInfo{Username: "bob", Groups: []string{"ops"}}})
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	require.Len(t, d.Warnings, 1)
	assert.Contains(t, d.Warnings[0], `group "ops" is exempt`)
}

// A live Constraint edit: the next decision reads the new parameters, on
// every cluster route, and the groups kept of a review follow them.
func TestSetParametersChangesTheNextDecision(t *testing.T) {
	ctx := context.Background()
	m := capdMachine()
	m.SetLabels(map[string]string{"cluster.x-k8s.io/cluster-name": "dev"})
	g, err := newGuard(ctx, cache(t, m, capdInfra()), guard.Options{})
	require.NoError(t, err)
	ops := guard.Request{Node: capdNode(), Cluster: "default/dev", UserInfo: authenticationv1.UserInfo{Username: "bob", Groups: []string{"ops"}}}
	d, err := g.Decide(ctx, ops)
	require.NoError(t, err)
	require.False(t, d.Allowed, "converted and kept for the route")
	assert.False(t, g.KeepGroup("ops"))

	require.NoError(t, g.SetParameters(map[string]any{"exemptGroups": []any{"ops"}}))
	assert.True(t, g.KeepGroup("ops"))
	d, err = g.Decide(ctx, ops)
	require.NoError(t, err)
	assert.True(t, d.Allowed, "the route's converted parameters were built from the set before")

	require.NoError(t, g.SetParameters(nil))
	d, err = g.Decide(ctx, ops)
	require.NoError(t, err)
	assert.False(t, d.Allowed, "nil: the rule's defaults again")
	assert.Empty(t, g.Parameters()["exemptGroups"])
}

// The guard passes the rule only a user's exempt groups (a forged review may
// carry 100,000): the decision and its warning stay the rule's own.
func TestManyGroupsDecideAsFew(t *testing.T) {
	g, err := newGuard(context.Background(), cache(t, capdMachine(), capdInfra()),
		guard.Options{Parameters: map[string]any{"exemptGroups": []any{"ops", "break-glass"}}})
	require.NoError(t, err)
	many := make([]string, 0, 10_002)
	for i := range 10_000 {
		many = append(many, fmt.Sprintf("team-%d", i))
	}
	d, err := g.Decide(context.Background(), guard.Request{Node: capdNode(), UserInfo: authenticationv1.UserInfo{Username: "bob", Groups: many}})
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	d, err = g.Decide(context.Background(), guard.Request{Node: capdNode(),
		UserInfo: authenticationv1.UserInfo{Username: "bob", Groups: append(many, "ops", "break-glass")}})
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	require.Len(t, d.Warnings, 1)
	assert.Contains(t, d.Warnings[0], `group "break-glass" is exempt`, "the first exempt group in order, as the rule picks it")
}

func TestBadRequests(t *testing.T) {
	g, err := newGuard(context.Background(), cache(t), guard.Options{})
	require.NoError(t, err)
	for _, cluster := range []string{"no-slash", "/name", "ns/", "a/b/c"} {
		_, err = g.Decide(context.Background(), guard.Request{Node: capdNode(), Cluster: cluster})
		assert.ErrorContains(t, err, "want NAMESPACE/NAME", cluster)
	}
}

// A request without a Node is the rule's to decide: it denies a Node delete
// it cannot see, exempt user or not, and allows what it does not judge.
func TestRequestsWithoutANodeAreTheRulesToDecide(t *testing.T) {
	g, err := newGuard(context.Background(), cache(t, capdMachine(), capdInfra()),
		guard.Options{Parameters: map[string]any{"exemptUsers": []any{"ops"}}})
	require.NoError(t, err)
	for _, user := range []string{"bob", "ops"} {
		d, err := g.Decide(context.Background(), guard.Request{Name: "n1", UserInfo: authenticationv1.UserInfo{Username: user}})
		require.NoError(t, err)
		assert.False(t, d.Allowed, user)
		require.Len(t, d.Messages, 1)
		assert.Contains(t, d.Messages[0], `Node "n1" cannot be judged: the DELETE request carries no oldObject`)
	}
	d, err := g.Decide(context.Background(), guard.Request{Operation: "DELETE", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Name: "p"})
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	assert.Equal(t, rule.ReasonNotJudged, d.Reason)
}

// concurrency wraps a FreshReader, holding each Get until want Gets are in
// flight together (or 10 s passed: then they were not made at once), and
// records the most Gets in flight together.
type concurrency struct {
	guard.FreshReader
	want      int32
	together  chan struct{}
	once      sync.Once
	now, most atomic.Int32
}

func (c *concurrency) Get(ctx context.Context, gvk schema.GroupVersionKind, namespace, name string) (*unstructured.Unstructured, error) {
	n := c.now.Add(1)
	defer c.now.Add(-1)
	for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
	}
	if n >= c.want {
		c.once.Do(func() { close(c.together) })
	}
	select {
	case <-c.together:
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
	}
	return c.FreshReader.Get(ctx, gvk, namespace, name)
}

func TestFreshReadsOfOneDecisionRunConcurrently(t *testing.T) {
	// Two candidates (the Machine and its DockerMachine) are one wave: a
	// decision pays one round trip for them, not two.
	client, mapper := apiServer(capdMachine(), capdInfra())
	reads := &concurrency{FreshReader: facts.NewFreshReader(client, mapper), want: 2, together: make(chan struct{})}
	allowed, msgs := decide(t, cache(t, capdMachine(), capdInfra()), guard.Options{Fresh: reads}, guard.Request{Node: capdNode()})
	assert.False(t, allowed)
	assert.Contains(t, msgs[0], "DockerMachine default/m1")
	assert.Equal(t, int32(2), reads.most.Load(), "both candidates read at once")
}

// newGuard is guard.New with the embedded policy when opts names none.
func newGuard(ctx context.Context, inv *facts.Inventory, opts guard.Options) (*guard.Guard, error) {
	if opts.Engine == nil {
		e, err := rule.NewEngine(ctx)
		if err != nil {
			return nil, err
		}
		opts.Engine = e
	}
	return guard.New(ctx, inv, opts)
}
