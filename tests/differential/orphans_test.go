package differential

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/nodes"
	"github.com/nodeguard/nodeguard/enforcer/record"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

var (
	orphanScenarios = flag.Int("orphan-scenarios", 150, "randomized histories for the narrowed orphan judge")
	orphanSteps     = flag.Int("orphan-steps", 12, "changes per history")
)

// The narrowed orphan judge (nodes.Scanner: Nodes judged only when they, an
// object that could link to them, the evidence or the clock change, and
// screened by the criteria that read only the Node) must find exactly the
// orphans a full pass finds (every Node, the full criteria, from the same
// caches), after every change of a random history: Nodes, Machines,
// InfraMachines and pools added, changed and deleted, and the clock moving
// past graces; in two routes at once (the whole inventory, and one Cluster).
func TestNarrowedOrphanJudgeAgreesWithAFullPass(t *testing.T) {
	ctx := context.Background()
	eval, err := rule.NewEngine(ctx)
	require.NoError(t, err)
	shape, err := facts.NodeShapeOf(eval)
	require.NoError(t, err)
	var judged, full, found, checks int
	for i := range *orphanScenarios {
		rng := rand.New(rand.NewPCG(*seed, uint64(i)+1))
		h := newHistory(t, eval, shape, i%2 == 1, rng, false)
		for step := 0; step <= *orphanSteps; step++ {
			if step > 0 {
				h.change()
			}
			res := h.scanner.RunDue(ctx, h.clock.Now())
			judged += res.Judged
			for _, route := range routes {
				want := h.fullPass(route)
				got := h.reaper.Orphans(route)
				if !slices.Equal(want, got) {
					t.Fatalf("history %d (seed %d, matchProviderID %v), step %d, route %q: a full pass finds orphans %v, the narrowed judge %v\nchanges:\n%s\nnodes:\n%s",
						i, *seed, h.matchProviderID, step, route, want, got, strings.Join(h.log, "\n"), h.dumpNodes())
				}
				found += len(want)
				full += len(h.nodeNames())
				checks++
			}
		}
	}
	fmt.Printf("orphan differential: %d histories x %d changes, %d checks agree (%d orphans found); the narrowed judge judged %d Nodes where full passes judged %d, seed %d\n",
		*orphanScenarios, *orphanSteps, checks, found, judged, full, *seed)
	// A generator that never makes an orphan, or never keeps a Node, proves nothing.
	require.Greater(t, found, checks/10)
	require.Less(t, found, full/2)
}

// routes are judged side by side: every Machine counts, or one Cluster's.
var routes = []string{"", "ns-a/c1"}

// history is a random cluster and the narrowed judge following it.
type history struct {
	t               *testing.T
	rng             *rand.Rand
	inv             *facts.Inventory
	shape           *record.Shape
	finder          *guard.Finder
	scanner         *nodes.Scanner
	reaper          *nodes.Reaper
	clock           *clocktesting.FakeClock
	nodes           map[string]*facts.Nodes // by route: each route watches the same Nodes
	objects         map[string]*unstructured.Unstructured
	matchProviderID bool
	log             []string
	// releases, when set, writes the verdicts on each route's Nodes into
	// written (by route and Node: what each Node carries).
	releases *nodes.Publisher
	info     admission.PolicyInfo
	mu       sync.Mutex
	written  map[string]map[string]admission.ReleaseVerdict
}

var (
	machineV1beta2 = schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "Machine"}
	machineV1beta1 = schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta1", Kind: "Machine"}
	poolGVK        = schema.GroupVersionKind{Group: poolKinds[0].group, Version: poolKinds[0].version, Kind: poolKinds[0].kind}
)

func newHistory(t *testing.T, eval *rule.Engine, shape *record.Shape, matchProviderID bool, rng *rand.Rand, publish bool) *history {
	t.Helper()
	ctx := context.Background()
	model := eval.Model()
	inv := facts.NewInventory(model)
	inv.AddKind(machineV1beta2, facts.Machine, inv.NewStore(facts.Machine))
	inv.AddKind(machineV1beta1, facts.Machine, inv.NewStore(facts.Machine))
	for _, k := range infraKinds {
		inv.AddKind(schema.GroupVersionKind{Group: k.group, Version: k.version, Kind: k.kind}, facts.InfraMachine, inv.NewStore(facts.InfraMachine))
	}
	inv.AddKind(poolGVK, facts.InfraMachinePool, inv.NewStore(facts.InfraMachinePool))
	g, err := guard.New(ctx, inv, guard.Options{Engine: eval})
	require.NoError(t, err)
	evidence := guard.NewEvidence(model)
	finder, err := guard.NewFinder(guard.FinderOptions{Guard: g, Inventory: inv, Evidence: evidence, Grace: 5 * time.Minute, MatchProviderID: matchProviderID})
	require.NoError(t, err)
	clock := clocktesting.NewFakeClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	r, err := nodes.NewReaper(nodes.ReaperOptions{Finder: finder, Clock: clock})
	require.NoError(t, err)
	var scanner *nodes.Scanner
	var pub *nodes.Publisher
	var info admission.PolicyInfo
	if publish {
		info, err = admission.LoadPolicyInfo()
		require.NoError(t, err)
		pub, err = nodes.NewPublisher(nodes.PublisherOptions{Judge: finder.Releases, Ready: func() error { return nil }, Info: info,
			Rejudge: func(c string) { scanner.JudgeCluster(c) }})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { pub.Run(ctx, time.Hour); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	scanner, err = nodes.NewScanner(nodes.ScanOptions{Finder: finder, Evidence: evidence, Reaper: r, Model: model,
		Ready: func() error { return nil }, Interval: 1000 * time.Hour, Clock: clock, Releases: pub})
	require.NoError(t, err)
	h := &history{t: t, rng: rng, inv: inv, shape: shape, finder: finder, scanner: scanner, reaper: r, clock: clock,
		nodes: map[string]*facts.Nodes{}, objects: map[string]*unstructured.Unstructured{}, matchProviderID: matchProviderID,
		releases: pub, info: info, written: map[string]map[string]admission.ReleaseVerdict{}}
	for _, route := range routes {
		h.nodes[route] = facts.NewNodes(shape, nil, func(n string) { scanner.NodeChanged(route, n) })
		scanner.AddCluster(route, synced{h.nodes[route]}, nodes.ReapTarget{})
		if pub != nil {
			h.written[route] = map[string]admission.ReleaseVerdict{}
			pub.Enroll(route, func(_ context.Context, node string, v admission.ReleaseVerdict) error {
				h.mu.Lock()
				defer h.mu.Unlock()
				h.written[route][node] = v
				return nil
			})
		}
	}
	for i := range 1 + rng.IntN(5) {
		h.putMachine(fmt.Sprintf("m%d", i))
	}
	for i := range rng.IntN(4) {
		h.putInfra(fmt.Sprintf("i%d", i))
	}
	for _, n := range nodeNames {
		if rng.IntN(5) > 0 {
			h.putNode(n)
		}
	}
	return h
}

// synced is a Node cache that is always synced, as one fed directly is.
type synced struct{ *facts.Nodes }

func (synced) HasSynced() bool { return true }

func (h *history) now() time.Time { return h.clock.Now() }

// change applies one random change.
func (h *history) change() {
	switch h.rng.IntN(9) {
	case 0, 1:
		h.clock.Step(time.Duration(h.rng.IntN(240)+1) * time.Second)
		h.log = append(h.log, "clock now "+h.now().Format(time.RFC3339))
	case 2:
		h.putMachine(fmt.Sprintf("m%d", h.rng.IntN(6)))
	case 3:
		h.putInfra(fmt.Sprintf("i%d", h.rng.IntN(4)))
	case 4:
		h.putPool()
	case 5:
		h.deleteObject()
	case 6, 7:
		h.putNode(pick(h.rng, nodeNames))
	case 8:
		n := pick(h.rng, nodeNames)
		h.log = append(h.log, "delete Node "+n)
		for route, c := range h.nodes {
			require.NoError(h.t, c.Delete(n))
			h.carried(route, n)
		}
	}
}

// put stores an object in its kind's store and tells the scanner, as an
// informer would.
func (h *history) put(o *unstructured.Unstructured, role facts.Role) {
	k := o.GroupVersionKind().String() + " " + o.GetNamespace() + "/" + o.GetName()
	// A kind's objects are one version: drop the other version of a Machine.
	for _, other := range []schema.GroupVersionKind{machineV1beta2, machineV1beta1} {
		if o.GroupVersionKind().GroupKind() == other.GroupKind() && o.GroupVersionKind() != other {
			otherKey := other.String() + " " + o.GetNamespace() + "/" + o.GetName()
			if old, ok := h.objects[otherKey]; ok {
				h.remove(otherKey, old)
			}
		}
	}
	var old *record.Record
	if prev, ok := h.objects[k]; ok {
		old = h.inv.Record(prev, role)
	}
	r := h.inv.Record(o, role)
	require.NoError(h.t, h.store(o.GroupVersionKind()).Add(r))
	h.objects[k] = o
	h.log = append(h.log, fmt.Sprintf("put %s %v", k, o.Object))
	h.scanner.ObjectChanged(facts.Change{Role: role, Old: old, New: r})
}

func (h *history) remove(k string, o *unstructured.Unstructured) {
	role := h.role(o.GroupVersionKind())
	r := h.inv.Record(o, role)
	require.NoError(h.t, h.store(o.GroupVersionKind()).Delete(r))
	delete(h.objects, k)
	h.log = append(h.log, "delete "+k)
	h.scanner.ObjectChanged(facts.Change{Role: role, Old: r})
}

func (h *history) deleteObject() {
	if len(h.objects) == 0 {
		return
	}
	keys := make([]string, 0, len(h.objects))
	for k := range h.objects {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	k := pick(h.rng, keys)
	h.remove(k, h.objects[k])
}

func (h *history) role(gvk schema.GroupVersionKind) facts.Role {
	switch gvk.GroupKind() {
	case machineV1beta2.GroupKind():
		return facts.Machine
	case poolGVK.GroupKind():
		return facts.InfraMachinePool
	}
	return facts.InfraMachine
}

func (h *history) store(gvk schema.GroupVersionKind) cache.Store {
	s := h.inv.Store(gvk)
	require.NotNil(h.t, s, "no store for %s", gvk)
	return s
}

func (h *history) putMachine(name string) {
	rng := h.rng
	ns, cl, kind := pick(rng, namespaces), pick(rng, clusters), pick(rng, infraKinds)
	// Half the time naming an InfraMachine the history makes (i0..i3), so
	// that one appearing or going changes its Machine's Node.
	infraName := name
	if rng.IntN(2) == 0 {
		infraName = fmt.Sprintf("i%d", rng.IntN(4))
	}
	m := newObject("cluster.x-k8s.io/v1beta2", "Machine", ns, name)
	ref := map[string]any{"apiGroup": kind.group, "kind": kind.kind, "name": infraName}
	if rng.IntN(3) == 0 {
		m.SetAPIVersion("cluster.x-k8s.io/v1beta1")
		ref = map[string]any{"apiVersion": kind.group + "/" + kind.version, "kind": kind.kind, "name": infraName, "namespace": ns}
	}
	spec := map[string]any{"clusterName": cl, "infrastructureRef": ref}
	// Half the time linking a Node by providerID or nodeRef, or trying to
	// (names beyond nodeNames are Nodes that do not exist).
	if rng.IntN(2) == 0 {
		spec["providerID"] = fmt.Sprintf("docker:////n%d", rng.IntN(2*len(nodeNames)))
	}
	m.Object["spec"] = spec
	if rng.IntN(3) == 0 {
		m.Object["status"] = map[string]any{"nodeRef": map[string]any{"name": fmt.Sprintf("n%d", rng.IntN(2*len(nodeNames)))}}
	}
	if rng.IntN(2) == 0 {
		m.SetLabels(map[string]string{"cluster.x-k8s.io/cluster-name": cl})
	}
	if rng.IntN(6) == 0 {
		m.Object["metadata"].(map[string]any)["deletionTimestamp"] = "2026-11-30T10:00:00Z"
	}
	h.put(m, facts.Machine)
}

func (h *history) putInfra(name string) {
	kind := pick(h.rng, infraKinds[:3]) // the synced kinds: FooMachine has no store, it is unverified
	o := infra(h.rng, kind, pick(h.rng, namespaces), name, pick(h.rng, clusters))
	if h.rng.IntN(3) == 0 {
		o.Object["spec"] = map[string]any{"providerID": fmt.Sprintf("aws:///us-east-1a/i-%d", h.rng.IntN(3))}
	}
	h.put(o, facts.InfraMachine)
}

func (h *history) putPool() {
	p := newObject(poolKinds[0].group+"/"+poolKinds[0].version, poolKinds[0].kind, pick(h.rng, namespaces), "pool")
	var ids []any
	for range h.rng.IntN(3) {
		ids = append(ids, providerID(h.rng))
	}
	p.Object["spec"] = map[string]any{"providerIDList": ids}
	labelCluster(h.rng, p, pick(h.rng, clusters))
	h.put(p, facts.InfraMachinePool)
}

// putNode adds or changes a Node: annotations naming a Machine (or a gone
// one, or half of them), a providerID, and a Ready condition that moved a
// random while ago, so graces end as the clock moves.
func (h *history) putNode(name string) {
	rng := h.rng
	node := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": name, "uid": fmt.Sprintf("uid-%s-%d", name, rng.IntN(2)), "resourceVersion": fmt.Sprint(rng.IntN(1000))},
	}}
	if pid := providerID(rng); pid != "" || rng.IntN(2) == 0 {
		if rng.IntN(5) == 0 {
			pid = "aws:///us-east-1a/i-" + fmt.Sprint(rng.IntN(3))
		}
		node.Object["spec"] = map[string]any{"providerID": pid}
	}
	if rng.IntN(4) > 0 {
		ann := map[string]string{"cluster.x-k8s.io/cluster-namespace": pick(rng, namespaces),
			"cluster.x-k8s.io/machine": fmt.Sprintf("m%d", rng.IntN(10)), "cluster.x-k8s.io/cluster-name": pick(rng, clusters)}
		if rng.IntN(6) == 0 {
			delete(ann, "cluster.x-k8s.io/cluster-namespace")
		}
		node.SetAnnotations(ann)
	}
	switch rng.IntN(6) {
	case 0: // no Ready condition: from its creation
		node.SetCreationTimestamp(metav1.NewTime(h.now().Add(-time.Duration(rng.IntN(600)) * time.Second)))
	case 1:
		setReady(node, "True", h.now().Add(-time.Hour))
	default:
		setReady(node, pick(rng, []string{"Unknown", "False"}), h.now().Add(-time.Duration(rng.IntN(600))*time.Second))
	}
	h.log = append(h.log, fmt.Sprintf("put Node %v", node.Object))
	for route, c := range h.nodes {
		r, err := h.shape.Reduce(h.carrying(route, node))
		require.NoError(h.t, err)
		require.NoError(h.t, c.Add(r))
	}
}

// carrying is node as the API server keeps it: an update keeps the verdict
// written on the Node; a Node of another UID (created again) has none.
func (h *history) carrying(route string, node *unstructured.Unstructured) *unstructured.Unstructured {
	if h.releases == nil {
		return node
	}
	c, _ := h.nodes[route].Get(node.GetName())
	if c == nil || c.Unstructured().GetUID() != node.GetUID() {
		h.carried(route, node.GetName())
		return node
	}
	h.mu.Lock()
	v := h.written[route][node.GetName()]
	h.mu.Unlock()
	out := node.DeepCopy()
	a := out.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	for k, val := range map[string]string{h.info.Released: v.UID, h.info.Blocker: v.Blocker} {
		delete(a, k)
		if val != "" {
			a[k] = val
		}
	}
	out.SetAnnotations(a)
	return out
}

// carried forgets what a Node that is gone (or another one now) carried.
func (h *history) carried(route, node string) {
	if h.releases == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.written[route], node)
}

func setReady(node *unstructured.Unstructured, status string, since time.Time) {
	node.Object["status"] = map[string]any{"conditions": []any{
		map[string]any{"type": "MemoryPressure", "status": "False", "lastTransitionTime": "2026-11-01T00:00:00Z"},
		map[string]any{"type": "Ready", "status": status, "lastTransitionTime": since.UTC().Format(time.RFC3339)},
	}}
}

// fullPass judges every Node of a route with the full criteria, no screen.
func (h *history) fullPass(route string) []string {
	var nodes []*unstructured.Unstructured
	for _, n := range h.nodeNames() {
		r, _ := h.nodes[route].Get(n)
		nodes = append(nodes, r.Unstructured())
	}
	vs, err := h.finder.Scan(context.Background(), nodes, route, h.now())
	require.NoError(h.t, err)
	var out []string
	for _, v := range vs {
		if v.Orphan {
			out = append(out, v.Node)
		}
	}
	sort.Strings(out)
	return out
}

func (h *history) nodeNames() []string { return h.nodes[routes[0]].Names() }

func (h *history) dumpNodes() string {
	var b strings.Builder
	for _, n := range h.nodeNames() {
		r, _ := h.nodes[routes[0]].Get(n)
		fmt.Fprintf(&b, "%v\n", r.Object())
	}
	return b.String()
}
