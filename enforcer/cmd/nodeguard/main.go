// Command nodeguard keeps Nodes from being deleted while an InfraMachine
// linked to them still exists.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/cli"
	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/fleet"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/nodes"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/enforcer/serve"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	code := cli.ExitAllowed
	root := rootCommand(&code, stderr)
	if plugin := kubectlPluginName(os.Args[0]); plugin != "" {
		// Installed as kubectl-nodeguard, kubectl runs it as `kubectl nodeguard`.
		root.Annotations = map[string]string{cobra.CommandDisplayNameAnnotation: plugin}
	}
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(stderr, "nodeguard:", err)
		return cli.ExitError
	}
	return code
}

// rootCommand is nodeguard with every subcommand; the exit code of check and
// orphans goes to code.
func rootCommand(code *int, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "nodeguard",
		Short:         "Deny deleting a Node while an InfraMachine linked to it still exists",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(checkCommand(code), auditCommand(code), cleanupCommand(code), serveCommand(stderr), webhookConfigCommand(), orphansCommand(code),
		ghostsCommand(code), clustersCommand(code))
	root.AddCommand(versionCommand())
	return root
}

func auditCommand(code *int) *cobra.Command {
	var opts cli.AuditOptions
	cmd := &cobra.Command{
		Use:   "audit [--cluster NAMESPACE/NAME] [-o text|json]",
		Short: "For every CAPI Cluster, what a delete of each workload Node would get now, and why (exit 0; 1 when a Cluster could not be audited)",
		Long: "Reads the Machines and InfraMachines of the management cluster of the kubeconfig, each Cluster's Nodes through\n" +
			"its kubeconfig Secret, and judges every Node as that Cluster's route would, from the caches (a delete re-reads\n" +
			"fresh): a preview before --enforcement-action warn or deny, and a check that no Node is unverified or misrouted.\n" +
			"Parameters: the cluster's K8sNodeGuard Constraint node-deletion-guard, unless --constraint is given.",
		Args: cobra.NoArgs,
		RunE: withCode(code, func(ctx context.Context, out io.Writer) (int, error) { return cli.Audit(ctx, opts, out) }),
	}
	f := cmd.Flags()
	fleetFlags(f, "audit only this CAPI Cluster, NAMESPACE/NAME", &opts.Cluster, &opts.Constraint, &opts.Output, &opts.Kubeconfig, &opts.Context)
	f.StringVar(&opts.User, "user", "", "user the deletes are judged for (exemptions)")
	f.StringArrayVar(&opts.Groups, "group", nil, "group of that user; repeatable")
	bundleFlags(f, &opts.Bundle)
	return cmd
}

func cleanupCommand(code *int) *cobra.Command {
	var opts cli.CleanupOptions
	cmd := &cobra.Command{
		Use:   "cleanup --namespace NS [--deployment NAME]",
		Short: "Remove what nodeguard wrote outside its install: the fleet's configuration in every workload cluster, Gatekeeper's Provider (exit 0; 1 when something stays)",
		Long: "The chart's pre-delete hook. With --deployment it first scales nodeguard to 0 and waits for its Pods (the fleet\n" +
			"restores what it keeps), then removes, where nodeguard's label marks them: in each CAPI Cluster's workload\n" +
			"cluster (through its kubeconfig Secret) the webhook configuration, the admission policy, its binding and released\n" +
			"Nodes, and nodeguard's identity; here Gatekeeper's Provider nodeguard (with --watch-filter: only that shard's\n" +
			"Clusters, and no Provider). When\n" +
			"something cannot be removed it says what, scales the Deployment back and exits 1.",
		Args: cobra.NoArgs,
		RunE: withCode(code, func(ctx context.Context, out io.Writer) (int, error) { return cli.Cleanup(ctx, opts, out) }),
	}
	f := cmd.Flags()
	f.StringVar(&opts.Namespace, "namespace", "", "nodeguard's namespace (required)")
	f.StringVar(&opts.Deployment, "deployment", "", "nodeguard's Deployment there, scaled to 0 first")
	f.DurationVar(&opts.Timeout, "timeout", 2*time.Minute, "how long to wait for the Deployment's Pods to go")
	f.StringVar(&opts.WatchFilter, "watch-filter", "", "the install's serve --watch-filter: clean only the workload clusters of the Clusters labelled cluster.x-k8s.io/watch-filter=VALUE")
	f.StringVar(&opts.Kubeconfig, "kubeconfig", "", "kubeconfig (default: in-cluster)")
	f.StringVar(&opts.Context, "context", "", "kubeconfig context")
	_ = cmd.MarkFlagRequired("namespace")
	return cmd
}

func checkCommand(code *int) *cobra.Command {
	var opts cli.CheckOptions
	cmd := &cobra.Command{
		Use:   "check --node NAME [-f PATH ...]",
		Short: "Say whether deleting a Node would be allowed (exit 0 allowed, 2 denied, 1 error)",
		Long: "With -f, judge offline: the files or directories of manifests are the whole inventory and hold the Node.\n" +
			"Without -f, judge live against the cluster of the kubeconfig, reading objects fresh from the API server, with\n" +
			"the parameters of its K8sNodeGuard Constraint node-deletion-guard unless --constraint is given; with --cluster\n" +
			"the Node is read from that Cluster's workload cluster, through its kubeconfig Secret, as its route judges it.",
		Args: cobra.NoArgs,
		RunE: withCode(code, func(ctx context.Context, out io.Writer) (int, error) { return cli.Check(ctx, opts, out) }),
	}
	f := cmd.Flags()
	f.StringVar(&opts.Node, "node", "", "name of the Node to judge (required)")
	judgeFlags(f, &opts.Files, &opts.Cluster, &opts.Constraint, &opts.Output, &opts.Kubeconfig, &opts.Context)
	f.StringVar(&opts.User, "user", "", "user deleting the Node (for exemptions)")
	f.StringArrayVar(&opts.Groups, "group", nil, "group of that user; repeatable")
	bundleFlags(f, &opts.Bundle)
	_ = cmd.MarkFlagRequired("node")
	return cmd
}

// withCode runs a command that names its own exit code (check, orphans).
func withCode(code *int, run func(context.Context, io.Writer) (int, error)) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		c, err := run(cmd.Context(), cmd.OutOrStdout())
		*code = c
		return err
	}
}

// judgeFlags are the flags check and orphans share: the objects judged (-f
// files, else the live cluster of --kubeconfig and --context), the CAPI
// Cluster whose Machines count, the Constraint, and the output format.
func judgeFlags(f *pflag.FlagSet, files *[]string, cluster, constraint, output, kubeconfig, kcContext *string) {
	f.StringArrayVarP(files, "filename", "f", nil, "manifest file or directory (YAML, JSON, Lists); repeatable")
	f.StringVar(cluster, "cluster", "", "only count Machines of this CAPI Cluster, NAMESPACE/NAME (live check: and read the Node from its workload cluster)")
	f.StringVar(constraint, "constraint", "", "K8sNodeGuard Constraint file to take parameters from (default: offline the rule's defaults, live the cluster's node-deletion-guard)")
	f.StringVarP(output, "output", "o", "text", "output format: text or json")
	f.StringVar(kubeconfig, "kubeconfig", "", "kubeconfig file (live mode)")
	f.StringVar(kcContext, "context", "", "kubeconfig context (live mode)")
}

// fleetFlags are the flags of the commands that look at every CAPI Cluster's
// workload cluster (audit, ghosts): the one Cluster to look at instead, the
// Constraint, the output format and the management cluster's kubeconfig.
func fleetFlags(f *pflag.FlagSet, clusterUsage string, cluster, constraint, output, kubeconfig, kcContext *string) {
	f.StringVar(cluster, "cluster", "", clusterUsage)
	f.StringVar(constraint, "constraint", "", "K8sNodeGuard Constraint file to take parameters from (default: the cluster's node-deletion-guard)")
	f.StringVarP(output, "output", "o", "text", "output format: text or json")
	f.StringVar(kubeconfig, "kubeconfig", "", "kubeconfig of the management cluster")
	f.StringVar(kcContext, "context", "", "kubeconfig context")
}

func orphansCommand(code *int) *cobra.Command {
	var opts cli.OrphansOptions
	cmd := &cobra.Command{
		Use:   "orphans [-f PATH ...] [--cluster NAMESPACE/NAME] [--grace DURATION] [--now RFC3339] [--match-provider-id] [--delete] [-o text|json]",
		Short: "List orphan Nodes: CAPI Nodes whose Machine and InfraMachine are gone (exit 0, 1 on error)",
		Long: "A Node is an orphan when CAPI managed it, its Machine is gone and no other Machine links it, the rule would\n" +
			"allow deleting it, and it has not been Ready for the grace period (docs/policy.md, \"Orphan Nodes\").\n" +
			"With -f, judge offline: the files hold Nodes, Machines, InfraMachines and pools; --now fixes the clock.\n" +
			"Without -f, judge live against the cluster of the kubeconfig; --delete then deletes the orphans found,\n" +
			"each conditional on the UID and resourceVersion judged, through admission like any other delete.",
		Args: cobra.NoArgs,
		RunE: withCode(code, func(ctx context.Context, out io.Writer) (int, error) {
			opts.Namespace = serve.LeaseNamespace(opts.Namespace)
			return cli.Orphans(ctx, opts, out)
		}),
	}
	f := cmd.Flags()
	judgeFlags(f, &opts.Files, &opts.Cluster, &opts.Constraint, &opts.Output, &opts.Kubeconfig, &opts.Context)
	f.DurationVar(&opts.Grace, "grace", 0, "how long a Node must have been not Ready (0: the policy's default_grace)")
	f.StringVar(&opts.Now, "now", "", "judge at this time (RFC 3339) instead of now, for reproducible output")
	f.BoolVar(&opts.MatchProviderID, "match-provider-id", false, "also match Nodes without CAPI annotations by providerID (cluster-api #7237)")
	f.BoolVar(&opts.Delete, "delete", false, "delete the orphans found (live only)")
	namespaceFlag(f, &opts.Namespace)
	bundleFlags(f, &opts.Bundle)
	return cmd
}

func ghostsCommand(code *int) *cobra.Command {
	var opts cli.GhostsOptions
	cmd := &cobra.Command{
		Use:   "ghosts [--cluster NAMESPACE/NAME] [--tombstones] [--clear PROVIDERID ...] [-o text|json]",
		Short: "List ghost Nodes: Nodes alive again with the providerID of a Machine or InfraMachine that went away (exit 0 none, 2 some, 1 on error)",
		Long: "Reads the tombstones nodeguard serve keeps (ConfigMap nodeguard-tombstones) and judges, on fresh reads, every Node\n" +
			"with a tombstoned providerID: in the cluster of the kubeconfig and in every CAPI Cluster's workload cluster (through\n" +
			"its kubeconfig Secret), or in one with --cluster. A ghost's host outlived its deletion (docs/ghosts.md): stop it;\n" +
			"nodeguard never deletes a ghost. --clear ends the tombstones of providerIDs whose hosts are meant to rejoin.",
		Args: cobra.NoArgs,
		RunE: withCode(code, func(ctx context.Context, out io.Writer) (int, error) {
			opts.Namespace = serve.LeaseNamespace(opts.Namespace)
			return cli.Ghosts(ctx, opts, out)
		}),
	}
	f := cmd.Flags()
	fleetFlags(f, "look only at this CAPI Cluster's workload cluster, NAMESPACE/NAME", &opts.Cluster, &opts.Constraint, &opts.Output,
		&opts.Kubeconfig, &opts.Context)
	f.BoolVar(&opts.Tombstones, "tombstones", false, "print every tombstone too")
	f.StringArrayVar(&opts.Clear, "clear", nil, "end the tombstone of this providerID (its host is meant to rejoin); repeatable")
	namespaceFlag(f, &opts.Namespace)
	bundleFlags(f, &opts.Bundle)
	return cmd
}

// namespaceFlag is nodeguard's namespace, where serve keeps its tombstones.
func namespaceFlag(f *pflag.FlagSet, ns *string) {
	f.StringVar(ns, "namespace", "", "nodeguard's namespace, where serve keeps its tombstones (ConfigMap nodeguard-tombstones; default: $POD_NAMESPACE, else nodeguard-system)")
}

func serveCommand(stderr io.Writer) *cobra.Command {
	var opts serve.Options

	cmd := &cobra.Command{
		Use:   "serve --tls-cert-file FILE --tls-private-key-file FILE",
		Short: "Run the validating admission webhook for Node deletes",
		Long: "Serve AdmissionReviews over HTTPS. /validate judges Nodes against the Machines of the cluster of the\n" +
			"kubeconfig (self-hosted); /validate/clusters/NAMESPACE/NAME judges a workload cluster's Nodes against that\n" +
			"CAPI Cluster's Machines only (management cluster). With --externaldata-client-ca-file, the same port also serves\n" +
			"Gatekeeper's external data (/externaldata, /externaldata/clusters/NAMESPACE/NAME) for the K8sNodeGuardExternal\n" +
			"template. /metrics (--metrics-bind-address) and /healthz, /readyz (--health-probe-bind-address) are served over\n" +
			"HTTP on their own ports, so only the review port need be open to the API server and Gatekeeper.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := slog.New(slog.NewJSONHandler(stderr, nil))
			// client-go logs through klog (a broken watch, a failed list),
			// controller-runtime's certificate watcher through its own logger:
			// both into the same JSON log.
			klog.SetSlogLogger(log)
			ctrllog.SetLogger(logr.FromSlogHandler(log.Handler()))
			return serve.Run(cmd.Context(), opts, log, nil)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Listen, "listen-address", serve.DefaultListen, "address to serve HTTPS on")
	f.StringVar(&opts.CertFile, "tls-cert-file", "", "serving certificate (PEM); reloaded when the file changes")
	f.StringVar(&opts.KeyFile, "tls-private-key-file", "", "serving private key (PEM); reloaded when the file changes")
	f.StringVar(&opts.ClientCAFile, "client-ca-file", "", "if set, reviews must come with a client certificate signed by this CA")
	f.StringVar(&opts.ClusterRoutesClientCAFile, "cluster-routes-client-ca-file", "", "if set (and --client-ca-file not), reviews on /validate/clusters/NS/NAME must come with a client certificate signed by this CA, /validate not: the routes workload API servers call from outside the cluster")
	f.StringVar(&opts.ExternalDataClientCAFile, "externaldata-client-ca-file", "",
		"serve Gatekeeper's external data routes to clients with a certificate signed by this CA (Gatekeeper's: ca.crt of its webhook certificate Secret)")
	f.StringVar(&opts.GatekeeperProvider.Service, "gatekeeper-provider-service", "",
		"keep Gatekeeper's Provider in this cluster pointing at this Service NAMESPACE/NAME (port 443) with nodeguard's CA")
	f.StringVar(&opts.GatekeeperProvider.URL, "gatekeeper-provider-url", "", "like --gatekeeper-provider-service, at a base https URL")
	f.StringVar(&opts.GatekeeperProvider.CAFile, "gatekeeper-provider-ca-file", "",
		"CA of nodeguard's serving certificate for the Provider's caBundle, read again every 5s; the Provider is written when Gatekeeper's Provider CRD appears and whenever it or the CA changes (default: ca.crt beside --tls-cert-file)")
	f.StringVar(&opts.DecisionLogs.ConfigFile, "decision-log-config", "", "OPA configuration file (services, labels, decision_logs, as OPA's --config-file) for OPA decision logs of every verdict: console, or an HTTP service with batching, retries and a bounded buffer (docs/operate.md)")
	f.BoolVar(&opts.DecisionLogs.Console, "decision-log-console", false, "OPA decision logs of every verdict to standard error (OPA's console format)")
	f.StringVar(&opts.DecisionLogs.MaskFile, "decision-log-mask", "", "Rego module of package system.log whose mask rule says what decision log events keep (default: the requester's userInfo.extra erased)")
	f.IntVar(&opts.DecisionLogs.Queue, "decision-log-queue", rule.DefaultDecisionLogQueue, "decision log events waiting for the plugin at most; more are dropped and counted, so logging never delays a decision")
	f.StringVar(&opts.Kubeconfig, "kubeconfig", "", "kubeconfig of the cluster whose Machines count (default: in-cluster)")
	f.StringVar(&opts.Context, "context", "", "kubeconfig context")
	f.StringVar(&opts.Constraint, "constraint", "", "K8sNodeGuard Constraint file to take parameters from, read once (default: the cluster's Constraint, --constraint-name)")
	f.StringVar(&opts.ConstraintName, "constraint-name", facts.DefaultConstraintName, "without --constraint: the K8sNodeGuard Constraint in the cluster whose spec.parameters and spec.enforcementAction are in force, edits applied while serving; none there (or no Gatekeeper CRD): the rule's defaults; \"\": do not read it")
	negatedVar(f, &opts.NoFreshReads, "fresh-reads", "re-read the objects linked to a Node from the API server before answering; false answers from the informer caches alone (a lagging cache can then decide)")
	f.BoolVar(&opts.NoFreshReads, "no-fresh-reads", false, "the same as --fresh-reads=false")
	_ = f.MarkDeprecated("no-fresh-reads", "use --fresh-reads=false; --no-fresh-reads goes in a later release")
	f.DurationVar(&opts.FreshReadTimeout, "fresh-read-timeout", serve.DefaultFreshTimeout, "bound on the fresh reads of one review; past it the delete is denied")
	f.DurationVar(&opts.RequestTimeout, "request-timeout", serve.DefaultRequestTimeout, "deadline of one review; keep it below the webhook's timeoutSeconds")
	f.Var(actionFlag(&opts.EnforcementAction), "enforcement-action", "what a Node delete the rule denies becomes on the review routes: deny, warn (admitted, with the denial as a warning and a NodeDeleteWouldBeDenied Event) or dryrun (admitted, logged and counted); the Constraint's spec.enforcementAction, when set, overrides it, and a Cluster's nodeguard.io/enforcement-action annotation on its route")
	f.DurationVar(&opts.ShutdownGrace, "shutdown-grace", serve.DefaultShutdownGrace, "how long in-flight reviews, the release of the Leases and the writes under way may finish after SIGTERM")
	bundleFlags(f, &opts.Bundle)
	f.BoolVar(&opts.Orphans.Enabled, "reap-orphan-nodes", false, "delete orphan Nodes (see nodeguard orphans); one replica acts, holding a Lease")
	f.DurationVar(&opts.Orphans.Grace, "orphan-grace", 0, "how long a Node must have been not Ready, and the least time between the two observations before a delete (0: the policy's default_grace)")
	f.BoolVar(&opts.Orphans.DryRun, "reap-dry-run", false, "with --reap-orphan-nodes: log the orphan Nodes that would be deleted instead of deleting them")
	f.BoolVar(&opts.Orphans.WorkloadClusters, "reap-workload-clusters", false, "also scan the Nodes of every CAPI Cluster, through its <name>-kubeconfig Secret")
	f.BoolVar(&opts.Orphans.MatchProviderID, "orphan-match-provider-id", false, "also match Nodes without CAPI annotations by providerID (cluster-api #7237)")
	f.DurationVar(&opts.Orphans.Interval, "orphan-scan-interval", serve.DefaultOrphanScanInterval, "period of the full pass over the Node caches, the safety net under judging Nodes as they and what links them change (nodeguard_orphan_nodes); 0 turns the scan off")
	f.StringVar(&opts.Orphans.LeaseNamespace, "leader-election-namespace", "", "namespace of the orphan reaper's Lease and of the tombstones' ConfigMap (default: $POD_NAMESPACE, else nodeguard-system)")
	f.DurationVar(&opts.Orphans.Ghosts.Window, "ghost-window", facts.DefaultTombstoneWindow, "how long the providerID of a Machine, InfraMachine or pool membership that went away stays tombstoned: a Node alive again with it, linked by nothing, is a ghost (docs/ghosts.md); 0 turns ghost detection off (it runs with the orphan scan)")
	f.IntVar(&opts.Orphans.Ghosts.Max, "ghost-tombstones-max", facts.DefaultTombstoneMax, "most tombstones kept (in the ConfigMap nodeguard-tombstones); the oldest go first")
	f.Var(protectionFlag(&opts.Orphans.Ghosts.Protection), "ghost-protection", "what is done about a ghost Node besides reporting it: off, deny (its registration is denied: add the registration webhook, webhook-config --ghost-registrations; the fleet adds it) or taint (tainted "+nodes.GhostTaintKey+":NoExecute); a Cluster's nodeguard.io/ghost-protection annotation sets its own")
	f.Float32Var(&opts.KubeAPIQPS, "kube-api-qps", kube.DefaultQPS, "queries per second to the API server (informers and fresh reads); sized for bursts of Node deletes")
	f.IntVar(&opts.KubeAPIBurst, "kube-api-burst", kube.DefaultBurst, "burst of queries to the API server above --kube-api-qps")
	f.IntVar(&opts.MaxConcurrentDecisions, "max-concurrent-decisions", admission.DefaultMaxConcurrent, "decisions made at once; further reviews wait for a slot within their deadline")
	f.StringVar(&opts.MetricsBindAddress, "metrics-bind-address", serve.DefaultMetricsBindAddress, "address to serve /metrics on over HTTP; 0 disables")
	f.StringVar(&opts.HealthProbeBindAddress, "health-probe-bind-address", serve.DefaultHealthProbeBindAddress, "address to serve /healthz and /readyz on over HTTP; 0 disables")
	negatedVar(f, &opts.NoDenialEvents, "denial-events", "record a Warning Event NodeDeleteDenied on the Node of each denied delete (aggregated and rate-limited; docs/operate.md)")
	f.BoolVar(&opts.DenialEventsWorkloadClusters, "denial-events-workload-clusters", false, "record the Events of /validate/clusters/NS/NAME in that workload cluster, through its <name>-kubeconfig Secret (needs Secret get); otherwise on the Machine in this cluster")
	f.StringVar(&opts.TLSMinVersion, "tls-min-version", admission.DefaultMinVersion, "lowest TLS version accepted: VersionTLS12 or VersionTLS13")
	f.StringSliceVar(&opts.TLSCipherSuites, "tls-cipher-suites", admission.DefaultCipherSuites(), "TLS 1.2 cipher suites accepted, comma-separated IANA names (TLS 1.3 suites are always AEAD)")
	f.StringVar(&opts.SelfCluster, "self-cluster", "", "CAPI Cluster NAMESPACE/NAME this cluster itself is: /validate counts only its Machines, and denies a Node whose CAPI annotations name another Cluster (set it on a CAPI-managed management cluster)")
	f.BoolVar(&opts.Fleet.Enabled, "fleet", false, "guard every selected CAPI workload cluster: keep nodeguard's ValidatingWebhookConfiguration there (through its <name>-kubeconfig Secret) and prove it with dry-run Node deletes; one replica acts, holding a Lease")
	f.StringVar(&opts.Fleet.URL, "fleet-url", "", "with --fleet: base https URL where the workload API servers reach this nodeguard")
	f.StringSliceVar(&opts.Fleet.CAFiles, "fleet-ca-file", nil, "with --fleet: PEM files whose certificates together form the workload clusters' CA bundle, read again every 5s (default: ca.crt beside --tls-cert-file); list the CA Secret's tls.crt too, so a CA rotation is trusted before the serving certificate changes")
	f.StringVar(&opts.Fleet.Selector, "fleet-cluster-selector", "", "with --fleet: label selector on Clusters (default: all); Clusters annotated nodeguard.io/opt-out=true are left out")
	f.StringVar(&opts.Fleet.WatchFilter, "watch-filter", "", "with --fleet: make this install one shard of the fleet, as Cluster API's --watch-filter: watch only the Clusters, Machines, InfraMachines and pools labelled cluster.x-k8s.io/watch-filter=VALUE, judge only their routes (a Cluster's while all its objects carry VALUE; denied otherwise), with Leases nodeguard-fleet-VALUE and nodeguard-orphan-reaper-VALUE")
	f.BoolVar(&opts.Fleet.AdmissionPolicy, "fleet-admission-policy", true, "with --fleet: support mode admission-policy, where a ValidatingAdmissionPolicy in the workload cluster decides Node deletes from the verdict nodeguard writes on each Node; watches every workload cluster's Nodes; false: every Cluster in mode webhook")
	f.StringVar(&opts.Fleet.DefaultMode, "fleet-default-mode", "", "with --fleet: the mode of a Cluster its annotation nodeguard.io/mode does not name: webhook, or admission-policy (where its API server serves ValidatingAdmissionPolicy v1, webhook elsewhere) (default: admission-policy with --fleet-admission-policy, else webhook)")
	f.StringVar(&opts.Fleet.AdmissionPolicyAction, "fleet-admission-policy-action", "deny", "with --fleet-admission-policy: the policy binding's action on a Node that is not released, unless the Cluster's nodeguard.io/enforcement-action annotation sets one: deny, warn (admitted, the API server returns the denial as a warning; the cluster still proven guarded) or dryrun (the binding's Audit: admitted, recorded in the workload API server's audit log only; the cluster reported not guarded, reason dryrun)")
	webhookFlags(f, "fleet-webhook-", &opts.Fleet.Webhook)
	f.DurationVar(&opts.Fleet.ProofInterval, "fleet-proof-interval", fleet.DefaultProofInterval, "with --fleet: how often each guarded workload cluster is proven again by a dry-run Node delete")
	f.DurationVar(&opts.Fleet.CARetention, "fleet-ca-retention", fleet.DefaultCARetention, "with --fleet: how long a CA that left the CA files stays in the bundle, so every replica's serving certificate stays trusted while kubelet updates their Secrets")
	f.StringVar(&opts.Fleet.ClientCACertFile, "fleet-client-ca-cert-file", "", "with --fleet: PEM CA certificate that issues each selected Cluster's workload API server a webhook client certificate of its own (Secret NAME-nodeguard-webhook-client beside the Cluster, a kubeconfig whose user is --fleet-url's host:port); the Cluster's route then accepts only that certificate (401 otherwise)")
	f.StringVar(&opts.Fleet.ClientCAKeyFile, "fleet-client-ca-key-file", "", "with --fleet-client-ca-cert-file: that CA's PEM private key")
	f.DurationVar(&opts.Fleet.ClientCertValidity, "fleet-client-cert-validity", fleet.DefaultClientCertValidity, "with --fleet-client-ca-cert-file: how long each issued certificate is valid; it is renewed when a third of that is left (the API server reads it when it starts: at the control plane's next rollout)")
	f.StringVar(&opts.Fleet.Namespace, "fleet-namespace", "", "with --fleet: namespace of the Lease nodeguard-fleet (default: $POD_NAMESPACE, else nodeguard-system)")
	return cmd
}

// bundleFlags are the flags of a signed policy bundle, named as OPA's CLI
// names them where it has them.
func bundleFlags(f *pflag.FlagSet, opts *rule.BundleOptions) {
	f.StringVar(&opts.Path, "bundle", "", "signed OPA bundle (tar.gz from make bundle, or a directory) to run instead of the embedded rule; serve reloads it when it changes")
	f.StringVar(&opts.VerificationKeyFile, "bundle-verification-key", "", "PEM public key the bundle's signature must verify with (required with --bundle)")
	f.StringVar(&opts.KeyID, "bundle-key-id", rule.DefaultKeyID, "ID of the verification key (OPA's --verification-key-id)")
	f.StringVar(&opts.Algorithm, "bundle-signing-alg", rule.DefaultAlgorithm, "algorithm of the verification key (OPA's --signing-alg)")
	f.StringVar(&opts.Scope, "bundle-scope", "", "scope the signature must carry (OPA's --scope)")
}

func versionCommand() *cobra.Command {
	var (
		bundle rule.BundleOptions
		output string
	)
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the binary's version and commit and the policy it runs (with --bundle: that bundle's revision)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			eval, err := rule.LoadEngine(cmd.Context(), bundle)
			if err != nil {
				return err
			}
			r := rule.VersionReport{Binary: rule.ReadBinary(), Policy: eval.Policy()}
			switch output {
			case "text":
				return r.Write(cmd.OutOrStdout())
			case "json":
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(r)
			default:
				return fmt.Errorf("-o %q: want text or json", output)
			}
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	bundleFlags(cmd.Flags(), &bundle)
	return cmd
}

// kubectlPluginName is "kubectl nodeguard" when the binary runs as the
// kubectl plugin kubectl-nodeguard, so help and errors show the command the
// user typed; empty otherwise.
func kubectlPluginName(arg0 string) string {
	if strings.TrimSuffix(filepath.Base(arg0), ".exe") == "kubectl-nodeguard" {
		return "kubectl nodeguard"
	}
	return ""
}

func webhookConfigCommand() *cobra.Command {
	var (
		opts                  admission.WebhookConfigOptions
		caFile                string
		apply                 bool
		gatekeeperProvider    bool
		kubeconfig, kcContext string
	)
	cmd := &cobra.Command{
		Use:   "webhook-config --url URL --ca-bundle-file FILE [--cluster NAMESPACE/NAME] [--gatekeeper-provider] [--apply]",
		Short: "Print (or install) the ValidatingWebhookConfiguration (or Gatekeeper Provider) that sends Node deletes to nodeguard serve",
		Long: "Prints a ValidatingWebhookConfiguration: nodes, DELETE only, failurePolicy Fail, timeoutSeconds 5.\n" +
			"With --gatekeeper-provider, prints instead Gatekeeper's external data Provider that the K8sNodeGuardExternal\n" +
			"template asks (route /externaldata, timeout 2 s).\n" +
			"With --cluster, they judge that CAPI Cluster's Nodes (routes /validate|externaldata/clusters/NAMESPACE/NAME).\n" +
			"With --apply and --cluster, installs it into that workload cluster through the management cluster's\n" +
			"<name>-kubeconfig Secret; with --apply alone, into the cluster of the kubeconfig.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if caFile != "" {
				b, err := os.ReadFile(caFile)
				if err != nil {
					return fmt.Errorf("read --ca-bundle-file: %w", err)
				}
				opts.CABundle = b
			}
			m, err := configManifest(cmd.Context(), opts, gatekeeperProvider)
			if err != nil {
				return err
			}
			if !apply {
				out, err := m.render()
				if err != nil {
					return err
				}
				_, err = cmd.OutOrStdout().Write(out)
				return err
			}
			c, err := kube.Connect(kubeconfig, kcContext)
			if err != nil {
				return err
			}
			mgmt, err := kubernetes.NewForConfig(c.Config)
			if err != nil {
				return fmt.Errorf("create client: %w", err)
			}
			client, where, err := admission.InstallTarget(cmd.Context(), mgmt, c.Dynamic, opts.Cluster, dial)
			if err != nil {
				return err
			}
			if err := m.apply(cmd.Context(), client); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s applied to %s\n", m.what, where)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.URL, "url", "", "base https URL where the API server reaches nodeguard serve")
	f.StringVar(&opts.Service, "service", "", "instead of --url: the Service NAMESPACE/NAME of nodeguard serve in the same cluster")
	f.StringVar(&caFile, "ca-bundle-file", "", "PEM CA that signed nodeguard's serving certificate (required)")
	f.StringVar(&opts.Cluster, "cluster", "", "CAPI Cluster NAMESPACE/NAME whose Nodes this webhook judges (management-cluster topology)")
	f.BoolVar(&opts.Registrations, "ghost-registrations", false, "also send Node registrations (CREATE, and the UPDATE setting spec.providerID) to nodeguard, in a webhook of their own with failurePolicy Ignore: what serve --ghost-protection=deny needs to deny a ghost's")
	f.BoolVar(&apply, "apply", false, "install instead of print")
	f.BoolVar(&gatekeeperProvider, "gatekeeper-provider", false, "Gatekeeper's external data Provider instead of a ValidatingWebhookConfiguration")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the management (or self-hosted) cluster, for --apply")
	f.StringVar(&kcContext, "context", "", "kubeconfig context, for --apply")
	webhookFlags(f, "", &opts.Webhook)
	return cmd
}

// webhookFlags are the webhook's own settings, named prefix+NAME.
func webhookFlags(f *pflag.FlagSet, prefix string, s *admission.WebhookSettings) {
	f.Var(failurePolicyFlag(&s.FailurePolicy), prefix+"failure-policy", "what the API server does when nodeguard cannot be reached: Fail (deny the Node delete) or Ignore (admit it: the rule then holds only while nodeguard answers)")
	f.Int32Var(&s.TimeoutSeconds, prefix+"timeout-seconds", admission.TimeoutSeconds, "how long the API server waits for nodeguard (1-30); keep serve's --request-timeout below it")
	f.StringVar(&s.ObjectSelector, prefix+"object-selector", "", "label selector on the Nodes whose deletes are sent (default: every Node)")
	f.Var(&matchConditionsFlag{&s.MatchConditions}, prefix+"match-condition", "NAME=CEL: a condition a Node delete must meet to be sent (repeatable), e.g. 'not-break-glass=!(\"break-glass\" in request.userInfo.groups)'")
}

// failurePolicyFlag is a webhook's failure policy.
func failurePolicyFlag(p *admissionregistrationv1.FailurePolicyType) parsedFlag[admissionregistrationv1.FailurePolicyType] {
	return parsedFlag[admissionregistrationv1.FailurePolicyType]{v: p, def: admissionregistrationv1.Fail, typ: "policy",
		parse: func(s string) (admissionregistrationv1.FailurePolicyType, error) {
			switch p := admissionregistrationv1.FailurePolicyType(s); p {
			case admissionregistrationv1.Fail, admissionregistrationv1.Ignore:
				return p, nil
			}
			return "", fmt.Errorf("want Fail or Ignore, not %q", s)
		}}
}

// matchConditionsFlag collects NAME=EXPRESSION, one per use: an
// expression may hold commas.
type matchConditionsFlag struct {
	c *[]admissionregistrationv1.MatchCondition
}

func (f *matchConditionsFlag) String() string {
	if f.c == nil {
		return ""
	}
	var parts []string
	for _, c := range *f.c {
		parts = append(parts, c.Name+"="+c.Expression)
	}
	return strings.Join(parts, " ")
}

func (f *matchConditionsFlag) Set(s string) error {
	name, expr, ok := strings.Cut(s, "=")
	if !ok || name == "" || expr == "" {
		return fmt.Errorf("want NAME=CEL, not %q", s)
	}
	*f.c = append(*f.c, admissionregistrationv1.MatchCondition{Name: name, Expression: expr})
	return nil
}

func (*matchConditionsFlag) Type() string { return "NAME=CEL" }

// configObject is what webhook-config prints or applies: the
// ValidatingWebhookConfiguration, or Gatekeeper's Provider.
type configObject struct {
	what   string
	render func() ([]byte, error)
	apply  func(ctx context.Context, client dynamic.Interface) error
}

func configManifest(ctx context.Context, opts admission.WebhookConfigOptions, gatekeeperProvider bool) (configObject, error) {
	if gatekeeperProvider {
		name, err := admission.ProviderName(ctx)
		if err != nil {
			return configObject{}, err
		}
		p, err := admission.BuildProvider(name, opts)
		if err != nil {
			return configObject{}, err
		}
		return configObject{what: "Provider " + name, render: func() ([]byte, error) { return admission.ProviderYAML(p) },
			apply: func(ctx context.Context, client dynamic.Interface) error {
				return admission.ApplyProvider(ctx, client, p)
			}}, nil
	}
	cfg, err := admission.BuildWebhookConfig(opts)
	if err != nil {
		return configObject{}, err
	}
	return configObject{what: "ValidatingWebhookConfiguration " + cfg.Name, render: func() ([]byte, error) { return admission.WebhookConfigYAML(cfg) },
		apply: func(ctx context.Context, client dynamic.Interface) error {
			return admission.ApplyWebhookConfig(ctx, client, cfg)
		}}, nil
}

// dial is a client of a workload cluster's REST config.
func dial(cfg *rest.Config) (dynamic.Interface, error) { return dynamic.NewForConfig(cfg) }

// parsedFlag is a flag of a string type whose values parse checks: a
// misspelt one fails at start. Unset, it shows def.
type parsedFlag[T ~string] struct {
	v     *T
	def   T
	typ   string
	parse func(string) (T, error)
}

func (f parsedFlag[T]) String() string {
	if f.v == nil || *f.v == "" {
		return string(f.def)
	}
	return string(*f.v)
}

func (f parsedFlag[T]) Set(s string) error {
	v, err := f.parse(s)
	if err != nil {
		return err
	}
	*f.v = v
	return nil
}

func (f parsedFlag[T]) Type() string { return f.typ }

// actionFlag is an enforcement action flag.
func actionFlag(a *rule.Action) parsedFlag[rule.Action] {
	return parsedFlag[rule.Action]{v: a, def: rule.ActionDeny, typ: "action", parse: rule.ParseAction}
}

// protectionFlag is --ghost-protection: off, deny or taint.
func protectionFlag(p *nodes.Protection) parsedFlag[nodes.Protection] {
	return parsedFlag[nodes.Protection]{v: p, def: nodes.ProtectionOff, typ: "protection",
		parse: func(s string) (nodes.Protection, error) { return nodes.ParseProtection(s, nodes.ProtectionOff) }}
}

// negated is a bool flag named for what it turns on (--fresh-reads) over an
// option named for what turns it off (NoFreshReads), whose zero value is the
// default: one polarity on the command line, a safe zero in Go.
type negated struct{ off *bool }

func (n negated) String() string {
	if n.off == nil {
		return "true"
	}
	return strconv.FormatBool(!*n.off)
}

func (n negated) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	*n.off = !v
	return nil
}

func (negated) Type() string { return "bool" }

// negatedVar defines --name (default true) over off.
func negatedVar(f *pflag.FlagSet, off *bool, name, usage string) {
	f.VarPF(negated{off}, name, "", usage).NoOptDefVal = "true"
}
