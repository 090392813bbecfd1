// This file judges Nodes against the orphan criteria as what the
// criteria read changes, instead of listing and judging every Node each
// pass: a Node is judged again when it changes, when a Machine, InfraMachine
// or pool that could link to it (by a declared link) changes or goes, when
// its grace ends, and when the reaper's second observation is due. Nodes are
// first screened by the criteria that read only the Node, which keep every
// Ready Node without touching the inventory. A slow full pass over the caches
// (every Interval) stays as a safety net. Its cost grows with change, not
// with the fleet: with nothing changing it judges nothing until that pass.
// tests/differential checks that it finds exactly the orphans a full pass
// finds.

package nodes

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/clock"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/record"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// NodeCache is one cluster's Node cache (facts.NodeWatch, or facts.Nodes
// fed directly).
type NodeCache interface {
	HasSynced() bool
	Get(name string) (*record.Record, bool)
	Names() []string
	Len() int
	Linked(l rule.Link, values [][]string) []string
}

// ScanOptions configure a Scanner.
type ScanOptions struct {
	// Finder judges a Node from the caches; it must judge with Evidence.
	Finder   *guard.Finder
	Evidence *guard.Evidence
	// Reaper is told every verdict, and acts.
	Reaper *Reaper
	// Model is the link model the inventory follows.
	Model *rule.Model
	// Ready returns nil once the inventory is synced; nothing is judged
	// before (an empty cache proves nothing).
	Ready func() error
	// SyncedKinds, when set, are the synced InfraMachine and pool kinds:
	// when they change, the parameters the criteria read do, and every Node
	// is judged again.
	SyncedKinds func() (infra, pools []schema.GroupVersionKind)
	// Interval is the period of the full pass (the safety net).
	Interval time.Duration
	// Clock is injectable for tests (default: the real clock).
	Clock clock.WithTicker
	Log   *slog.Logger
	// Metrics, when set, counts judgments.
	Metrics *ScanMetrics
	// Releases, when set, is given every Node judged, for the clusters
	// enrolled there (mode admission-policy): the scan's triggers are the
	// changes that can release a Node or revoke its release.
	Releases *Publisher
	// Tombstones, when set, are kept from the inventory's changes
	// (Tombstones.Follow); the Finder judges with the same store. Its
	// Changed should be the Scanner's TombstoneChanged.
	Tombstones *facts.Tombstones
	// Ghosts, when set, is told whether each Node judged is a ghost.
	Ghosts *GhostTracker
}

// retryDelay is how long a Node whose judgment failed waits to be judged
// again (the inventory was not ready, or the policy failed on it).
const retryDelay = 10 * time.Second

// Scanner judges the Nodes of every cluster added to it; safe for
// concurrent use (events arrive on informer goroutines).
type Scanner struct {
	opts ScanOptions
	wake chan struct{}

	mu       sync.Mutex
	clusters map[string]*scanCluster
	due      *schedule
	nextFull time.Time
	full     bool // every Node of every cluster is to be judged
	kinds    string
	ready    bool
	leading  bool
	// logError's state.
	lastLog    time.Time
	suppressed int
	// routes are RunDue's converted parameters; only RunDue uses them.
	routes map[string]guard.Route
	// untaint are Nodes whose tombstone changed: judged no ghost, they lose
	// a taint nodeguard may have set before a restart.
	untaint map[nodeKey]bool
}

type scanCluster struct {
	name   string
	nodes  NodeCache
	target ReapTarget
	judged bool // a pass over its Nodes ran since it synced
}

// NewScanner returns a Scanner with no clusters.
func NewScanner(opts ScanOptions) (*Scanner, error) {
	if opts.Finder == nil || opts.Evidence == nil || opts.Reaper == nil || opts.Model == nil || opts.Ready == nil {
		return nil, fmt.Errorf("orphanscan: a Finder, its Evidence, a Reaper, the link model and the inventory's readiness are required")
	}
	if opts.Interval <= 0 {
		return nil, fmt.Errorf("orphanscan: the full pass needs a positive interval")
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	return &Scanner{opts: opts, wake: make(chan struct{}, 1), clusters: map[string]*scanCluster{}, due: newSchedule(), untaint: map[nodeKey]bool{}}, nil
}

// AddCluster starts judging the Nodes of a cluster ("" for the one
// nodeguard runs in, else "namespace/name"), replacing any cache it had:
// every Node of it is judged once the cache has synced.
func (s *Scanner) AddCluster(name string, nodes NodeCache, target ReapTarget) {
	target.Cluster = name
	s.opts.Reaper.AddCluster(name)
	if s.opts.Ghosts != nil {
		s.opts.Ghosts.AddCluster(name)
	}
	s.mu.Lock()
	s.clusters[name] = &scanCluster{name: name, nodes: nodes, target: target}
	s.mu.Unlock()
	s.signal()
}

// RemoveCluster stops judging a cluster and forgets its orphans.
func (s *Scanner) RemoveCluster(name string) {
	s.mu.Lock()
	delete(s.clusters, name)
	s.mu.Unlock()
	s.opts.Reaper.ForgetCluster(name)
	if s.opts.Ghosts != nil {
		s.opts.Ghosts.ForgetCluster(name)
	}
}

// NodeChanged asks for a Node to be judged now (facts.NodeWatchOptions.OnChange).
func (s *Scanner) NodeChanged(cluster, node string) {
	s.mu.Lock()
	s.due.add(nodeKey{cluster: cluster, node: node}, s.opts.Clock.Now())
	s.mu.Unlock()
	s.signal()
}

// VerdictChanged tells the Publisher what a Node carries when only
// nodeguard's verdicts on it changed (facts.NodeWatchOptions.OnVerdict).
func (s *Scanner) VerdictChanged(cluster, node string) {
	s.mu.Lock()
	c := s.clusters[cluster]
	s.mu.Unlock()
	if c == nil || s.opts.Releases == nil {
		return
	}
	if n, ok := c.nodes.Get(node); ok {
		s.opts.Releases.Carries(cluster, n.Unstructured())
	}
}

// ObjectChanged asks for every Node the old or new object could link to
// to be judged now, and for every Node when the providerID schemes the
// InfraMachines show change (facts.Syncer.Subscribe).
func (s *Scanner) ObjectChanged(c facts.Change) {
	if c.Role == facts.InfraMachine && s.opts.Evidence.Update(c.Old, c.New) {
		s.JudgeAll()
	}
	if s.opts.Tombstones != nil {
		s.opts.Tombstones.Follow(s.opts.Model, c, s.nodeWith)
	}
	// The Nodes the object links, directly or through the referrers that
	// name it (an InfraMachine through its Machine).
	linked := map[facts.Role][]*record.Record{}
	inv := s.opts.Finder.Inventory()
	for _, r := range []*record.Record{c.Old, c.New} {
		if r == nil {
			continue
		}
		linked[c.Role] = append(linked[c.Role], r)
		for role, refs := range inv.Referring(c.Role, r) {
			linked[role] = append(linked[role], refs...)
		}
	}
	now := s.opts.Clock.Now()
	s.mu.Lock()
	for role, records := range linked {
		for _, l := range s.opts.Model.LinksOf(role) {
			for _, r := range records {
				values := facts.LinkValues(r, l)
				if len(values) == 0 {
					continue
				}
				for _, cl := range s.clusters {
					for _, node := range cl.nodes.Linked(l, values) {
						s.due.add(nodeKey{cluster: cl.name, node: node}, now)
					}
				}
			}
		}
	}
	s.mu.Unlock()
	s.signal()
}

// TombstoneChanged asks for the Nodes with a providerID to be judged now:
// its tombstone was set, moved or ended (facts.TombstoneOptions.Changed).
func (s *Scanner) TombstoneChanged(providerID string) {
	l, ok := s.providerIDLink()
	if !ok {
		return
	}
	now := s.opts.Clock.Now()
	s.mu.Lock()
	for _, cl := range s.clusters {
		for _, node := range cl.nodes.Linked(l, [][]string{{providerID}}) {
			k := nodeKey{cluster: cl.name, node: node}
			s.due.add(k, now)
			s.untaint[k] = true
		}
	}
	s.mu.Unlock()
	s.signal()
}

// providerIDLink is a link on the Node's providerID alone: its Node index
// finds the Nodes with a providerID.
func (s *Scanner) providerIDLink() (rule.Link, bool) {
	for _, role := range facts.Roles() {
		if ls := s.opts.Model.ProviderIDLinks(role); len(ls) > 0 {
			return ls[0], true
		}
	}
	return rule.Link{}, false
}

// nodeWith names a Node that has providerID now, in any cluster: evidence
// for a tombstone.
func (s *Scanner) nodeWith(providerID string) string {
	l, ok := s.providerIDLink()
	if !ok {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, name := range slices.Sorted(maps.Keys(s.clusters)) {
		cl := s.clusters[name]
		for _, node := range cl.nodes.Linked(l, [][]string{{providerID}}) {
			n, ok := cl.nodes.Get(node)
			if !ok {
				continue
			}
			pid, _, _ := unstructured.NestedString(n.Object(), s.opts.Model.NodeProviderID...)
			if pid == providerID {
				return node
			}
		}
	}
	return ""
}

// Finder is what the scan judges with: its policy, caches and tombstones.
func (s *Scanner) Finder() *guard.Finder { return s.opts.Finder }

// Releases is the publisher the scan judges Nodes for (nil: none).
func (s *Scanner) Releases() *Publisher { return s.opts.Releases }

// JudgeCluster asks for every Node of one cluster to be judged again (a
// cluster just enrolled for its releases).
func (s *Scanner) JudgeCluster(name string) {
	s.mu.Lock()
	if c := s.clusters[name]; c != nil {
		c.judged = false
	}
	s.mu.Unlock()
	s.signal()
}

// JudgeAll asks for every Node to be judged again (a policy reloaded, the
// evidence changed).
func (s *Scanner) JudgeAll() {
	s.mu.Lock()
	s.full = true
	s.mu.Unlock()
	s.signal()
}

func (s *Scanner) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// ScanResult says what one RunDue did.
type ScanResult struct {
	Judged  int      // Nodes judged
	Full    bool     // a full pass ran
	Deleted []string // Nodes deleted
	Would   []string // Nodes a dry run would have deleted
	Errors  int      // judgments or deletes that failed
}

// RunDue judges every Node due at now, and every Node of every cluster when
// a full pass is due (or of a cluster whose cache just synced). Run calls
// it; it must not run twice at once.
func (s *Scanner) RunDue(ctx context.Context, now time.Time) ScanResult {
	var res ScanResult
	if err := s.opts.Ready(); err != nil {
		return res
	}
	type work struct {
		c    *scanCluster
		all  bool
		keys []string
	}
	s.mu.Lock()
	full := s.full || !s.ready || !now.Before(s.nextFull)
	s.ready = true
	if s.opts.SyncedKinds != nil {
		infra, pools := s.opts.SyncedKinds()
		if kinds := fmt.Sprint(infra, pools); kinds != s.kinds {
			s.kinds, full = kinds, true
		}
	}
	if full {
		s.full = false
		s.nextFull = now.Add(s.opts.Interval)
	}
	// Leadership just came: the orphans seen meanwhile are due now.
	leading := s.opts.Reaper.Leading()
	gained := leading && !s.leading
	s.leading = leading
	plan := map[string]*work{}
	for name, c := range s.clusters {
		if !c.nodes.HasSynced() {
			continue
		}
		w := &work{c: c, all: full || !c.judged}
		c.judged = true
		if gained && !w.all {
			w.keys = append(w.keys, s.opts.Reaper.Orphans(name)...)
		}
		plan[name] = w
	}
	for _, k := range s.due.due(now) {
		if w := plan[k.cluster]; w != nil && !w.all {
			w.keys = append(w.keys, k.node)
		}
	}
	s.mu.Unlock()
	res.Full = full
	s.routes = map[string]guard.Route{}
	var todo []judgment
	for _, name := range slices.Sorted(maps.Keys(plan)) {
		w := plan[name]
		nodes := w.keys
		if w.all {
			nodes = w.c.nodes.Names()
		}
		for _, n := range nodes {
			todo = append(todo, judgment{w.c, n})
		}
	}
	// The releases first: a Node's delete (CAPI's, at a scale-down) waits
	// for its verdict, not for the orphan and ghost judgments of the Nodes
	// before it; nor for those of this pass, when more Nodes come due
	// during it (a MachineSet's InfraMachines going one after another).
	s.releaseAll(ctx, todo, &res)
	woken, most := false, len(todo)+takeInMax
	for i := 0; i < len(todo) && ctx.Err() == nil; i++ {
		// At most takeInMax taken in: under steady churn the pass still
		// ends (the full pass's bookkeeping below waits for it).
		if len(todo) < most {
			if more := s.comeDue(); more != nil {
				woken = true
				s.releaseAll(ctx, more, &res)
				todo = append(todo, more...)
			}
		}
		s.judge(ctx, todo[i].c, todo[i].node, now, &res)
	}
	if ctx.Err() != nil {
		return res
	}
	for _, name := range slices.Sorted(maps.Keys(plan)) {
		if plan[name].all {
			s.opts.Reaper.Report(name)
			if s.opts.Releases != nil {
				s.opts.Releases.Synced(name)
			}
		}
	}
	if woken {
		s.signal() // what else the wake was for (a full pass, a new cluster): the next RunDue
	}
	return res
}

// takeInMax bounds the Nodes a pass takes in as they come due: a
// scale-down of a few hundred Machines at once is released in one pass.
const takeInMax = 256

// judgment is one Node to judge.
type judgment struct {
	c    *scanCluster
	node string
}

// releaseAll judges the releases of the Nodes of enrolled clusters.
func (s *Scanner) releaseAll(ctx context.Context, todo []judgment, res *ScanResult) {
	if s.opts.Releases == nil {
		return
	}
	for _, j := range todo {
		if ctx.Err() != nil {
			return
		}
		if s.opts.Releases.Enrolled(j.c.name) {
			s.release(ctx, j.c, j.node, res)
		}
	}
}

// comeDue takes the Nodes of judged clusters that came due since a wake
// (nil: no wake).
func (s *Scanner) comeDue() []judgment {
	select {
	case <-s.wake:
	default:
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []judgment{}
	for _, k := range s.due.due(s.opts.Clock.Now()) {
		if c := s.clusters[k.cluster]; c != nil && c.judged {
			out = append(out, judgment{c, k.node})
		}
	}
	return out
}

// judge judges one Node and tells the reaper.
func (s *Scanner) judge(ctx context.Context, c *scanCluster, name string, now time.Time, res *ScanResult) {
	node, ok := c.nodes.Get(name)
	if !ok {
		s.opts.Reaper.Forget(c.name, name)
		if s.opts.Releases != nil {
			s.opts.Releases.Forget(c.name, name)
		}
		if s.opts.Ghosts != nil {
			s.opts.Ghosts.Forget(c.name, name)
		}
		return
	}
	res.Judged++
	route, err := s.route(c.name)
	if err != nil {
		s.failed(c, name, now, err, res)
		return
	}
	u := node.Unstructured()
	if s.opts.Ghosts != nil {
		s.ghost(ctx, c, route, u, now, res)
	}
	screen, err := s.opts.Finder.Screen(ctx, route, u, now)
	s.opts.Metrics.judged(stageScreen)
	if err != nil {
		s.failed(c, name, now, err, res)
		return
	}
	v := guard.OrphanVerdict{Node: name, UID: node.UID(), ResourceVersion: node.ResourceVersion()}
	if !screen.Passes {
		if !screen.RecheckAt.IsZero() {
			s.after(c.name, name, now, screen.RecheckAt)
		}
	} else {
		vs, err := s.opts.Finder.Scan(ctx, []*unstructured.Unstructured{u}, c.name, now)
		s.opts.Metrics.judged(stageFull)
		if err != nil {
			s.failed(c, name, now, err, res)
			return
		}
		v = vs[0]
	}
	outcome, next, err := s.opts.Reaper.Observe(ctx, c.target, v, now)
	if err != nil && ctx.Err() == nil {
		s.logError("orphan reaper: acting on a Node failed; trying again later", c.name, name, err)
		res.Errors++
	}
	switch outcome {
	case Deleted:
		res.Deleted = append(res.Deleted, name)
	case WouldDelete:
		res.Would = append(res.Would, name)
	}
	if !next.IsZero() {
		s.after(c.name, name, now, next)
	}
}

// release has the Publisher judge one Node's release (RunDue does it for
// every Node due before the other judgments).
func (s *Scanner) release(ctx context.Context, c *scanCluster, name string, res *ScanResult) {
	node, ok := c.nodes.Get(name)
	if !ok {
		return // judge forgets it
	}
	if err := s.opts.Releases.Judge(ctx, c.name, node.Unstructured()); err != nil && ctx.Err() == nil {
		s.logError("releases: judging a Node failed; it is not released", c.name, name, err)
		res.Errors++
	}
}

// ghost tells the tracker whether a Node is a ghost, from the caches: the
// tracker reports and taints, never deletes, so a fresh read buys nothing.
func (s *Scanner) ghost(ctx context.Context, c *scanCluster, route guard.Route, u *unstructured.Unstructured, now time.Time, res *ScanResult) {
	k := nodeKey{cluster: c.name, node: u.GetName()}
	s.mu.Lock()
	untaint := s.untaint[k]
	delete(s.untaint, k)
	s.mu.Unlock()
	g, err := s.opts.Finder.Ghost(ctx, route, u, now, false)
	if err == nil {
		t := GhostTarget{Cluster: c.name, Nodes: c.target.Nodes, Recorder: c.target.Recorder}
		var next time.Time
		if next, err = s.opts.Ghosts.Observe(ctx, t, g, now, untaint); err == nil && !next.IsZero() {
			s.after(c.name, u.GetName(), now, next)
		}
		// Judged no ghost, acting failed: removing a taint it may carry is
		// what failed, and the tracker has forgotten it; ask again.
		untaint = untaint || (err != nil && !g.Ghost)
	}
	if err != nil && ctx.Err() == nil {
		s.logError("ghosts: judging or acting on a Node failed; trying again later", c.name, u.GetName(), err)
		res.Errors++
		s.mu.Lock()
		if untaint {
			s.untaint[k] = true
		}
		s.mu.Unlock()
		s.after(c.name, u.GetName(), now, now.Add(retryDelay))
	}
}

// route is a cluster route's parameters, converted once per RunDue (they
// change only with the synced kinds, which RunDue watches).
func (s *Scanner) route(cluster string) (guard.Route, error) {
	if r, ok := s.routes[cluster]; ok {
		return r, nil
	}
	r, err := s.opts.Finder.Route(cluster)
	if err == nil {
		s.routes[cluster] = r
	}
	return r, err
}

// after asks for a Node to be judged at t, and never again at or before now
// (a policy's time that did not move on would judge it forever).
func (s *Scanner) after(cluster, node string, now, t time.Time) {
	if !t.After(now) {
		t = now.Add(time.Second)
	}
	s.mu.Lock()
	s.due.add(nodeKey{cluster: cluster, node: node}, t)
	s.mu.Unlock()
}

func (s *Scanner) failed(c *scanCluster, name string, now time.Time, err error, res *ScanResult) {
	res.Errors++
	s.opts.Metrics.failed()
	s.logError("orphan scan: judging a Node failed; trying again later", c.name, name, err)
	s.after(c.name, name, now, now.Add(retryDelay))
}

// logEvery bounds the error lines: a policy failing on every Node of a
// fleet must not write a line per Node.
const logEvery = 10 * time.Second

// logError logs at most one line per logEvery, counting the others.
func (s *Scanner) logError(msg, cluster, node string, err error) {
	now := s.opts.Clock.Now()
	s.mu.Lock()
	if now.Sub(s.lastLog) < logEvery {
		s.suppressed++
		s.mu.Unlock()
		return
	}
	suppressed := s.suppressed
	s.lastLog, s.suppressed = now, 0
	s.mu.Unlock()
	s.opts.Log.Error(msg, "cluster", cluster, "node", node, "error", err.Error(), "suppressedSinceLast", suppressed)
}

// Run judges due Nodes until ctx is done, waking when one is due, when
// something changed, and for each full pass.
func (s *Scanner) Run(ctx context.Context) {
	timer := s.opts.Clock.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C():
		case <-s.wake:
		}
		now := s.opts.Clock.Now()
		s.RunDue(ctx, now)
		timer.Stop()
		timer.Reset(s.wait(s.opts.Clock.Now()))
	}
}

// wait is how long Run may sleep: until the next due Node or full pass, and
// at most a second while the inventory is not ready or a cluster's Nodes
// were never judged. A Node cache says it has synced only after its handler
// saw the last first-listed Node: the wake that Node sent may find the cache
// not yet synced, and no other wake comes.
func (s *Scanner) wait(now time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ready {
		return time.Second
	}
	for _, c := range s.clusters {
		if !c.judged {
			return time.Second
		}
	}
	next := s.nextFull
	if t, ok := s.due.next(); ok && t.Before(next) {
		next = t
	}
	return max(next.Sub(now), 0)
}

var (
	watchedDesc = prometheus.NewDesc("nodeguard_orphan_watched_nodes",
		"Nodes in the orphan scan's cache, by cluster (\"\" for the cluster nodeguard runs in).", []string{"cluster"}, nil)
	syncedDesc = prometheus.NewDesc("nodeguard_orphan_watch_synced",
		"1 when the orphan scan's Node cache of a cluster has synced, else 0 (its Nodes are not judged yet).", []string{"cluster"}, nil)
)

// Describe and Collect export, per cluster added, the Nodes cached and
// whether the cache has synced; a cluster removed leaves no series behind.
func (s *Scanner) Describe(ch chan<- *prometheus.Desc) {
	ch <- watchedDesc
	ch <- syncedDesc
}

// Collect: see Describe.
func (s *Scanner) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	clusters := slices.Collect(maps.Values(s.clusters))
	s.mu.Unlock()
	for _, c := range clusters {
		synced := 0.0
		if c.nodes.HasSynced() {
			synced = 1
		}
		ch <- prometheus.MustNewConstMetric(watchedDesc, prometheus.GaugeValue, float64(c.nodes.Len()), c.name)
		ch <- prometheus.MustNewConstMetric(syncedDesc, prometheus.GaugeValue, synced, c.name)
	}
}
