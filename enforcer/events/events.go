// Package events records nodeguard's Kubernetes Events, every one through
// one bounded Recorder and the events.k8s.io API:
//   - each denied Node delete, on that Node (type Warning, reason
//     NodeDeleteDenied, the rule's message and the user who asked), so
//     `kubectl describe node` says why the Node is still there;
//   - what nodeguard does and finds on its own (OrphanNodeDeleted, GhostNode,
//     WorkloadClusterGuarded and -Unguarded), through In, which gives the
//     reaper, the ghost tracker and the fleet client-go's EventRecorder
//     interface.
//
// Recording never touches a decision: Record and Eventf are non-blocking
// sends into a bounded queue, and the Events are written by goroutines of
// their own. A burst or a flood cannot become an Event storm (Limits):
//   - identical occurrences (same object, reason and note: for a denial the
//     same user, reason and message) within Limits.Window are one Event whose
//     series count goes up; the count is written at most once per
//     Limits.PatchInterval;
//   - at most Limits.PerObject Events per object, and Limits.Series overall,
//     are live at once, denials and nodeguard's own Events each within
//     bounds of their own;
//   - every write (create or patch) takes a token from one bucket of
//     Limits.WritesPerSecond, burst Limits.WriteBurst; what must wait stays
//     pending, in memory, bounded by Limits.Series.
//
// What does not fit is dropped and counted in nodeguard_events_dropped_total;
// every denial is also in nodeguard_decisions_total and the decision log,
// every deleted orphan and ghost in their own metrics and log lines.
//
// client-go's events.EventBroadcaster aggregates too, but bounds neither (a
// goroutine per event, a blocking queue) and writes a series' count at its
// second event and then every 30 minutes, so a burst of 30 denials would
// read "x2" for half an hour; and it keys a series without the note, so a
// second user's denial would count under the first user's words.
//
// It must not decide what to record: callers tell it what happened.
package events

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	eventsv1client "k8s.io/client-go/kubernetes/typed/events/v1"
	clientevents "k8s.io/client-go/tools/events"
	"k8s.io/client-go/tools/record/util"
	"k8s.io/client-go/tools/reference"
	"k8s.io/utils/clock"

	"github.com/nodeguard/nodeguard/enforcer/record"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// What a denial's Event says.
const (
	Reason = "NodeDeleteDenied"
	// ReasonWouldBeDenied is a denial the enforcement action warn admitted.
	ReasonWouldBeDenied = "NodeDeleteWouldBeDenied"
	Action              = "Delete"
	Controller          = "nodeguard"
	// NoteMax is the API server's limit on an Event's note, in bytes.
	NoteMax = 1024
)

// Denial is one denied Node delete, as the webhook saw it.
type Denial struct {
	// Cluster is "" for the cluster nodeguard runs in, else the workload
	// Cluster ("namespace/name") whose route judged the Node.
	Cluster  string
	Node     string
	NodeUID  types.UID
	User     string
	Reason   string // the decision's reason (blocked, fresh-read-failed, ...)
	Messages []string
	Blockers []rule.Blocker
	// Unverified are linked Machines' InfraMachines of kinds not synced.
	Unverified []rule.Unverified
	// Admitted: the enforcement action warn let the delete through; the
	// Event says it would have been denied (ReasonWouldBeDenied).
	Admitted bool
	// DecisionID is the decision log's decision_id ("" without decision
	// logs): the Event carries its series' first as the annotation
	// DecisionIDAnnotation.
	DecisionID string
}

// DecisionIDAnnotation is the annotation of a denial Event holding the
// decision log's decision_id of the first denial it counts.
const DecisionIDAnnotation = "nodeguard.io/decision-id"

// WorkloadEvents returns the events client of a workload cluster
// ("namespace/name"); an error sends that cluster's Events to the management
// cluster instead.
type WorkloadEvents func(ctx context.Context, cluster string) (eventsv1client.EventsV1Interface, error)

// Resolve returns a reference to an object of the cluster nodeguard runs in
// (a Machine or Cluster), with its API version and, when it can be read, its
// UID: `kubectl describe` finds an object's Events by UID.
type Resolve func(ctx context.Context, gk schema.GroupKind, namespace, name string) corev1.ObjectReference

// Limits bound what a flood of occurrences can cost. The zero value of a
// field means its default (DefaultLimits).
type Limits struct {
	Queue           int           // occurrences waiting to be aggregated
	PerObject       int           // live Events per object (Node, Machine, Cluster)
	Series          int           // live Events overall
	WritesPerSecond float64       // API writes (creates and patches) per second
	WriteBurst      int           // and their burst
	PatchInterval   time.Duration // least time between two writes of one Event
	Window          time.Duration // an Event untouched this long ends; the next occurrence starts another
}

// DefaultLimits are the bounds nodeguard serve runs with.
func DefaultLimits() Limits {
	return Limits{Queue: 256, PerObject: 5, Series: 1000, WritesPerSecond: 5, WriteBurst: 25,
		PatchInterval: 10 * time.Second, Window: 10 * time.Minute}
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	return Limits{Queue: orDefault(l.Queue, d.Queue), PerObject: orDefault(l.PerObject, d.PerObject),
		Series: orDefault(l.Series, d.Series), WritesPerSecond: orDefault(l.WritesPerSecond, d.WritesPerSecond),
		WriteBurst: orDefault(l.WriteBurst, d.WriteBurst), PatchInterval: orDefault(l.PatchInterval, d.PatchInterval),
		Window: orDefault(l.Window, d.Window)}
}

func orDefault[T int | float64 | time.Duration](v, d T) T {
	if v <= 0 {
		return d
	}
	return v
}

// Options configure a Recorder.
type Options struct {
	// Events writes Events in the cluster nodeguard runs in: the Nodes of
	// the self-hosted route, the Clusters, and the fallback of workload
	// routes.
	Events eventsv1client.EventsV1Interface
	// Workload, when set, records a workload route's denials on the Node in
	// that workload cluster. Unset (or failing), they are recorded in the
	// cluster nodeguard runs in, on the Machine the denial names, else on
	// the Cluster: an Event belongs in the cluster of the object it regards.
	Workload WorkloadEvents
	// Resolve finds that Machine or Cluster; nil: a reference without UID.
	Resolve Resolve
	Limits  Limits
	Metrics *Metrics
	Log     *slog.Logger
	Clock   clock.WithTicker
	// Instance is the Events' reportingInstance (e.g. the Pod's name).
	Instance string
}

// Recorder aggregates denials and nodeguard's own Events and writes them.
// Record and In's Eventf may be called from any goroutine; Run writes.
type Recorder struct {
	opts   Options
	limits Limits
	queue  chan occurrence
	wake   chan struct{}
	writes *rate.Limiter
	// failLog writes at most one line per interval about failed writes.
	failLog rate.Sometimes
	// lastName is the time the last Event's name was made of (writer only).
	lastName int64

	mu        sync.Mutex
	series    map[seriesKey]*series
	perObject map[objectKey]int
	live      [2]int // live series, of denials ([0]) and of nodeguard's own Events ([1])
}

// occurrence is one thing to record: an event made through In, or (event
// nil) a denial, made into its event off the webhook's goroutine and queued
// by value, so recording it allocates nothing.
type occurrence struct {
	event  *event
	denial Denial
}

// event is what one Event says, and where it belongs.
type event struct {
	// cluster is "" for the cluster nodeguard runs in, else the workload
	// Cluster ("namespace/name") of the object it regards.
	cluster string
	// client writes it; nil: Options.Events for cluster "", else resolved
	// through Options.Workload with the management cluster as fallback.
	client              eventsv1client.EventsV1Interface
	regarding           corev1.ObjectReference
	related             *corev1.ObjectReference
	typ, reason, action string
	note                string
	denial              *Denial // a denial's: the Machine it names is its fallback
}

// objectKey is an object's, within the denials' budget or nodeguard's own
// Events' (own): a flood of denials, which anyone who can send reviews can
// make, never crowds out a GhostNode or OrphanNodeDeleted Event.
type objectKey struct {
	own                            bool
	cluster, kind, namespace, name string
}

type seriesKey struct {
	objectKey
	reason, note string
}

// series is one Event: the occurrences it counts and what the API has of it.
type series struct {
	key   seriesKey
	event *event // the first; all share the key
	first time.Time

	// Changed by the aggregating goroutine, under mu.
	count int32
	last  time.Time

	// Changed by the writing goroutine, under mu.
	target    *target // where it is written, once resolved
	created   bool
	written   int32 // the count the API has
	lastWrite time.Time
}

// target is where one Event is written and what it regards.
type target struct {
	client    eventsv1client.EventsV1Interface
	namespace string
	name      string
	regarding corev1.ObjectReference
	related   *corev1.ObjectReference
	note      string
}

// New returns a Recorder; Run starts it.
func New(opts Options) (*Recorder, error) {
	if opts.Events == nil {
		return nil, fmt.Errorf("events: an events client is required")
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Instance == "" {
		opts.Instance = Controller
	}
	l := opts.Limits.withDefaults()
	return &Recorder{opts: opts, limits: l, queue: make(chan occurrence, l.Queue), wake: make(chan struct{}, 1),
		writes:  rate.NewLimiter(rate.Limit(l.WritesPerSecond), l.WriteBurst),
		failLog: rate.Sometimes{First: 1, Interval: 10 * time.Second},
		series:  map[seriesKey]*series{}, perObject: map[objectKey]int{}}, nil
}

// Limits returns the bounds r runs with, defaults filled in.
func (r *Recorder) Limits() Limits { return r.limits }

// Record queues one denial; it never blocks. A full queue drops it, counted.
func (r *Recorder) Record(d Denial) { r.enqueue(occurrence{denial: d}) }

func (r *Recorder) enqueue(o occurrence) {
	select {
	case r.queue <- o:
	default:
		r.opts.Metrics.drop(DropQueueFull, o.event != nil)
	}
}

// In returns client-go's EventRecorder for the objects of one cluster,
// recording through r: cluster "" is the cluster nodeguard runs in (client
// nil: Options.Events), else a workload Cluster ("namespace/name") with that
// cluster's events client. A nil Recorder records nothing: In returns nil.
func (r *Recorder) In(cluster string, client eventsv1client.EventsV1Interface) clientevents.EventRecorder {
	if r == nil {
		return nil
	}
	return &clusterRecorder{r: r, cluster: cluster, client: client}
}

type clusterRecorder struct {
	r       *Recorder
	cluster string
	client  eventsv1client.EventsV1Interface
}

// Eventf queues one Event; it never blocks. An object it cannot reference
// (a typed object of a kind client-go does not know) is logged, not
// recorded.
func (c *clusterRecorder) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	ref, err := reference.GetReference(scheme.Scheme, regarding)
	if err != nil {
		c.r.opts.Log.Warn("event not recorded: no reference to the object it regards", "reason", reason, "error", err.Error())
		return
	}
	ev := &event{cluster: c.cluster, client: c.client, regarding: *ref, typ: eventtype, reason: reason, action: action,
		note: truncate(fmt.Sprintf(note, args...))}
	if related != nil {
		if rel, err := reference.GetReference(scheme.Scheme, related); err == nil {
			ev.related = rel
		}
	}
	c.r.enqueue(occurrence{event: ev})
}

// Run aggregates queued occurrences and writes Events until ctx is done.
func (r *Recorder) Run(ctx context.Context) {
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case o := <-r.queue:
				r.observe(o)
			}
		}
	}()
	ticker := r.opts.Clock.NewTicker(time.Second)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
		case <-r.wake:
		}
		r.flush(ctx)
	}
}

// denialEvent is the Event a denial makes: on the Node, naming its first
// blocker as related.
func denialEvent(d *Denial) *event {
	reason := Reason
	if d.Admitted {
		reason = ReasonWouldBeDenied
	}
	return &event{cluster: d.Cluster, regarding: corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: d.Node, UID: d.NodeUID},
		related: related(d), typ: corev1.EventTypeWarning, reason: reason, action: Action, note: Note(*d), denial: d}
}

// observe counts one occurrence into its series, or starts one if the
// bounds allow.
func (r *Recorder) observe(o occurrence) {
	now := r.opts.Clock.Now()
	ev := o.event
	if ev == nil {
		ev = denialEvent(&o.denial)
	}
	k := seriesKey{objectKey{ev.denial == nil, ev.cluster, ev.regarding.Kind, ev.regarding.Namespace, ev.regarding.Name}, ev.reason, ev.note}
	r.mu.Lock()
	defer r.mu.Unlock()
	if s, ok := r.series[k]; ok {
		s.count++
		s.last = now
		return
	}
	switch {
	case r.perObject[k.objectKey] >= r.limits.PerObject:
		r.opts.Metrics.drop(DropPerObject, k.own)
		return
	case r.live[budget(k.own)] >= r.limits.Series:
		r.opts.Metrics.drop(DropSeries, k.own)
		return
	}
	r.series[k] = &series{key: k, event: ev, first: now, count: 1, last: now}
	r.perObject[k.objectKey]++
	r.live[budget(k.own)]++
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// write is one write due: the series and the count and time to write.
type write struct {
	s     *series
	count int32
	last  time.Time
}

// flush writes what is due, oldest first, while the write bucket has
// tokens, and ends the series past their window.
func (r *Recorder) flush(ctx context.Context) {
	now := r.opts.Clock.Now()
	var due []write
	r.mu.Lock()
	for k, s := range r.series {
		idle := now.Sub(s.last)
		done := s.created && s.written == s.count
		if (done && idle >= r.limits.Window) || idle >= 2*r.limits.Window {
			// Past twice the window its writes kept failing: give up. Never
			// created, its occurrences are dropped; created, only its last count.
			if !s.created {
				r.opts.Metrics.dropN(DropWriteFailed, s.count, k.own)
			}
			delete(r.series, k)
			r.live[budget(k.own)]--
			if r.perObject[k.objectKey]--; r.perObject[k.objectKey] <= 0 {
				delete(r.perObject, k.objectKey)
			}
			continue
		}
		// One write per patch interval, a failed create's retry included.
		waited := s.lastWrite.IsZero() || now.Sub(s.lastWrite) >= r.limits.PatchInterval
		if waited && (!s.created || s.count > s.written) {
			due = append(due, write{s: s, count: s.count, last: s.last})
		}
	}
	r.mu.Unlock()
	sort.Slice(due, func(i, j int) bool { return due[i].s.first.Before(due[j].s.first) })
	// A cluster whose write just failed (unreachable: each try waits for
	// its timeout) is not tried again in this flush, so it cannot hold up
	// the Events of the others.
	failed := map[string]bool{}
	for _, w := range due {
		if failed[w.s.key.cluster] {
			continue
		}
		if ctx.Err() != nil || !r.writes.AllowN(now, 1) {
			return
		}
		if err := r.write(ctx, w, now); err != nil {
			failed[w.s.key.cluster] = true
		}
	}
}

// budget is the index of a series' budget in Recorder.live.
func budget(own bool) int {
	if own {
		return 1
	}
	return 0
}

// write creates the series' Event, or patches its count.
func (r *Recorder) write(ctx context.Context, w write, now time.Time) error {
	s := w.s
	if s.target == nil {
		t := r.resolve(ctx, s)
		r.mu.Lock()
		s.target = t
		r.mu.Unlock()
	}
	t := s.target
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	op, err := OpPatch, error(nil)
	r.mu.Lock()
	created := s.created
	r.mu.Unlock()
	if created {
		err = r.patch(wctx, t, w)
		if apierrors.IsNotFound(err) {
			// The API server's event TTL (1h by default) removed it: start over.
			created, err = false, nil
		}
	}
	if !created && err == nil {
		op = OpCreate
		err = r.create(wctx, t, s, w)
	}
	r.opts.Metrics.wrote(op, err, s.key.own)
	r.mu.Lock()
	defer r.mu.Unlock()
	s.lastWrite = now
	if err != nil {
		r.failLog.Do(func() {
			r.opts.Log.Warn("event not written; retrying", "operation", op, "reason", s.key.reason, "kind", s.key.kind, "name", s.key.name, "cluster", s.key.cluster,
				"event", t.namespace+"/"+t.name, "error", err.Error())
		})
		return err
	}
	s.created, s.written = true, w.count
	return nil
}

func (r *Recorder) create(ctx context.Context, t *target, s *series, w write) error {
	// client-go names an Event <object>.<nanoseconds in hex>; distinct
	// times keep two Events of one Node, created in one flush, apart.
	r.lastName = max(r.opts.Clock.Now().UnixNano(), r.lastName+1)
	t.name = util.GenerateEventName(t.regarding.Name, r.lastName)
	ev := &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: t.name, Namespace: t.namespace},
		EventTime:           metav1.NewMicroTime(s.first),
		ReportingController: Controller,
		ReportingInstance:   r.opts.Instance,
		Action:              s.event.action,
		Reason:              s.event.reason,
		Regarding:           t.regarding,
		Related:             t.related,
		Note:                t.note,
		Type:                s.event.typ,
	}
	if d := s.event.denial; d != nil && d.DecisionID != "" {
		ev.Annotations = map[string]string{DecisionIDAnnotation: d.DecisionID}
	}
	if w.count > 1 {
		ev.Series = &eventsv1.EventSeries{Count: w.count, LastObservedTime: metav1.NewMicroTime(w.last)}
	}
	if _, err := t.client.Events(t.namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create Event %s/%s: %w", t.namespace, t.name, err)
	}
	return nil
}

func (r *Recorder) patch(ctx context.Context, t *target, w write) error {
	// A merge patch of the series alone: everything else of an
	// events.k8s.io Event is immutable.
	patch := fmt.Sprintf(`{"series":{"count":%d,"lastObservedTime":%q}}`, w.count, w.last.UTC().Format(metav1.RFC3339Micro))
	if _, err := t.client.Events(t.namespace).Patch(ctx, t.name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("patch Event %s/%s: %w", t.namespace, t.name, err)
	}
	return nil
}

// resolve decides where a series' Event goes: on its object, in the
// cluster that has it; or, for a workload cluster nodeguard cannot reach, in
// the cluster nodeguard runs in, on the Machine a denial names, else on the
// Cluster.
func (r *Recorder) resolve(ctx context.Context, s *series) *target {
	ev := s.event
	ns := ev.regarding.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault // where a cluster-scoped object's Events go
	}
	switch {
	case ev.client != nil:
		return &target{client: ev.client, namespace: ns, regarding: ev.regarding, related: ev.related, note: ev.note}
	case ev.cluster == "":
		return &target{client: r.opts.Events, namespace: ns, regarding: ev.regarding, related: ev.related, note: ev.note}
	}
	if r.opts.Workload != nil {
		c, err := r.opts.Workload(ctx, ev.cluster)
		if err == nil {
			// A denial's blocker lives in the management cluster: not related here.
			return &target{client: c, namespace: ns, regarding: ev.regarding, note: ev.note}
		}
		r.failLog.Do(func() {
			r.opts.Log.Warn("event: workload cluster unreachable; recording it in the management cluster",
				"cluster", ev.cluster, "reason", ev.reason, "error", err.Error())
		})
	}
	gk, ns, name := schema.GroupKind{Group: "cluster.x-k8s.io", Kind: "Cluster"}, "", ""
	if m := machine(ev.denial); m != "" {
		gk.Kind = "Machine"
		ns, name, _ = record.SplitKey("machine", m)
	} else {
		ns, name, _ = record.SplitKey("cluster", ev.cluster)
	}
	ref := corev1.ObjectReference{APIVersion: gk.Group, Kind: gk.Kind, Namespace: ns, Name: name}
	if r.opts.Resolve != nil {
		ref = r.opts.Resolve(ctx, gk, ns, name)
	}
	return &target{client: r.opts.Events, namespace: ns, regarding: ref, related: ev.related,
		note: truncate(fmt.Sprintf("%s %q of workload cluster %s: %s", ev.regarding.Kind, ev.regarding.Name, ev.cluster, ev.note))}
}

// machine is the first Machine ("namespace/name") a denial names; "" for
// none, or no denial.
func machine(d *Denial) string {
	if d == nil {
		return ""
	}
	for _, b := range d.Blockers {
		for _, l := range b.Links {
			if l.Machine != "" {
				return l.Machine
			}
		}
	}
	for _, u := range d.Unverified {
		for _, l := range u.Links {
			if l.Machine != "" {
				return l.Machine
			}
		}
	}
	return ""
}

// related is the first blocker, which the note names too.
func related(d *Denial) *corev1.ObjectReference {
	if len(d.Blockers) == 0 {
		return nil
	}
	b := d.Blockers[0]
	return &corev1.ObjectReference{APIVersion: schema.GroupVersion{Group: b.Group, Version: b.Version}.String(),
		Kind: b.Kind, Namespace: b.Namespace, Name: b.Name}
}

// Note is what the Event says: who asked, why it was denied, and the rule's
// message (which names each blocker and what to do), cut to NoteMax.
func Note(d Denial) string {
	verdict := "denied"
	if d.Admitted {
		verdict = "admitted under enforcement action warn, would be denied"
	}
	return truncate(fmt.Sprintf("Delete by %q %s (%s): %s", d.User, verdict, d.Reason, strings.Join(d.Messages, " ")))
}

func truncate(s string) string {
	if len(s) <= NoteMax {
		return s
	}
	const more = "..."
	cut := NoteMax - len(more)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + more
}
