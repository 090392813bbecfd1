// Package fleet keeps every selected Cluster API workload cluster guarded,
// and proves it. In each, in the Cluster's mode, it owns what makes Node
// deletes judged there (mode webhook: nodeguard's ValidatingWebhookConfiguration;
// mode admission-policy: a ValidatingAdmissionPolicy, its binding and the
// released Nodes), watches those objects and restores them when they are
// deleted or edited, removes them when the Cluster opts out or is
// deselected, and leaves them alone while the Cluster is being deleted.
//
// A cluster counts as guarded only once a dry-run Node delete there came
// back judged as it should be: by nodeguard's route for that Cluster (the
// warning admission.DryRunWarning), or denied by the policy. A proof judges
// what the API server applied, not what was written: after a write, or a
// change of what a proof should find (mode, enforcement action,
// exemptions), it proves again every SettleRetry until it finds it, for up to
// SettleWindow, and reports nothing until then. Proofs are due ProofInterval
// after the last proof; a cluster the access layer (kube.ClusterSet) finds
// unreachable is reported so at once, with no request.
//
// Leaving a mode never leaves a moment where nothing judges, nor one where a
// released Node is denied: what replaces the old guard is installed and
// proven first; a policy is removed binding first, and its released Nodes
// only once the API server no longer applies the binding.
//
// One loop (kube.Loop) reconciles every Cluster; only the replica that
// leads writes and proves.
//
// It must not reach a workload cluster but through kube.ClusterSet, nor judge
// a Node: a proof asks the cluster's own admission chain.
package fleet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	authenticationv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/nodes"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// Options configure a Reconciler.
type Options struct {
	// Clusters are the workload clusters' connections and what is known of
	// each Cluster; the caller runs it, with Session among its Start
	// functions and Changed among its Changed functions.
	Clusters *kube.ClusterSet
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
	Webhook admission.WebhookSettings
	// ProofInterval is how long after its last proof a guarded cluster is
	// proven again (default DefaultProofInterval); an unguarded one is
	// looked at again sooner.
	ProofInterval time.Duration
	// SettleWindow bounds how long a proof that does not find what was
	// written is put down to the API server's lag (kube-apiserver applies a
	// webhook configuration within milliseconds, an admission policy within
	// about a second) and tried again every SettleRetry, unreported
	// (defaults DefaultSettleWindow, DefaultSettleRetry).
	SettleWindow, SettleRetry time.Duration
	// CAInterval is how often the CA files are read (default 5s).
	CAInterval time.Duration
	// CARetention is how long a CA that left the files stays in the bundle
	// (default DefaultCARetention): longer than kubelet takes to update every
	// replica's copy of the serving Secret.
	CARetention time.Duration
	// ProofTimeout bounds one cluster's writes and proof (default 10s).
	ProofTimeout time.Duration
	// Workers reconcile that many clusters at once (default 16).
	Workers int
	// Leading, when set, says whether this replica writes: only the leader
	// writes, proves and reports; Lead is to be called when it starts.
	Leading func() bool
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
	Releases        *nodes.Publisher
	AdmissionPolicy admission.PolicyOptions
	// DefaultMode is the mode of a Cluster its annotation does not name:
	// ModeWebhook ("" too), or ModeAdmissionPolicy (with Releases) where its
	// API server serves ValidatingAdmissionPolicy v1 and ModeWebhook where
	// it does not.
	DefaultMode string
	// ClientCerts, when set, issues each selected Cluster's workload API
	// server a webhook client certificate of its own (clientcert.go).
	ClientCerts *ClientCerts
	// GhostProtection is the Clusters' ghost protection unless their
	// annotation sets one ("": ghosts are not detected, none has one): with
	// deny, a Cluster in mode webhook gets the registration webhook too
	// (mode admission-policy has no network path for it: taint is what
	// protects there).
	GhostProtection nodes.Protection
	Log             *slog.Logger
}

// Defaults.
const (
	DefaultProofInterval = 5 * time.Minute
	DefaultCARetention   = 10 * time.Minute
	DefaultSettleWindow  = 5 * time.Second
	DefaultSettleRetry   = 250 * time.Millisecond
	defaultCAInterval    = 5 * time.Second
	defaultProofTimeout  = 10 * time.Second
	defaultWorkers       = 16
	// retryUnguarded is how soon a reachable but unguarded cluster is
	// proven again.
	retryUnguarded = 15 * time.Second
	// repairedRetry is how soon a cluster whose identity was installed
	// again is looked at: RBAC's informers see a binding in milliseconds.
	repairedRetry = time.Second
	// publishWait bounds how long a cluster entering mode admission-policy
	// waits, unreported, for the verdicts on its Nodes to be written (every
	// Node judged once) before its delete policy is bound.
	publishWait = 30 * time.Second
)

// Reconciler keeps the fleet guarded; Run runs it.
type Reconciler struct {
	opts Options
	loop *kube.Loop[string]

	mu       sync.Mutex
	tracked  map[string]*tracked
	caBundle []byte
	ca       retainer
	// policyInfo names and versions the policy of mode admission-policy;
	// policy is how it is built (SetExempt changes the exemptions).
	policyInfo admission.PolicyInfo
	policy     admission.PolicyOptions
}

// tracked is what the reconciler keeps of one Cluster between reconciles.
// One worker reconciles a key at a time; Session sets session under the
// Reconciler's mu.
type tracked struct {
	// seen is when the reconciler first looked at the Cluster.
	seen    time.Time
	session *session
	// connection is the session the reconciler last worked with.
	connection *session
	// state is the last State reported (reported: one was).
	state    State
	reported bool
	// expect names what a proof should find now (the mode, the enforcement
	// action, the exemptions, what was written); proven, what the last proof
	// that found it found. changed is when expect last changed, or
	// nodeguard last wrote there: the settle window counts from it.
	expect, proven string
	changed        time.Time
	lastProof      time.Time
	// entering is when the Cluster started waiting for the verdicts on its
	// Nodes to be written (mode admission-policy), zero when not waiting.
	entering time.Time
	// policyDecides: the last proof of mode webhook was denied by the
	// admission policy still there (no Node it releases to prove on).
	policyDecides bool
	// removing is when the bindings of mode admission-policy were removed,
	// while their policies wait for the API server to stop applying them;
	// removingLegacy the same for what nodeguard 0.3 left.
	removing, removingLegacy time.Time
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
	kube.SetDefault(&opts.CARetention, DefaultCARetention)
	kept := retainer{keep: opts.CARetention}
	ca := kept.bundle(time.Now(), certs)
	if _, err := admission.BuildWebhookConfig(admission.WebhookConfigOptions{URL: opts.URL, CABundle: ca, Cluster: "a/b", Webhook: opts.Webhook}); err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	if opts.Selector == nil {
		opts.Selector = labels.Everything()
	}
	kube.SetDefault(&opts.ProofInterval, DefaultProofInterval)
	kube.SetDefault(&opts.SettleWindow, DefaultSettleWindow)
	kube.SetDefault(&opts.SettleRetry, DefaultSettleRetry)
	kube.SetDefault(&opts.CAInterval, defaultCAInterval)
	kube.SetDefault(&opts.ProofTimeout, defaultProofTimeout)
	kube.SetDefault(&opts.Workers, defaultWorkers)
	opts.Log = cmp.Or(opts.Log, slog.New(slog.DiscardHandler))
	info, err := admission.LoadPolicyInfo()
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	if _, err := admission.BuildPolicies(info, opts.AdmissionPolicy); err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	opts.DefaultMode = cmp.Or(opts.DefaultMode, ModeWebhook)
	if opts.DefaultMode != ModeWebhook && (opts.DefaultMode != ModeAdmissionPolicy || opts.Releases == nil) {
		return nil, fmt.Errorf("fleet: default mode %q: %q, or %q with the released Nodes published", opts.DefaultMode, ModeWebhook, ModeAdmissionPolicy)
	}
	r := &Reconciler{
		policyInfo: info,
		opts:       opts,
		tracked:    map[string]*tracked{},
		caBundle:   ca,
		ca:         kept,
		policy:     opts.AdmissionPolicy,
	}
	r.loop = kube.NewLoop(kube.LoopOptions{Name: "fleet", Workers: opts.Workers, MaxBackoff: opts.ProofInterval}, r.reconcile)
	return r, nil
}

// SetExempt replaces the users and groups the admission policy exempts (a
// live edit of the Constraint's exemptUsers and exemptGroups) and writes the
// policy again into every workload cluster of mode admission-policy. A
// policy that cannot be built with them changes nothing.
func (r *Reconciler) SetExempt(users, groups []string) error {
	r.mu.Lock()
	next := r.policy
	next.ExemptUsers, next.ExemptGroups = users, groups
	if _, err := admission.BuildPolicies(r.policyInfo, next); err != nil {
		r.mu.Unlock()
		return fmt.Errorf("fleet: %w", err)
	}
	changed := !slices.Equal(users, r.policy.ExemptUsers) || !slices.Equal(groups, r.policy.ExemptGroups)
	r.policy = next
	r.mu.Unlock()
	if changed {
		r.Reprove()
	}
	return nil
}

// Reprove has every Cluster reconciled, and proven, now: the routes'
// enforcement action changed (the Constraint's), or this replica started
// leading.
func (r *Reconciler) Reprove() {
	r.mu.Lock()
	for _, t := range r.tracked {
		t.proven = ""
	}
	r.mu.Unlock()
	for _, k := range r.opts.Clusters.Clusters() {
		r.loop.Add(k)
	}
}

// Lead is called when this replica starts leading: every Cluster is
// looked at and proven again.
func (r *Reconciler) Lead() { r.Reprove() }

// Changed queues a Cluster whose Meta, connection or health changed
// (kube.ClusterSetOptions.Changed).
func (r *Reconciler) Changed(key string) { r.loop.Add(key) }

// States returns every Cluster's State as last reported.
func (r *Reconciler) States() []State {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]State, 0, len(r.tracked))
	for _, t := range r.tracked {
		if t.reported {
			out = append(out, t.state)
		}
	}
	return out
}

// Run reconciles until ctx is done, and returns once the reconciles under
// way (their writes) are done.
func (r *Reconciler) Run(ctx context.Context) {
	go wait.UntilWithContext(ctx, r.readCA, r.opts.CAInterval)
	r.loop.Run(ctx)
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
			r.loop.Add(k)
		}
	}
}

// track is the tracked of key, made when first asked.
func (r *Reconciler) track(key string) *tracked {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.tracked[key]
	if !ok {
		t = &tracked{seen: time.Now()}
		r.tracked[key] = t
	}
	return t
}

// outcome is what one reconcile found: the State to report (none while a
// proof settles) and when to look again.
type outcome struct {
	state    State
	settling bool
	after    time.Duration
}

func (r *Reconciler) reconcile(ctx context.Context, key string) kube.Result {
	meta, exists := r.opts.Clusters.Meta(key)
	if !exists {
		r.mu.Lock()
		_, had := r.tracked[key]
		if had && r.tracked[key].session == nil {
			delete(r.tracked, key)
		}
		r.mu.Unlock()
		if had && r.opts.Forgotten != nil {
			r.opts.Forgotten(key)
		}
		return kube.Result{}
	}
	t := r.track(key)
	if r.opts.Leading != nil && !r.opts.Leading() {
		r.standby(key, meta, t)
		return kube.Result{} // Lead queues every Cluster
	}
	ctx, cancel := context.WithTimeout(ctx, r.opts.ProofTimeout)
	defer cancel()
	certs := r.keepClientCert(ctx, key, meta)
	o := r.decide(ctx, key, meta, t)
	if !o.settling {
		r.report(key, t, o.state)
	}
	if certs > 0 && (o.after <= 0 || certs < o.after) {
		o.after = certs
	}
	return kube.Result{After: o.after}
}

// keepClientCert issues the Cluster's webhook client certificate where
// asked to; it returns when to try again after a failure (0: no need).
func (r *Reconciler) keepClientCert(ctx context.Context, key string, meta kube.ClusterMeta) time.Duration {
	if r.opts.ClientCerts == nil || !r.included(meta) {
		return 0
	}
	wrote, err := r.opts.ClientCerts.keep(ctx, key, meta)
	if err != nil {
		r.opts.Log.Error("fleet: cannot issue the workload API server's webhook client certificate; trying again", "cluster", key, "error", err.Error())
		return retryUnguarded
	}
	if wrote {
		r.opts.Log.Info("fleet: issued the workload API server's webhook client certificate", "cluster", key, "secret", ClientCertSecret(key))
	}
	return 0
}

// standby keeps a replica that does not lead ready to: the released Nodes
// of a Cluster in mode admission-policy are judged here too (the publisher
// writes only while leading), so a new leader publishes at once.
func (r *Reconciler) standby(key string, meta kube.ClusterMeta, t *tracked) {
	s := r.sessionOf(t)
	if r.opts.Releases == nil || s == nil || !r.included(meta) {
		return
	}
	if mode, err := r.modeOf(meta, s); err == nil && mode == ModeAdmissionPolicy {
		r.enroll(key)
	}
}

// included says whether nodeguard is to guard the Cluster at all.
func (r *Reconciler) included(meta kube.ClusterMeta) bool {
	return !meta.Deleting && meta.Annotations[OptOutAnnotation] != "true" && r.opts.Selector.Matches(labels.Set(meta.Labels))
}

// modeOf is the Cluster's mode: its annotation's, else the fleet's default
// (for mode admission-policy, where the workload API server serves the
// policies; asked once a connection). Without a connection an unnamed mode
// that depends on the API server is "".
func (r *Reconciler) modeOf(meta kube.ClusterMeta, s *session) (string, error) {
	if m := meta.Annotations[ModeAnnotation]; m != "" {
		return m, nil
	}
	if r.opts.DefaultMode != ModeAdmissionPolicy {
		return r.opts.DefaultMode, nil
	}
	if s == nil {
		return "", nil
	}
	served, err := s.servesPolicies()
	if err != nil {
		return "", err
	}
	if served {
		return ModeAdmissionPolicy, nil
	}
	return ModeWebhook, nil
}

func (r *Reconciler) sessionOf(t *tracked) *session {
	r.mu.Lock()
	defer r.mu.Unlock()
	return t.session
}

// decide brings one Cluster where its Meta says.
func (r *Reconciler) decide(ctx context.Context, key string, meta kube.ClusterMeta, t *tracked) outcome {
	s := r.sessionOf(t)
	mode, modeErr := r.modeOf(meta, s)
	st := State{Cluster: key, Mode: mode, LastProof: t.lastProof}
	if s != nil {
		st.Identity = s.user
	}
	switch {
	case meta.Deleting:
		return unguarded(st, ReasonDeleting, "the Cluster is being deleted; nodeguard leaves its workload cluster alone", 0)
	case meta.Annotations[OptOutAnnotation] == "true":
		return unguarded(st, ReasonOptedOut, "annotation "+OptOutAnnotation+": true", r.removeAll(ctx, key, s, t))
	case !r.opts.Selector.Matches(labels.Set(meta.Labels)):
		return unguarded(st, ReasonNotSelected, "the Cluster's labels do not match the fleet's selector "+r.opts.Selector.String(), r.removeAll(ctx, key, s, t))
	case st.Mode != "" && st.Mode != ModeWebhook && (st.Mode != ModeAdmissionPolicy || r.opts.Releases == nil):
		st.Reason, st.Message = ReasonModeUnsupported, fmt.Sprintf("mode %q is not supported; use %q", st.Mode, ModeWebhook)
		if st.Mode == ModeAdmissionPolicy {
			st.Message += " (mode " + ModeAdmissionPolicy + " needs nodeguard serve --fleet-admission-policy)"
		}
		return outcome{state: st}
	case s == nil:
		st.Reason, st.Message = ReasonNoKubeconfig, "no working kubeconfig Secret "+kube.KubeconfigSecret(key)
		err := r.opts.Clusters.Failure(key)
		if err != nil {
			// A connection starts by installing nodeguard's identity there,
			// so an API server that does not answer fails it.
			st.Reason, st.Message = failure(err, ReasonNoKubeconfig), err.Error()
		}
		// Not tried yet (nodeguard just started, the Cluster is new): not
		// a verdict.
		if err == nil && time.Since(t.seen) < publishWait {
			return outcome{state: st, settling: true, after: r.opts.SettleRetry}
		}
		return outcome{state: st}
	}
	if t.connection != s {
		// A new connection: its watches' first lists settle.
		t.connection = s
		t.changed = time.Now()
	}
	if h := r.opts.Clusters.Health(key); h.Checked && !h.Reachable {
		// Its return is told (Changed).
		return unguarded(st, ReasonUnreachable, fmt.Sprintf("the workload API server %s has not answered since %s: %v", s.c.Config.Host,
			h.Since.UTC().Format(time.RFC3339), h.Err), 0)
	}
	if modeErr != nil {
		return unguarded(st, failure(modeErr, ReasonNotInstalled), "discover ValidatingAdmissionPolicy: "+modeErr.Error()+r.repaired(ctx, key, s, modeErr), retryUnguarded)
	}
	if st.Mode == ModeAdmissionPolicy {
		action, err := rule.ActionOf(meta.Annotations, r.opts.AdmissionPolicy.Action)
		if err != nil {
			// Not guessed: the policy there stays as it is, and the Cluster
			// is reported until the annotation is fixed.
			return unguarded(st, ReasonNotInstalled, err.Error(), 0)
		}
		action = cmp.Or(action, rule.ActionDeny)
		st.Action = string(action)
		return r.guardPolicy(ctx, key, s, t, st, action)
	}
	protection, err := nodes.ProtectionOf(meta.Annotations, r.opts.GhostProtection)
	if r.opts.GhostProtection == "" {
		protection, err = nodes.ProtectionOff, nil
	}
	if err != nil {
		// The registration webhook stays as it is until it is fixed.
		r.opts.Log.Warn("fleet: Cluster's ghost protection ignored", "cluster", key, "error", err.Error())
		protection = registrationsOf(s)
	}
	r.mu.Lock()
	ca := r.caBundle
	r.mu.Unlock()
	return r.guardWebhook(ctx, key, s, t, st, ca, protection == nodes.ProtectionDeny, meta.Annotations[rule.ActionAnnotation])
}

// report records a Cluster's State, and tells of it.
func (r *Reconciler) report(key string, t *tracked, st State) {
	r.mu.Lock()
	before := t.state
	same := t.reported && st.sameVerdict(before)
	if same {
		st.Since = before.Since
	} else {
		st.Since = time.Now()
	}
	t.state, t.reported = st, true
	r.mu.Unlock()
	if !same {
		r.opts.Log.Info("fleet: workload cluster", "cluster", key, "guarded", st.Guarded, "reason", st.Reason, "message", st.Message)
		if r.opts.Recorded != nil {
			r.opts.Recorded(before, st)
		}
	}
	if r.opts.Report != nil {
		r.opts.Report(st)
	}
}

// expecting notes what a proof should find now: a new expectation starts
// the settle window.
func (t *tracked) expecting(expect string) {
	if t.expect != expect {
		t.expect, t.changed = expect, time.Now()
	}
}

// wrote notes a write that changes what the API server admits there.
func (t *tracked) wrote() { t.changed = time.Now() }

// proofDue says whether the cluster is to be proven now: what a proof
// should find changed, something was written since the last proof, it is
// not proven guarded, or its interval passed.
func (r *Reconciler) proofDue(t *tracked) bool {
	settled := t.proven == t.expect && (t.state.Guarded || t.state.Reason == ReasonDryRun)
	return !settled || t.changed.After(t.lastProof) || time.Since(t.lastProof) >= r.opts.ProofInterval
}

// settles says whether a proof that did not find what it should is put
// down to the API server's lag: within the settle window of the last
// change.
func (r *Reconciler) settles(t *tracked) bool {
	return time.Since(t.changed) < r.opts.SettleWindow
}

// next is when a cluster in State st is looked at again.
func (r *Reconciler) next(t *tracked, st State) time.Duration {
	if t.proven == t.expect && (st.Guarded || st.Reason == ReasonDryRun) {
		return max(time.Millisecond, time.Until(t.lastProof.Add(r.opts.ProofInterval)))
	}
	return min(retryUnguarded, r.opts.ProofInterval)
}

// session is one workload cluster's connection, as the fleet uses it:
// clients to write and prove with, and the watches of what it keeps there.
type session struct {
	c *kube.Cluster
	// core, auth and disco collect warnings per request (proofs), as JSON:
	// the three groups a session asks, not a clientset's fifty clients (a
	// few KiB each, at thousands of clusters).
	core  corev1client.CoreV1Interface
	auth  authenticationv1client.AuthenticationV1Interface
	disco discovery.DiscoveryInterface
	// vwc is nodeguard's webhook configuration there; policy, binding,
	// guard and guardBinding the objects of mode admission-policy (nil
	// without --fleet-admission-policy: nodeguard's identity may not read
	// them).
	vwc                                  *kube.ObjectWatch
	policy, binding, guard, guardBinding *kube.ObjectWatch
	// user is who the connection's credentials are there (asked once, by
	// the first proof).
	user string
	// written is the resourceVersion of the configuration as nodeguard last
	// wrote it, and wroteWanted what it wrote then: an object that differs
	// from that same want at that very version was changed by the API server
	// itself (a field it defaults that nodeguard does not set), and writing
	// again would loop.
	written     string
	wroteWanted map[string]any
	// served: whether the API server serves ValidatingAdmissionPolicy v1
	// (nil: not asked yet).
	served *bool
	// static: the API server applies nodeguard's policies from its static
	// manifests (nil: not looked at yet).
	static *bool
	// leftoversChecked: the policy objects nodeguard keeps there without a
	// watch (all without --fleet-admission-policy, else what nodeguard 0.3
	// left) were looked for and are gone.
	leftoversChecked bool
}

// Session watches what nodeguard keeps in the workload cluster c until ctx
// is done (a kube.ClusterSetOptions.Start function).
func (r *Reconciler) Session(ctx context.Context, c *kube.Cluster) {
	cfg := rest.CopyConfig(c.Config)
	cfg.WarningHandlerWithContext = warningCollector{}
	// JSON, not the connection's protobuf: proofs read Nodes' names only.
	cfg.ContentType, cfg.AcceptContentTypes = "", ""
	s := &session{c: c}
	var err error
	if s.core, err = corev1client.NewForConfig(cfg); err == nil {
		if s.auth, err = authenticationv1client.NewForConfig(cfg); err == nil {
			s.disco, err = discovery.NewDiscoveryClientForConfig(cfg)
		}
	}
	if err != nil {
		r.opts.Log.Error("fleet: no client for the workload cluster", "cluster", c.Key, "error", err.Error())
		return
	}
	queue := func(*unstructured.Unstructured) { r.loop.Add(c.Key) }
	watch := func(o kube.ObjectOptions) *kube.ObjectWatch {
		o.Client, o.Changed = c.Dynamic, queue
		w, err := kube.WatchObject(o)
		if err != nil {
			r.opts.Log.Error("fleet: cannot watch the workload cluster", "cluster", c.Key, "error", err.Error())
			return nil
		}
		return w
	}
	if s.vwc = watch(kube.ObjectOptions{Resource: admission.WebhookConfigGVR, Name: admission.Name}); s.vwc == nil {
		return
	}
	watches := []*kube.ObjectWatch{s.vwc}
	if r.opts.Releases != nil {
		s.policy = watch(kube.ObjectOptions{Resource: admission.PolicyGVR, Name: r.policyInfo.Name})
		s.binding = watch(kube.ObjectOptions{Resource: admission.BindingGVR, Name: r.policyInfo.Name})
		s.guard = watch(kube.ObjectOptions{Resource: admission.PolicyGVR, Name: r.policyInfo.Guard})
		s.guardBinding = watch(kube.ObjectOptions{Resource: admission.BindingGVR, Name: r.policyInfo.Guard})
		if s.policy == nil || s.binding == nil || s.guard == nil || s.guardBinding == nil {
			return
		}
		watches = append(watches, s.policy, s.binding, s.guard, s.guardBinding)
	}
	var wg sync.WaitGroup
	for _, w := range watches {
		wg.Go(func() { w.Run(ctx) })
	}
	t := r.track(c.Key)
	r.mu.Lock()
	t.session = s
	r.mu.Unlock()
	r.loop.Add(c.Key)
	wg.Wait()
	r.mu.Lock()
	if t.session == s {
		t.session = nil
	}
	r.mu.Unlock()
	r.loop.Add(c.Key)
}

// synced says whether every watch of s has its first list.
func (s *session) synced() bool {
	for _, w := range []*kube.ObjectWatch{s.vwc, s.policy, s.binding, s.guard, s.guardBinding} {
		if w != nil && !w.Synced() {
			return false
		}
	}
	return true
}

// whoAmI is the user the API server sees kube's credentials as ("" when
// it cannot say).
func whoAmI(ctx context.Context, auth authenticationv1client.AuthenticationV1Interface) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := auth.SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return ""
	}
	return r.Status.UserInfo.Username
}

// repaired installs nodeguard's identity again when err is a refusal of
// it (someone deleted its ServiceAccount or bindings): the next reconcile
// (soon: the cluster is unguarded) runs with it. It says what it did.
func (r *Reconciler) repaired(ctx context.Context, key string, s *session, err error) string {
	if s.c.Identity == nil || !(apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err)) || isWebhookCallFailure(err) {
		return ""
	}
	if rerr := s.c.Identity.Repair(ctx); rerr != nil {
		r.opts.Log.Error("fleet: cannot install nodeguard's identity again", "cluster", key, "error", rerr.Error())
		return "; installing nodeguard's identity again failed: " + rerr.Error()
	}
	r.opts.Log.Info("fleet: nodeguard's identity was refused; installed it again", "cluster", key, "error", err.Error())
	// Look again once the API server's authorizer has the grants back,
	// not after the unguarded retry.
	r.loop.AddAfter(key, repairedRetry)
	return "; nodeguard's identity was refused and is installed again"
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
	return strings.Contains(err.Error(), "failed calling webhook \""+admission.WebhookName+"\"")
}

func isCertificateError(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "x509:") || strings.Contains(msg, "certificate")
}
