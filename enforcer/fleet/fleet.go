// Package fleet keeps every selected Cluster API workload cluster guarded,
// and proves it: in each, it owns nodeguard's ValidatingWebhookConfiguration
// (server-side apply, package owned), watches that one object and restores
// it when it is deleted or edited, removes it when the Cluster opts out or
// is deselected, and leaves it alone while the Cluster is being deleted.
// A cluster counts as guarded only once a dry-run Node delete there came
// back with the answer of nodeguard's route for that Cluster (the warning
// webhook.DryRunWarning), so a configuration that is present but cannot
// reach nodeguard, or trusts a stale CA, shows as what it is.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/nodeguard/nodeguard/enforcer/admissionpolicy"
	"github.com/nodeguard/nodeguard/enforcer/clusters"
	"github.com/nodeguard/nodeguard/enforcer/enforcement"
	"github.com/nodeguard/nodeguard/enforcer/ghosts"
	"github.com/nodeguard/nodeguard/enforcer/owned"
	"github.com/nodeguard/nodeguard/enforcer/releases"
	"github.com/nodeguard/nodeguard/enforcer/webhook"
	"github.com/nodeguard/nodeguard/enforcer/webhookconfig"
)

// Options configure a Reconciler.
type Options struct {
	// Clusters are the workload clusters' sessions and what is known of
	// each Cluster; the caller runs it, with Session among its Start
	// functions and Changed among its Changed functions.
	Clusters *clusters.Set
	// URL is the base https URL where the workload API servers reach
	// nodeguard serve; each cluster's route is appended.
	URL string
	// CAFiles hold the CA bundle the configurations carry: every
	// certificate in them (cabundle.go).
	CAFiles []string
	// Selector picks the Clusters guarded (nil: all).
	Selector labels.Selector
	// Webhook are the configuration's own settings (failure policy,
	// timeout, which Nodes); a proof dry-runs a Node its selector picks.
	Webhook webhookconfig.Settings
	// ProofInterval is how often a guarded cluster is proven again
	// (default DefaultProofInterval); an unguarded one is looked at again
	// sooner, with a bounded backoff while it cannot be reached.
	ProofInterval time.Duration
	// CAInterval is how often the CA files are read (default 5s).
	CAInterval time.Duration
	// CARetention is how long a CA that left the files stays in the bundle
	// (default DefaultCARetention): longer than kubelet takes to update every
	// replica's copy of the serving Secret.
	CARetention time.Duration
	// ProofTimeout bounds one cluster's apply and proof (default 10s).
	ProofTimeout time.Duration
	// Workers reconcile that many clusters at once (default 16): an
	// unreachable cluster holds one for up to ProofTimeout.
	Workers int
	// IsLeader, when set, says whether this replica writes: only the
	// leader applies and proves; the others wait.
	IsLeader func() bool
	// Recorded, when set, is told of each State whose verdict changed (an
	// Event on the Cluster); Report of every State after each reconcile
	// (metrics, the status object). Neither may block for long.
	Recorded func(before, after State)
	Report   func(State)
	// Forgotten, when set, is told of a Cluster that is gone.
	Forgotten func(key string)
	// Releases, when set, publishes the released Nodes of the Clusters in
	// mode admission-policy (without it the mode is reported unsupported);
	// AdmissionPolicy says how their policy is built.
	Releases        *releases.Publisher
	AdmissionPolicy admissionpolicy.Options
	// GhostProtection is the Clusters' ghost protection unless their
	// annotation sets one ("": ghosts are not detected, none has one): with
	// deny, a Cluster in mode webhook gets the registration webhook too
	// (mode admission-policy has no network path for it: taint is what
	// protects there).
	GhostProtection ghosts.Protection
	Log             *slog.Logger
}

// Defaults.
const (
	DefaultProofInterval = 5 * time.Minute
	DefaultCARetention   = 10 * time.Minute
	defaultCAInterval    = 5 * time.Second
	defaultProofTimeout  = 10 * time.Second
	defaultWorkers       = 16
	// retryUnguarded is how soon a reachable but unguarded cluster is
	// looked at again.
	retryUnguarded = 15 * time.Second
)

// Reconciler keeps the fleet guarded; Run runs it.
type Reconciler struct {
	opts  Options
	queue workqueue.TypedRateLimitingInterface[string]

	mu       sync.Mutex
	watches  map[string]*watch
	states   map[string]State
	caBundle []byte
	ca       retainer
	// policyInfo names and versions the policy of mode admission-policy;
	// policy is how it is built (SetExempt changes the exemptions).
	policyInfo admissionpolicy.Info
	policy     admissionpolicy.Options
}

// watch is one workload cluster's session: the configuration as its API
// server has it, and clients to write and prove with.
type watch struct {
	dyn    dynamic.Interface
	kube   kubernetes.Interface // collects warnings per request (proofs)
	store  cache.Store
	synced func() bool
	// user is who the session's credentials are there (asked once, by the
	// first proof: one worker has a key at a time); repair, when set,
	// installs nodeguard's own identity again after a refusal.
	user   string
	repair func(context.Context) error
	// written is the resourceVersion of the configuration as nodeguard last
	// wrote it, and wrote what it wrote then: an object that differs from
	// that same want at that very version was changed by the API server
	// itself (a field it defaults that nodeguard does not set), and writing
	// again would loop.
	written     string
	wroteWanted *unstructured.Unstructured
	// done ends with the session; the watches of mode admission-policy
	// (policy) start the first time the Cluster is in it.
	done           <-chan struct{}
	policy         *policyWatch
	servesPolicies *bool
	policyRemoved  bool
}

// New checks opts and reads the CA bundle once: without one, nothing can be
// installed.
func New(opts Options) (*Reconciler, error) {
	if opts.Clusters == nil {
		return nil, errors.New("fleet: the workload clusters' Set is required")
	}
	certs, err := readCerts(opts.CAFiles)
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	if opts.CARetention <= 0 {
		opts.CARetention = DefaultCARetention
	}
	kept := retainer{keep: opts.CARetention}
	ca := kept.bundle(time.Now(), certs)
	if _, err := webhookconfig.Build(webhookconfig.Options{URL: opts.URL, CABundle: ca, Cluster: "a/b", Webhook: opts.Webhook}); err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	if opts.Selector == nil {
		opts.Selector = labels.Everything()
	}
	if opts.ProofInterval <= 0 {
		opts.ProofInterval = DefaultProofInterval
	}
	if opts.CAInterval <= 0 {
		opts.CAInterval = defaultCAInterval
	}
	if opts.ProofTimeout <= 0 {
		opts.ProofTimeout = defaultProofTimeout
	}
	if opts.Workers <= 0 {
		opts.Workers = defaultWorkers
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	info, err := admissionpolicy.LoadInfo()
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	if _, _, err := admissionpolicy.Build(info, opts.AdmissionPolicy); err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	limiter := workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, opts.ProofInterval)
	return &Reconciler{
		policyInfo: info,
		opts:       opts,
		queue:      workqueue.NewTypedRateLimitingQueueWithConfig(limiter, workqueue.TypedRateLimitingQueueConfig[string]{Name: "fleet"}),
		watches:    map[string]*watch{},
		states:     map[string]State{},
		caBundle:   ca,
		ca:         kept,
		policy:     opts.AdmissionPolicy,
	}, nil
}

// SetExempt replaces the users and groups the admission policy exempts (a
// live edit of the Constraint's exemptUsers and exemptGroups) and writes the
// policy again into every workload cluster of mode admission-policy. A
// policy that cannot be built with them changes nothing.
func (r *Reconciler) SetExempt(users, groups []string) error {
	r.mu.Lock()
	next := r.policy
	next.ExemptUsers, next.ExemptGroups = users, groups
	if _, _, err := admissionpolicy.Build(r.policyInfo, next); err != nil {
		r.mu.Unlock()
		return fmt.Errorf("fleet: %w", err)
	}
	changed := !slices.Equal(users, r.policy.ExemptUsers) || !slices.Equal(groups, r.policy.ExemptGroups)
	r.policy = next
	r.mu.Unlock()
	if changed {
		for _, k := range r.opts.Clusters.Clusters() {
			r.queue.Add(k)
		}
	}
	return nil
}

// policyOptions is how the admission policy is built now.
func (r *Reconciler) policyOptions() admissionpolicy.Options {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.policy
}

// Changed queues a Cluster whose Meta or session changed (clusters.Options.Changed).
func (r *Reconciler) Changed(key string) { r.queue.Add(key) }

// States returns every Cluster's State.
func (r *Reconciler) States() []State {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]State, 0, len(r.states))
	for _, s := range r.states {
		out = append(out, s)
	}
	return out
}

// Session watches nodeguard's configuration in the workload cluster c until
// ctx is done (a clusters.Options.Start function).
func (r *Reconciler) Session(ctx context.Context, c *clusters.Cluster) {
	cfg := rest.CopyConfig(c.Config)
	cfg.WarningHandlerWithContext = warningCollector{}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		r.opts.Log.Error("fleet: no client for the workload cluster", "cluster", c.Key, "error", err.Error())
		return
	}
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(c.Dynamic, 0, "", func(o *metav1.ListOptions) {
		o.FieldSelector = "metadata.name=" + webhookconfig.Name
	})
	informer := factory.ForResource(webhookconfig.GVR).Informer()
	queue := func(any) { r.queue.Add(c.Key) }
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: queue, UpdateFunc: func(_, obj any) { queue(obj) }, DeleteFunc: queue,
	}); err != nil {
		r.opts.Log.Error("fleet: cannot watch the workload cluster's configuration", "cluster", c.Key, "error", err.Error())
		return
	}
	// An unreachable API server: client-go's reflector backs off; the
	// reconcile reports it, this only keeps the log quiet.
	_ = informer.SetWatchErrorHandlerWithContext(func(context.Context, *cache.Reflector, error) {})
	w := &watch{dyn: c.Dynamic, kube: kube, store: informer.GetStore(), synced: informer.HasSynced, done: ctx.Done()}
	if c.Identity != nil {
		w.repair = c.Identity.Repair
	}
	r.mu.Lock()
	r.watches[c.Key] = w
	r.mu.Unlock()
	r.queue.Add(c.Key)
	factory.Start(ctx.Done())
	<-ctx.Done()
	factory.Shutdown()
	r.mu.Lock()
	if r.watches[c.Key] == w {
		delete(r.watches, c.Key)
	}
	r.mu.Unlock()
}

// Run reconciles until ctx is done.
func (r *Reconciler) Run(ctx context.Context) {
	go func() {
		<-ctx.Done()
		r.queue.ShutDown()
	}()
	go wait.UntilWithContext(ctx, r.readCA, r.opts.CAInterval)
	var wg sync.WaitGroup
	for range r.opts.Workers {
		wg.Go(func() {
			for r.work(ctx) {
			}
		})
	}
	wg.Wait()
}

// readCA reads the CA files again; a changed bundle is written everywhere.
func (r *Reconciler) readCA(context.Context) {
	certs, err := readCerts(r.opts.CAFiles)
	if err != nil {
		// The bundle in place stays: an empty one would reject everything.
		r.opts.Log.Error("fleet: cannot read the CA bundle; the workload clusters keep the one they have", "error", err.Error())
		return
	}
	r.mu.Lock()
	ca := r.ca.bundle(time.Now(), certs)
	changed := string(ca) != string(r.caBundle)
	r.caBundle = ca
	r.mu.Unlock()
	if changed {
		r.opts.Log.Info("fleet: the CA bundle changed; writing it into every workload cluster")
		for _, k := range r.opts.Clusters.Clusters() {
			r.queue.Add(k)
		}
	}
}

func (r *Reconciler) work(ctx context.Context) bool {
	key, shutdown := r.queue.Get()
	if shutdown {
		return false
	}
	defer r.queue.Done(key)
	if r.opts.IsLeader != nil && !r.opts.IsLeader() {
		r.queue.AddAfter(key, 2*time.Second)
		return true
	}
	st, gone := r.reconcile(ctx, key)
	if gone || ctx.Err() != nil {
		r.queue.Forget(key)
		return true
	}
	switch {
	case st.Guarded:
		r.queue.Forget(key)
		r.queue.AddAfter(key, r.opts.ProofInterval)
	case st.Reason == ReasonUnreachable:
		r.queue.AddRateLimited(key) // bounded backoff
	case Excluded(st.Reason) || st.Reason == ReasonNoKubeconfig:
		r.queue.Forget(key) // its change queues it
	default:
		r.queue.Forget(key)
		r.queue.AddAfter(key, min(retryUnguarded, r.opts.ProofInterval))
	}
	return true
}

// reconcile brings one Cluster where its Meta says and records its State;
// gone says the Cluster is no more.
func (r *Reconciler) reconcile(ctx context.Context, key string) (State, bool) {
	meta, exists := r.opts.Clusters.Meta(key)
	r.mu.Lock()
	before, w, ca := r.states[key], r.watches[key], r.caBundle
	r.mu.Unlock()
	if !exists {
		r.mu.Lock()
		delete(r.states, key)
		r.mu.Unlock()
		if r.opts.Forgotten != nil {
			r.opts.Forgotten(key)
		}
		return State{}, true
	}
	ctx, cancel := context.WithTimeout(ctx, r.opts.ProofTimeout)
	defer cancel()
	st := State{Cluster: key, Mode: meta.Annotations[ModeAnnotation], LastProof: before.LastProof}
	if w != nil {
		st.Identity = w.user
	}
	if st.Mode == "" {
		st.Mode = ModeWebhook
	}
	switch {
	case meta.Deleting:
		st.Reason, st.Message = ReasonDeleting, "the Cluster is being deleted; nodeguard leaves its workload cluster alone"
	case meta.Annotations[OptOutAnnotation] == "true":
		st.Reason, st.Message = ReasonOptedOut, "annotation "+OptOutAnnotation+": true"
		r.remove(ctx, key, w, &st)
	case !r.opts.Selector.Matches(labels.Set(meta.Labels)):
		st.Reason, st.Message = ReasonNotSelected, "the Cluster's labels do not match the fleet's selector "+r.opts.Selector.String()
		r.remove(ctx, key, w, &st)
	case st.Mode != ModeWebhook && (st.Mode != ModeAdmissionPolicy || r.opts.Releases == nil):
		st.Reason, st.Message = ReasonModeUnsupported, fmt.Sprintf("mode %q is not supported; use %q", st.Mode, ModeWebhook)
		if st.Mode == ModeAdmissionPolicy {
			st.Message += " (mode " + ModeAdmissionPolicy + " needs nodeguard serve --fleet-admission-policy)"
		}
	case w == nil:
		st.Reason, st.Message = ReasonNoKubeconfig, "no working kubeconfig Secret "+clusters.KubeconfigSecret(key)
		if err := r.opts.Clusters.Failure(key); err != nil {
			// A session starts by installing nodeguard's identity there, so
			// an API server that does not answer fails it.
			st.Reason, st.Message = failure(err, ReasonNoKubeconfig), err.Error()
		}
	case st.Mode == ModeAdmissionPolicy:
		w.policyRemoved = false
		action, err := enforcement.Of(meta.Annotations, r.opts.AdmissionPolicy.Action)
		if err != nil {
			// Not guessed: the policy there stays as it is, and the Cluster
			// is reported until the annotation is fixed.
			st.Reason, st.Message = ReasonNotInstalled, err.Error()
			break
		}
		r.guardPolicy(ctx, key, w, before, &st, action)
	default:
		if err := r.removePolicy(ctx, key, w); err != nil {
			r.opts.Log.Error("fleet: cannot remove nodeguard's admission policy", "cluster", key, "error", err.Error())
		}
		protection, err := ghosts.Of(meta.Annotations, r.opts.GhostProtection)
		if r.opts.GhostProtection == "" {
			protection, err = ghosts.Off, nil
		}
		if err != nil {
			// The registration webhook stays as it is until it is fixed.
			r.opts.Log.Warn("fleet: Cluster's ghost protection ignored", "cluster", key, "error", err.Error())
			protection = registrationsOf(w)
		}
		r.guard(ctx, key, w, ca, before, &st, protection == ghosts.Deny)
	}
	if st.Guarded == before.Guarded && st.Reason == before.Reason && !before.Since.IsZero() {
		st.Since = before.Since
	} else {
		st.Since = time.Now()
	}
	r.mu.Lock()
	r.states[key] = st
	r.mu.Unlock()
	if !st.sameVerdict(before) || before.Since.IsZero() {
		r.opts.Log.Info("fleet: workload cluster", "cluster", key, "guarded", st.Guarded, "reason", st.Reason, "message", st.Message)
		if r.opts.Recorded != nil {
			r.opts.Recorded(before, st)
		}
	}
	if r.opts.Report != nil {
		r.opts.Report(st)
	}
	return st, false
}

// remove deletes nodeguard's configuration from a cluster that opted out.
func (r *Reconciler) remove(ctx context.Context, key string, w *watch, st *State) {
	if w == nil {
		return // no client; a session starting queues the Cluster again
	}
	if err := r.removePolicy(ctx, key, w); err != nil {
		st.Message += "; " + err.Error()
		r.opts.Log.Error("fleet: cannot remove nodeguard's admission policy", "cluster", key, "error", err.Error())
	}
	if _, ok, _ := w.store.GetByKey(webhookconfig.Name); !ok && w.synced() {
		return // nothing there: no request
	}
	deleted, err := owned.Delete(ctx, w.dyn, webhookconfig.GVR, "", webhookconfig.Name)
	if err != nil {
		st.Message += "; removing nodeguard's configuration failed: " + err.Error()
		r.opts.Log.Error("fleet: cannot remove nodeguard's configuration", "cluster", key, "error", err.Error())
		return
	}
	if deleted {
		r.opts.Log.Info("fleet: removed nodeguard's configuration", "cluster", key, "reason", st.Reason)
	}
}

// guard installs the configuration where it is missing or differs, then
// proves the cluster guarded when a proof is due.
func (r *Reconciler) guard(ctx context.Context, key string, w *watch, ca []byte, before State, st *State, registrations bool) {
	cfg, err := webhookconfig.Build(webhookconfig.Options{URL: r.opts.URL, CABundle: ca, Cluster: key, Webhook: r.opts.Webhook,
		Registrations: registrations})
	if err != nil {
		st.Reason, st.Message = ReasonNotInstalled, err.Error()
		return
	}
	want, err := webhookconfig.Object(cfg)
	if err != nil {
		st.Reason, st.Message = ReasonNotInstalled, err.Error()
		return
	}
	var have *unstructured.Unstructured
	if obj, ok, _ := w.store.GetByKey(webhookconfig.Name); ok {
		have, _ = obj.(*unstructured.Unstructured)
	}
	if other := claimedBy(have); other != "" && other != key {
		if m, ok := r.opts.Clusters.Meta(other); ok && !m.Deleting {
			// Two Clusters' kubeconfigs reach one API server: writing would
			// flap between them, and one of them is wrong.
			st.Reason, st.Message = ReasonNotInstalled, fmt.Sprintf("this API server holds nodeguard's configuration for Cluster %s, "+
				"which exists too: two Clusters' kubeconfig Secrets reach the same API server; fix the wrong one", other)
			return
		}
	}
	applied := false
	if !owned.Holds(have, want.Object, "webhooks") {
		if have != nil && have.GetResourceVersion() == w.written && owned.Holds(w.wroteWanted, want.Object, "webhooks") {
			st.Reason, st.Message = ReasonNotInstalled, "the API server stores nodeguard's configuration otherwise than written "+
				"(a field it defaults?); not writing it again"
			return
		}
		stored, replaced, err := owned.Restore(ctx, w.dyn, want, "webhooks")
		if err != nil {
			st.Reason, st.Message = failure(err, ReasonNotInstalled), err.Error()+r.repaired(ctx, key, w, err)
			st.CACurrent = have != nil && trusts(have, ca)
			if !st.CACurrent && have != nil && st.Reason == ReasonNotInstalled {
				st.Reason = ReasonStaleCABundle
			}
			return
		}
		applied, w.written, w.wroteWanted = true, stored.GetResourceVersion(), want.Object
		what := "installed"
		switch {
		case replaced:
			what = "replaced (another manager had added fields)"
		case before.Wired:
			what = "restored"
		}
		r.opts.Log.Info("fleet: nodeguard's configuration "+what, "cluster", key)
	}
	// The stored configuration holds want (it did, or the write made it),
	// and want carries ca.
	st.Wired, st.CACurrent = true, true
	due := applied || !before.Guarded || time.Since(before.LastProof) >= r.opts.ProofInterval
	if !due {
		st.Guarded, st.Reason, st.Message = true, "", ""
		return
	}
	r.prove(ctx, key, w, st)
}

// registrationsOf is the protection the configuration stored in a cluster
// carries out: deny when it has the registration webhook.
func registrationsOf(w *watch) ghosts.Protection {
	if w == nil {
		return ghosts.Off
	}
	obj, ok, _ := w.store.GetByKey(webhookconfig.Name)
	if !ok {
		return ghosts.Off
	}
	have, _ := obj.(*unstructured.Unstructured)
	hooks, _, _ := unstructured.NestedSlice(have.Object, "webhooks")
	for _, h := range hooks {
		if m, _ := h.(map[string]any); m["name"] == webhookconfig.RegistrationWebhookName {
			return ghosts.Deny
		}
	}
	return ghosts.Off
}

// claimedBy is the Cluster a stored configuration routes to, "" when none.
func claimedBy(have *unstructured.Unstructured) string {
	if have == nil {
		return ""
	}
	return have.GetAnnotations()[webhookconfig.ClusterAnnotation]
}

// trusts says whether the stored configuration carries the CA bundle ca.
func trusts(have *unstructured.Unstructured, ca []byte) bool {
	hooks, _, _ := unstructured.NestedSlice(have.Object, "webhooks")
	for _, h := range hooks {
		m, _ := h.(map[string]any)
		var hook admissionregistrationv1.ValidatingWebhook
		if err := fromUnstructured(m, &hook); err == nil && hook.Name == webhookconfig.WebhookName {
			return string(hook.ClientConfig.CABundle) == string(ca)
		}
	}
	return false
}

// prove makes a dry-run delete of one of the cluster's Nodes, as nodeguard:
// the cluster is guarded when the answer carries the warning of
// nodeguard's route for this Cluster, allowed or denied.
func (r *Reconciler) prove(ctx context.Context, key string, w *watch, st *State) {
	// A Node the webhook is sent: its object selector's.
	nodes, err := w.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: 1, LabelSelector: r.opts.Webhook.ObjectSelector})
	if err != nil {
		st.Reason, st.Message = failure(err, ReasonUnreachable), "list Nodes: "+err.Error()+r.repaired(ctx, key, w, err)
		return
	}
	if len(nodes.Items) == 0 {
		st.Reason, st.Message = ReasonNoNodes, "the workload cluster has no Node to prove the guard on yet"
		return
	}
	node := nodes.Items[0]
	if w.user == "" {
		w.user = whoAmI(ctx, w.kube)
		st.Identity = w.user
	}
	var warnings []string
	pctx := withWarnings(ctx, &warnings)
	uid := node.UID
	err = w.kube.CoreV1().Nodes().Delete(pctx, node.Name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll},
		Preconditions: &metav1.Preconditions{UID: &uid}})
	mark := webhook.DryRunWarning(key)
	for _, warning := range warnings {
		if warning == mark {
			st.Guarded, st.Reason, st.Message, st.LastProof = true, "", "", time.Now()
			return
		}
	}
	switch {
	case err == nil:
		st.Reason, st.Message = ReasonReviewNotReceived,
			fmt.Sprintf("a dry-run delete of Node %s was admitted without nodeguard's answer: the API server does not send it to nodeguard's route", node.Name)
	case isWebhookCallFailure(err) && isCertificateError(err):
		st.Reason, st.Message = ReasonStaleCABundle, "the API server does not trust nodeguard's certificate: "+err.Error()
	case isWebhookCallFailure(err):
		st.Reason, st.Message = ReasonReviewNotReceived, "the API server cannot reach nodeguard: "+err.Error()
	default:
		st.Reason, st.Message = failure(err, ReasonReviewNotReceived), fmt.Sprintf("dry-run delete of Node %s: %v", node.Name, err)
	}
}

// repaired installs nodeguard's identity again when err is a refusal of
// it (someone deleted its ServiceAccount or bindings): the next reconcile
// (soon: the cluster is unguarded) runs with it. It says what it did.
func (r *Reconciler) repaired(ctx context.Context, key string, w *watch, err error) string {
	if w.repair == nil || !(apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err)) || isWebhookCallFailure(err) {
		return ""
	}
	if rerr := w.repair(ctx); rerr != nil {
		r.opts.Log.Error("fleet: cannot install nodeguard's identity again", "cluster", key, "error", rerr.Error())
		return "; installing nodeguard's identity again failed: " + rerr.Error()
	}
	r.opts.Log.Info("fleet: nodeguard's identity was refused; installed it again", "cluster", key, "error", err.Error())
	return "; nodeguard's identity was refused and is installed again"
}

// whoAmI is the user the API server sees kube's credentials as ("" when
// it cannot say).
func whoAmI(ctx context.Context, kube kubernetes.Interface) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := kube.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return ""
	}
	return r.Status.UserInfo.Username
}

// failure is the reason for an error talking to a workload API server:
// unreachable when the request never got an answer.
func failure(err error, otherwise string) string {
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, context.DeadlineExceeded) || apierrors.IsTimeout(err) ||
		apierrors.IsServiceUnavailable(err) || strings.Contains(err.Error(), "connection refused") {
		return ReasonUnreachable
	}
	return otherwise
}

func isWebhookCallFailure(err error) bool {
	return strings.Contains(err.Error(), "failed calling webhook \""+webhookconfig.WebhookName+"\"")
}

func isCertificateError(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "x509:") || strings.Contains(msg, "certificate")
}
