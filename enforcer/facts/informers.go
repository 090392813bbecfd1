// This file keeps the inventory in step with the API server: one
// dynamic informer per kind, stripped by the inventory's transform and
// indexed by its indexes. Kinds are found, not hard-coded: Machines at the
// served version, every kind a Machine references (resolved as Cluster API
// does, through the CRD's contract label), and the kinds the parameters name
// that the API server serves. A kind that appears later gets its informer then.

package facts

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/record"
)

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// SyncerOptions configure a Syncer.
type SyncerOptions struct {
	Client dynamic.Interface
	// Mapper maps kinds to resources; when it can reset (a deferred
	// discovery mapper), a miss resets it once so new CRDs are seen.
	Mapper meta.RESTMapper
	// InfraKinds and PoolKinds are the parameters' kinds; those the API
	// server serves are watched from the start.
	InfraKinds, PoolKinds []schema.GroupKind
	// RetryInterval bounds how long a referenced kind that could not be
	// resolved waits before it is tried again (backoff from 1s; default
	// 10s).
	RetryInterval time.Duration
	// Contract watches CRDs and every kind Cluster API's contract says is an
	// InfraMachine or InfraMachinePool (contract.go), from when its CRD is
	// established.
	Contract bool
	// WatchFilter, when set, has every kind's informer hold only the objects
	// labelled kube.WatchFilterLabel with this value, as Cluster API's own
	// --watch-filter scopes its caches. An object that leaves the cache with
	// no deletionTimestamp was relabelled, not deleted (Change.Moved).
	WatchFilter string
}

// Syncer starts informers and reports readiness.
type Syncer struct {
	opts SyncerOptions
	inv  *Inventory

	mu         sync.Mutex
	informers  map[schema.GroupKind]tracked
	referenced map[schema.GroupKind]Role // kinds cached referrers reference, as the role they name
	failed     map[schema.GroupKind]error
	parameters map[schema.GroupKind]Role // the parameters' kinds, as their role
	// contract is the CRD informer that finds kinds by the contract (nil
	// when not asked for).
	contract cache.SharedIndexInformer
	ctx      context.Context
	subs     []func(Change)
	// leaving is told of an object leaving a watch-filtered cache without
	// being deleted, before the cache drops it (OnLeaving).
	leaving func(Role, *unstructured.Unstructured)
	// resolving starts the informers of referenced kinds, retrying those
	// that cannot be resolved yet.
	resolving *kube.Loop[schema.GroupKind]
}

// Change is one event of a cached object: Old is nil for an add, New for a
// delete (whose Old is the last state seen, for a delete the watch missed).
type Change struct {
	Role     Role
	Old, New *record.Record
	// Moved marks a delete of an object that left a watch-filtered cache
	// without being deleted (relabelled to another shard; it carries no
	// deletionTimestamp, which every Cluster API object's finalizer gives
	// a deletion): it still exists, only elsewhere.
	Moved bool
}

// Subscribe calls f with every change of every watched kind, of informers
// started before and after; the objects an informer already holds arrive
// first, as adds. f runs on the informers' goroutines and must not block.
func (s *Syncer) Subscribe(f func(Change)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subs = append(s.subs, f)
	for gk, t := range s.informers {
		if _, err := t.informer.AddEventHandler(s.handler(t.role, f)); err != nil {
			return fmt.Errorf("watch %s changes: %w", gk, err)
		}
	}
	return nil
}

// OnLeaving has f told, before the cache drops it, of every object that
// leaves a watch-filtered cache with no deletionTimestamp (relabelled to
// another shard). It runs on the watch's goroutine, ahead of the event it
// reads, and must not block. Call it before Start.
func (s *Syncer) OnLeaving(f func(Role, *unstructured.Unstructured)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.leaving = f
}

// leave tells OnLeaving's f of an event's object leaving the cache
// unprovoked by a deletion, and passes the event on unchanged.
func (s *Syncer) leave(role Role, e watch.Event) (watch.Event, bool) {
	if e.Type != watch.Deleted {
		return e, true
	}
	u, ok := e.Object.(*unstructured.Unstructured)
	s.mu.Lock()
	f := s.leaving
	s.mu.Unlock()
	if ok && f != nil && u.GetDeletionTimestamp() == nil {
		f(role, u)
	}
	return e, true
}

// handler sends one role's events to f.
func (s *Syncer) handler(role Role, f func(Change)) cache.ResourceEventHandler {
	deletion := s.inv.Model().DeletionTimestamp
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { f(Change{Role: role, New: asRecord(obj)}) },
		UpdateFunc: func(old, obj any) { f(Change{Role: role, Old: asRecord(old), New: asRecord(obj)}) },
		DeleteFunc: func(obj any) {
			c := Change{Role: role, Old: asRecord(obj)}
			if s.opts.WatchFilter != "" && c.Old != nil {
				_, deleting := c.Old.Get(deletion)
				c.Moved = !deleting
			}
			f(c)
		},
	}
}

// asRecord is the record an informer event carries, or nil.
func asRecord(obj any) *record.Record {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	r, _ := obj.(*record.Record)
	return r
}

type tracked struct {
	gvk      schema.GroupVersionKind
	resource schema.GroupVersionResource
	role     Role
	// sources say why the kind is watched (Source*), each once.
	sources  []string
	stop     context.CancelFunc
	informer cache.SharedIndexInformer
	health   *health
	lw       *watchedLW
	// references, for referrers (Machines, MachinePools), is the handler
	// that learns the kinds they reference: synced only once it has seen
	// every listed object.
	references cache.ResourceEventHandlerRegistration
}

// NewSyncer returns a Syncer that fills inv.
func NewSyncer(inv *Inventory, opts SyncerOptions) *Syncer {
	if opts.RetryInterval == 0 {
		opts.RetryInterval = 10 * time.Second
	}
	s := &Syncer{
		opts:       opts,
		inv:        inv,
		informers:  map[schema.GroupKind]tracked{},
		referenced: map[schema.GroupKind]Role{},
		failed:     map[schema.GroupKind]error{},
		parameters: map[schema.GroupKind]Role{},
	}
	s.resolving = kube.NewLoop(kube.LoopOptions{Name: "referenced-kinds", BaseBackoff: min(time.Second, opts.RetryInterval),
		MaxBackoff: opts.RetryInterval}, s.resolve)
	return s
}

// Start finds the kinds and starts their informers; it returns once they are
// started (not synced: see Ready). Informers stop when ctx is done.
func (s *Syncer) Start(ctx context.Context) error {
	s.mu.Lock()
	s.ctx = ctx
	s.mu.Unlock()
	model := s.inv.Model()
	machine, err := kube.RESTMapping(s.opts.Mapper, model.MachineKind)
	if err != nil {
		return fmt.Errorf("find the served version of Cluster API Machines: %w", err)
	}
	if err := s.track(machine.GroupVersionKind, Machine, SourceReferrer, &machine.Resource); err != nil {
		return err
	}
	// Other referrers (MachinePools) are optional: Cluster API serves them
	// only with its MachinePool feature.
	for _, role := range Roles() {
		if r, ok := model.Referrers[role]; ok && role != Machine {
			s.trackIfServed(r.GroupKind(), role, SourceReferrer)
		}
	}
	s.AddParameterKinds(s.opts.InfraKinds, s.opts.PoolKinds)
	if s.opts.Contract {
		if err := s.startContract(); err != nil {
			return err
		}
	}
	go s.resolving.Run(ctx)
	return nil
}

// AddParameterKinds watches the kinds the parameters list that it did not
// yet (a live Constraint edit): those served now at once, the others when
// their CRD is established. A kind no longer listed stays watched until a
// restart; its objects then keep blocking, never the other way round.
func (s *Syncer) AddParameterKinds(infra, pools []schema.GroupKind) {
	for _, gk := range slices.Concat(infra, pools) {
		role := InfraMachinePool
		if slices.Contains(infra, gk) {
			role = InfraMachine
		}
		s.mu.Lock()
		_, known := s.parameters[gk]
		if !known {
			s.parameters[gk] = role
		}
		s.mu.Unlock()
		if !known {
			s.trackIfServed(gk, role, SourceParameter)
		}
	}
}

// Why a kind is watched.
const (
	// SourceReferrer: a kind of the rule's referrers (Machine, MachinePool).
	SourceReferrer = "referrer"
	// SourceParameter: infraMachineKinds or infraMachinePoolKinds lists it.
	SourceParameter = "parameter"
	// SourceReferenced: a cached Machine or MachinePool references it.
	SourceReferenced = "referenced"
	// SourceContract: its CRD carries a Cluster API contract label and its
	// schema has spec.providerID or spec.providerIDList.
	SourceContract = "contract"
)

func (s *Syncer) trackIfServed(gk schema.GroupKind, role Role, source string) {
	m, err := kube.RESTMapping(s.opts.Mapper, gk)
	if err != nil {
		return // not served here: a Machine referencing it stays unverified
	}
	s.noteFailure(gk, s.track(m.GroupVersionKind, role, source, &m.Resource))
}

// noteFailure notes why a kind could not be watched; nil notes nothing.
func (s *Syncer) noteFailure(gk schema.GroupKind, err error) {
	if err != nil {
		s.mu.Lock()
		s.failed[gk] = err
		s.mu.Unlock()
	}
}

// track starts the informer of one kind, once; a kind already watched only
// notes the new source. resource, when set, is the kind's resource (a CRD
// says it), else the mapper finds it.
func (s *Syncer) track(gvk schema.GroupVersionKind, role Role, source string, resource *schema.GroupVersionResource) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.informers[gvk.GroupKind()]; ok {
		if !slices.Contains(t.sources, source) {
			t.sources = append(t.sources, source)
			s.informers[gvk.GroupKind()] = t
		}
		return nil
	}
	if resource == nil {
		mapping, err := kube.RESTMapping(s.opts.Mapper, gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("map %s to a resource: %w", gvk, err)
		}
		resource = &mapping.Resource
	}
	client := s.opts.Client.Resource(*resource)
	t := tracked{gvk: gvk, resource: *resource, role: role, sources: []string{source}, health: &health{}}
	scope := func(opts metav1.ListOptions) metav1.ListOptions {
		if s.opts.WatchFilter != "" {
			opts.LabelSelector = kube.WatchFilterLabel + "=" + s.opts.WatchFilter
		}
		return opts
	}
	lw := &watchedLW{inner: &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			w, err := client.Watch(ctx, scope(opts))
			if err != nil || s.opts.WatchFilter == "" {
				return w, err
			}
			// A relabelled object is seen leaving before the cache drops
			// it: no decision finds it gone while its Cluster still
			// counts as held (Shard).
			return watch.Filter(w, func(e watch.Event) (watch.Event, bool) { return s.leave(role, e) }), nil
		},
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return client.List(ctx, scope(opts))
		}}, h: t.health}
	// Lists stream when the client can: a streaming list is a watch, whose
	// failures lw sees as well, and it keeps the initial list's memory to an
	// object at a time (a paged LIST holds every object, whole, at once:
	// ~150 MiB more at 50,000 Machines). While the cache catches up it lists
	// instead (watchedLW.WatchWithContext).
	informer := cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(
		&cache.ListWatch{ListWithContextFunc: lw.ListWithContext, WatchFuncWithContext: lw.WatchWithContext}, s.opts.Client),
		&unstructured.Unstructured{}, cache.SharedIndexInformerOptions{Indexers: s.inv.Indexers(role)})
	t.informer, t.lw = informer, lw
	lw.verify = func() { s.verify(t) }
	if err := informer.SetTransform(s.inv.Transform(role)); err != nil {
		return fmt.Errorf("set transform on %s informer: %w", gvk, err)
	}
	for _, f := range s.subs {
		if _, err := informer.AddEventHandler(s.handler(role, f)); err != nil {
			return fmt.Errorf("watch %s changes: %w", gvk, err)
		}
	}
	if r, ok := s.inv.Model().Referrers[role]; ok {
		onReferrer := func(obj any) { s.onReferrer(obj, r.Names) }
		reg, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    onReferrer,
			UpdateFunc: func(_, obj any) { onReferrer(obj) },
		})
		if err != nil {
			return fmt.Errorf("watch %s references: %w", gvk, err)
		}
		t.references = reg
	}
	ctx, stop := context.WithCancel(s.ctx)
	t.stop = stop
	s.informers[gvk.GroupKind()] = t
	delete(s.failed, gvk.GroupKind())
	s.inv.AddKind(gvk, role, informer.GetIndexer())
	go informer.RunWithContext(ctx)
	return nil
}

// untrack stops the informer of a kind whose CRD is gone (its objects went
// with it) and drops its store.
func (s *Syncer) untrack(gk schema.GroupKind) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.informers[gk]
	if !ok {
		return
	}
	t.stop()
	delete(s.informers, gk)
	s.inv.RemoveKind(t.gvk)
	if _, referenced := s.referenced[gk]; referenced {
		s.resolving.Add(gk) // Machines still reference it: its CRD may come back
	}
}

// verify checks t's cache against a fresh LIST once its watch is back after
// a failure (health.go), until the cache holds what was listed, or ctx ends.
// A cache found behind (a resumed watch that missed events) is made to
// relist before the next check.
func (s *Syncer) verify(t tracked) {
	failures, ok := t.health.startVerify()
	if !ok {
		return
	}
	go func() {
		backoff := wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Steps: 6, Cap: 10 * time.Second}
		for {
			err := verifyCache(s.ctx, t.lw.inner.ListWithContext, t.informer.GetIndexer(), func(u *unstructured.Unstructured) *record.Record {
				return s.inv.Record(u, t.role)
			})
			if t.health.verified(err == nil, failures) || s.ctx.Err() != nil {
				return
			}
			t.lw.forceRelist()
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(backoff.Step()):
			}
			if failures, ok = t.health.startVerify(); !ok {
				return
			}
		}
	}()
}

// Recovering returns an error naming the kinds whose caches may miss
// objects since their watch broke (nil when none): their caches can show
// what exists, but not prove an absence.
func (s *Syncer) Recovering() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var broken []string
	for _, t := range s.informers {
		if err := t.health.err(); err != nil {
			broken = append(broken, fmt.Sprintf("%s %v", t.gvk.Kind, err))
		}
	}
	if len(broken) == 0 {
		return nil
	}
	sort.Strings(broken)
	return fmt.Errorf("the cache of %s is catching up after its watch of the API server broke", strings.Join(broken, "; "))
}

// onReferrer notes the kind a Machine or MachinePool references (as the role
// its reference names) and queues it if new.
func (s *Syncer) onReferrer(obj any, names Role) {
	r, ok := obj.(*record.Record)
	if !ok {
		return
	}
	ref, ok := s.inv.ReferenceOf(r)
	if !ok {
		return
	}
	gk := ref.GVK.GroupKind()
	s.mu.Lock()
	_, known := s.referenced[gk]
	if !known {
		s.referenced[gk] = names
	}
	_, tracked := s.informers[gk]
	s.mu.Unlock()
	if !known && !tracked {
		s.resolving.Add(gk)
	}
}

// resolve starts the informer of a kind cached Machines reference; one that
// cannot be resolved yet (a CRD installed later, a transient error) is
// tried again after the loop's backoff.
func (s *Syncer) resolve(ctx context.Context, gk schema.GroupKind) kube.Result {
	s.mu.Lock()
	role := s.referenced[gk]
	_, tracked := s.informers[gk]
	s.mu.Unlock()
	if tracked {
		return kube.Result{}
	}
	gvk, err := s.contractVersion(ctx, gk)
	if err == nil {
		err = s.track(gvk, role, SourceReferenced, nil)
	}
	s.noteFailure(gk, err)
	return kube.Result{Retry: err != nil}
}

// contractVersion resolves a referenced kind's version as Cluster API does:
// the CRD <plural>.<group> and its contract label; the served preferred
// version when the CRD carries no contract label.
func (s *Syncer) contractVersion(ctx context.Context, gk schema.GroupKind) (schema.GroupVersionKind, error) {
	mapping, err := kube.RESTMapping(s.opts.Mapper, gk)
	if err != nil {
		return schema.GroupVersionKind{}, fmt.Errorf("%s is not served: %w", gk, err)
	}
	crd, err := s.opts.Client.Resource(crdGVR).Get(ctx, mapping.Resource.Resource+"."+gk.Group, metav1.GetOptions{})
	if err != nil {
		return schema.GroupVersionKind{}, fmt.Errorf("read CRD of %s: %w", gk, err)
	}
	if v, ok := ContractVersion(crd.GetLabels()); ok {
		return gk.WithVersion(v), nil
	}
	return mapping.GroupVersionKind, nil
}

// Ready returns nil once every informer has synced and every kind that
// cached Machines reference has one (or cannot have one: then the rule
// denies those Machines' Nodes as unverified).
func (s *Syncer) Ready() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var waiting []string
	for gk, t := range s.informers {
		// The indexer holds the listed Machines before their handlers run:
		// until the references handler has seen them all, a kind they
		// reference may not be known to be waited for yet.
		if !t.informer.HasSynced() || (t.references != nil && !t.references.HasSynced()) {
			waiting = append(waiting, gk.String())
		}
	}
	for gk := range s.referenced {
		if _, ok := s.informers[gk]; !ok && s.failed[gk] == nil {
			waiting = append(waiting, gk.String()+" (resolving)")
		}
	}
	if s.contract != nil && !s.contract.HasSynced() {
		waiting = append(waiting, "CustomResourceDefinitions (kinds by contract)")
	}
	if len(s.informers) == 0 {
		return errors.New("not started")
	}
	if len(waiting) > 0 {
		sort.Strings(waiting)
		return fmt.Errorf("waiting for %s", strings.Join(waiting, ", "))
	}
	return nil
}

// SyncedKinds returns the InfraMachine and pool kinds whose informers have
// synced: what the rule may treat as proof of absence.
func (s *Syncer) SyncedKinds() (infra, pools []schema.GroupVersionKind) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.informers {
		if !t.informer.HasSynced() {
			continue
		}
		switch t.role {
		case InfraMachine:
			infra = append(infra, t.gvk)
		case InfraMachinePool:
			pools = append(pools, t.gvk)
		}
	}
	sortGVKs(infra)
	sortGVKs(pools)
	return infra, pools
}

// Failed returns the kinds that could not be watched, with why.
func (s *Syncer) Failed() map[schema.GroupKind]error {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[schema.GroupKind]error, len(s.failed))
	for k, v := range s.failed {
		out[k] = v
	}
	return out
}

func sortGVKs(g []schema.GroupVersionKind) {
	sort.Slice(g, func(i, j int) bool { return g[i].String() < g[j].String() })
}

// Relay passes changes on to a function connected later, keeping, in order,
// those that come before: it lets a Syncer's changes be subscribed to before
// its informers start (a handler added to a running informer first gets
// every object it holds at once, in a buffer client-go never shrinks) by a
// caller built after they started.
type Relay struct {
	mu      sync.Mutex
	pending []Change
	to      func(Change)
}

// Send passes c on, or keeps it until Connect.
func (r *Relay) Send(c Change) {
	r.mu.Lock()
	if to := r.to; to != nil {
		r.mu.Unlock()
		to(c)
		return
	}
	r.pending = append(r.pending, c)
	r.mu.Unlock()
}

// Connect passes the changes kept so far to f, in order, then every later
// one as it comes.
func (r *Relay) Connect(f func(Change)) {
	for {
		r.mu.Lock()
		batch := r.pending
		r.pending = nil
		if len(batch) == 0 {
			r.to = f
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		for _, c := range batch {
			f(c)
		}
	}
}
