package serve

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/events"
	"github.com/nodeguard/nodeguard/enforcer/fleet"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/nodes"
	"github.com/nodeguard/nodeguard/enforcer/record"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// FleetOptions are the fleet reconciler's flags of `nodeguard serve`.
type FleetOptions struct {
	// Enabled guards every selected CAPI workload cluster (--fleet).
	Enabled bool
	// URL is where the workload API servers reach this nodeguard
	// (--fleet-url, https).
	URL string
	// CAFiles hold the CA bundle given to the workload clusters (default:
	// ca.crt beside the serving certificate).
	CAFiles []string
	// Selector is a label selector on Clusters (default: all).
	Selector string
	// WatchFilter, when set, makes this install one shard of a fleet, as
	// Cluster API's --watch-filter does: it watches only the Clusters,
	// Machines, InfraMachines and pools labelled
	// cluster.x-k8s.io/watch-filter with this value, judges only their
	// routes (facts.Shard), and campaigns for Leases of its own.
	WatchFilter string
	// ProofInterval: how often each guarded cluster is proven again.
	ProofInterval time.Duration
	// CARetention: how long a CA that left CAFiles stays trusted.
	CARetention time.Duration
	// Namespace holds the status ConfigMap and the Lease (default: the
	// pod's, as LeaseNamespace).
	Namespace string
	// AdmissionPolicy supports mode admission-policy (--fleet-admission-policy):
	// the orphan scan watches every workload cluster's Nodes and writes the
	// verdicts on them where a Cluster is in that mode.
	AdmissionPolicy bool
	// DefaultMode is the mode of a Cluster not annotated with one (""
	// with AdmissionPolicy: admission-policy where the workload API server
	// serves ValidatingAdmissionPolicy v1, webhook elsewhere; "" without
	// it: webhook).
	DefaultMode string
	// AdmissionPolicyAction is the binding's action: deny (default), warn
	// (allowed, the denial as a warning) or dryrun (audited only).
	AdmissionPolicyAction string
	// Webhook are the settings of the configuration kept in each workload
	// cluster (--fleet-webhook-*): failure policy, timeout, which Nodes.
	Webhook admission.WebhookSettings
	// ClientCACertFile and ClientCAKeyFile, when set, are the CA that issues
	// each selected Cluster's workload API server a webhook client
	// certificate of its own (Secret <name>-nodeguard-webhook-client beside
	// the Cluster), valid ClientCertValidity; its cluster route then accepts
	// only that certificate.
	ClientCACertFile, ClientCAKeyFile string
	ClientCertValidity                time.Duration
}

// issuer is the fleet's webhook client certificate issuer, nil when off.
func (f FleetOptions) issuer() (*fleet.Issuer, error) {
	if f.ClientCACertFile == "" && f.ClientCAKeyFile == "" {
		return nil, nil
	}
	if !f.Enabled || f.ClientCACertFile == "" || f.ClientCAKeyFile == "" {
		return nil, fmt.Errorf("--fleet-client-ca-cert-file and --fleet-client-ca-key-file go together, with --fleet")
	}
	return fleet.NewIssuer(f.ClientCACertFile, f.ClientCAKeyFile, f.URL, f.ClientCertValidity)
}

// Event reasons on a Cluster whose guard changed.
const (
	EventGuarded   = "WorkloadClusterGuarded"
	EventUnguarded = "WorkloadClusterUnguarded"
)

// startFleet runs the fleet reconciler when asked to (in bg), its sessions
// joining sessions (which the caller runs); only the leader of leader writes.
func startFleet(ctx context.Context, c kube.Clients, opts Options, params map[string]any, sessions *WorkloadSessions,
	published *nodes.Publisher, leader *kube.Leader, issuer *fleet.Issuer, metrics *fleet.Metrics, rec *events.Recorder, bg *sync.WaitGroup,
	log *slog.Logger) (*fleet.Reconciler, error) {
	f := opts.Fleet
	if !f.Enabled {
		return nil, nil
	}
	selector := labels.Everything()
	if f.Selector != "" {
		var err error
		if selector, err = labels.Parse(f.Selector); err != nil {
			return nil, fmt.Errorf("--fleet-cluster-selector %q: %w", f.Selector, err)
		}
	}
	mode := f.DefaultMode
	if mode == "" && f.AdmissionPolicy {
		mode = fleet.ModeAdmissionPolicy
	}
	if mode == fleet.ModeAdmissionPolicy && !f.AdmissionPolicy {
		return nil, fmt.Errorf("--fleet-default-mode %s needs --fleet-admission-policy", mode)
	}
	caFiles := f.CAFiles
	if len(caFiles) == 0 {
		caFiles = []string{filepath.Join(filepath.Dir(opts.CertFile), "ca.crt")}
	}
	status := &fleet.Status{Client: c.Dynamic, Owner: sessions.Set.Meta, Leading: leader.Leading, WatchFilter: f.WatchFilter, Log: log}
	clusterEvents := rec.In("", nil)
	var certs *fleet.ClientCerts
	if issuer != nil {
		certs = &fleet.ClientCerts{Issuer: issuer, Secrets: sessions.Management, Writer: c.Dynamic}
	}
	r, err := fleet.New(fleet.Options{Clusters: sessions.Set, URL: f.URL, CAFiles: caFiles, Selector: selector, Webhook: f.Webhook,
		ProofInterval: f.ProofInterval, CARetention: f.CARetention, Leading: leader.Leading, Log: log, GhostProtection: fleetGhostProtection(opts),
		ClientCerts: certs, Releases: published, DefaultMode: mode, AdmissionPolicy: admission.PolicyOptions{ExemptUsers: stringsParam(params, "exemptUsers"), ExemptGroups: stringsParam(params, "exemptGroups"),
			Action: rule.Action(f.AdmissionPolicyAction)},
		Report:    func(s fleet.State) { metrics.Report(s); status.Report(s) },
		Forgotten: func(key string) { metrics.Forget(key); status.Forget(key) },
		Recorded: func(_, s fleet.State) {
			meta, ok := sessions.Set.Meta(s.Cluster)
			if !ok || clusterEvents == nil {
				return
			}
			ns, name, _ := record.SplitKey("cluster", s.Cluster)
			ref := &corev1.ObjectReference{APIVersion: meta.APIVersion, Kind: "Cluster", Namespace: ns, Name: name, UID: meta.UID}
			if s.Guarded {
				clusterEvents.Eventf(ref, nil, corev1.EventTypeNormal, EventGuarded, "Guard", "nodeguard guards this workload cluster: a dry-run Node delete there was judged by nodeguard's rule")
				return
			}
			kind := corev1.EventTypeWarning
			if fleet.Excluded(s.Reason) {
				kind = corev1.EventTypeNormal
			}
			clusterEvents.Eventf(ref, nil, kind, EventUnguarded, "Guard", "nodeguard does not guard this workload cluster (%s): %s", s.Reason, s.Message)
		}})
	if err != nil {
		return nil, err
	}
	sessions.Add(r.Session, nil, r.Changed)
	// A new leader proves every cluster at once.
	leader.Notify(func(leading bool) {
		if leading {
			status.Lead()
			r.Lead()
		}
	})
	if leader.Leading() {
		r.Lead()
	}
	bg.Go(func() { status.Run(ctx) })
	bg.Go(func() { r.Run(ctx) })
	log.Info("fleet: guarding workload clusters", "url", f.URL, "selector", selector.String(), "watchFilter", f.WatchFilter, "caFiles", caFiles,
		"proofInterval", f.ProofInterval.String())
	return r, nil
}

// stringsParam is a list parameter of the Constraint (--constraint).
func stringsParam(params map[string]any, name string) []string {
	var out []string
	values, _ := params[name].([]any)
	for _, v := range values {
		if s, ok := v.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// fleetGhostProtection is the Clusters' default ghost protection: the
// flag's, when ghosts are detected at all, else "" (the registration webhook
// is of no use then: every registration would be admitted).
func fleetGhostProtection(opts Options) nodes.Protection {
	if !opts.Orphans.Ghosts.Enabled() || opts.Orphans.Interval <= 0 {
		return ""
	}
	return opts.Orphans.Ghosts.protection()
}
