//go:build e2e

// Package apibench measures what an operator feels: how much longer a Node
// DELETE takes through the real kube-apiserver with nodeguard (or Gatekeeper)
// as its validating webhook than with none, at fleet sizes, plus nodeguard's
// time to ready and memory. Server-side dry-run deletes pass through the
// webhooks and delete nothing. Run with `make bench-apiserver`; `make e2e`
// runs a smoke size. The binaries come from tests/e2e/tools/build.sh.
package apibench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/internal/constraints"
	"github.com/nodeguard/nodeguard/internal/localcluster"
	"github.com/nodeguard/nodeguard/internal/procstatus"
	"github.com/nodeguard/nodeguard/internal/testpki"
)

var (
	binDir    = flag.String("bin", os.Getenv("NODEGUARD_E2E_BIN"), "directory with kube-apiserver, etcd, kubectl and gatekeeper (tests/e2e/tools/build.sh prints it)")
	apiBinary = flag.String("kube-apiserver", "", "kube-apiserver binary to measure (default: -bin's kube-apiserver, v1.36; -bin's kube-apiserver-1.37 is v1.37)")
	sizesFlag = flag.String("sizes", "1000", "Machine counts (each with as many DockerMachines)")
	modesFlag = flag.String("modes", "none,reads,admission-policy,nodeguard,nodeguard-no-fresh-reads,gatekeeper,gatekeeper-provider",
		"what to measure, in order: a webhook (none, nodeguard, nodeguard-no-fresh-reads, gatekeeper: the sync-based template, "+
			"gatekeeper-provider: Gatekeeper with the K8sNodeGuardExternal template asking nodeguard), or reads: the two GETs of a "+
			"blocked Node's fresh reads, at once, from the client")
	nodeguardEnv  = flag.String("nodeguard-env", "GOGC=400 GOMEMLIMIT=400MiB", "environment of nodeguard serve (default: the deployment's GC settings)")
	gatekeeperMax = flag.Int("gatekeeper-max", 10000, "largest fleet Gatekeeper is measured at (its engine is linear in the synced inventory)")
	nodeguardArgs = flag.String("nodeguard-args", "", "extra flags for nodeguard serve, space separated")
	// Two builds compared in separate runs differ by the run (the API
	// server's and etcd's state after the fill moved one build's p50 by
	// 2-10 ms across runs), so builds are compared within one fill.
	nodeguardBins = flag.String("nodeguard-bin", "", "nodeguard binaries to measure instead of building this tree's, comma separated: "+
		"the i-th entry of -modes runs the (i mod n)-th, so -modes nodeguard,nodeguard,nodeguard,nodeguard with two alternates them in one fill")
	// Pausing between deletes idles this VM's CPUs, which slows the bare API
	// server itself (measured 1.6 -> 3.9 ms p50 with 25 ms pauses), so the
	// loop runs back to back; `make bench-apiserver` raises nodeguard's client
	// rate limit instead (see docs/performance.md).
	interval      = flag.Duration("interval", 0, "pause between two measured deletes")
	releasedNodes = flag.Int("released-nodes", 0, "mode admission-policy: other Nodes carrying a verdict beside the two measured (and, for 0.3's ConfigMap design, as many released in its ConfigMap)")
)

const (
	blockedNode = "md-0-000000" // its Machine and DockerMachine exist
	allowedNode = "free-0"      // nothing links to it
)

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	os.Exit(m.Run())
}

// result is one row of the summary table.
type result struct {
	size                     int
	mode, verdict            string
	p50, p99                 time.Duration
	addedP50, addedP99       time.Duration
	ready                    time.Duration
	rssMiB                   float64
	haveBaseline, haveServer bool
	// timeouts are the deletes the webhook did not answer within its
	// timeout (the API server then failed them closed): counted, at the
	// time they took, for the sync-based Gatekeeper past ~10,000 Machines.
	timeouts int
}

func BenchmarkNodeDelete(b *testing.B) {
	if *binDir == "" {
		b.Skip("no kube-apiserver/etcd: run `make bench-apiserver` (it builds them with tests/e2e/tools/build.sh)")
	}
	bins := nodeguardBinaries(b)
	var results []result
	for _, n := range sizes(b) {
		env, cfg := apiServer(b)
		kube, err := kubernetes.NewForConfig(cfg)
		require.NoError(b, err)
		start := time.Now()
		populate(b, cfg, n)
		fmt.Printf("%d Machines and %d DockerMachines created in %s\n", n, n, time.Since(start).Round(time.Second))
		baseline := map[string][2]time.Duration{}
		for i, mode := range strings.Split(*modesFlag, ",") {
			nodeguardBin, label := bins[i%len(bins)], mode
			if len(bins) > 1 && (strings.HasPrefix(mode, "nodeguard") || mode == "gatekeeper-provider") {
				label = mode + "@" + filepath.Base(nodeguardBin)
			}
			if mode == "gatekeeper" && n > *gatekeeperMax {
				b.Logf("gatekeeper at %d Machines: skipped (-gatekeeper-max %d): ~1 s per review at 10,000 already, linear in the fleet", n, *gatekeeperMax)
				continue
			}
			srv := startWebhook(b, env, kube, mode, nodeguardBin)
			for _, verdict := range []string{"blocked", "allowed"} {
				node := map[string]string{"blocked": blockedNode, "allowed": allowedNode}[verdict]
				var lat []time.Duration
				var timeouts int
				if mode == "reads" && verdict == "allowed" {
					continue // the allowed Node has no candidates to read
				}
				b.Run(fmt.Sprintf("machines=%d/%s/%s", n, label, verdict), func(b *testing.B) {
					if mode == "reads" {
						lat = measureReads(b, cfg)
					} else {
						lat, timeouts = measure(b, kube, node, verdict == "blocked" && mode != "none", mode == "gatekeeper")
					}
					p50, p99 := percentile(lat, 50), percentile(lat, 99)
					b.ReportMetric(ms(p50), "p50-ms")
					b.ReportMetric(ms(p99), "p99-ms")
					b.ReportMetric(float64(timeouts), "timeouts")
					if base, ok := baseline[verdict]; ok && mode != "reads" {
						b.ReportMetric(ms(p50-base[0]), "added-p50-ms")
						b.ReportMetric(ms(p99-base[1]), "added-p99-ms")
					}
					if srv.ready > 0 {
						b.ReportMetric(srv.ready.Seconds(), "ready-s")
						b.ReportMetric(srv.rssMiB, "rss-MiB")
						// Once ready includes the initial list's garbage; after
						// the deletes is the steady state the collector keeps.
						b.ReportMetric(srv.rss(b), "rss-after-MiB")
					}
				})
				r := result{size: n, mode: label, verdict: verdict, p50: percentile(lat, 50), p99: percentile(lat, 99),
					ready: srv.ready, rssMiB: srv.rssMiB, haveServer: srv.ready > 0, timeouts: timeouts}
				if mode == "none" {
					baseline[verdict] = [2]time.Duration{r.p50, r.p99}
				} else if base, ok := baseline[verdict]; ok && mode != "reads" {
					r.addedP50, r.addedP99, r.haveBaseline = r.p50-base[0], r.p99-base[1], true
				}
				results = append(results, r)
			}
			srv.stop()
		}
		_ = env.Stop()
	}
	// The summary, ready for docs/performance.md (b.Log of a parent
	// benchmark is not shown without -v).
	fmt.Print(table(results))
}

func sizes(b *testing.B) []int {
	var out []int
	for _, s := range strings.Split(*sizesFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		require.NoError(b, err)
		out = append(out, n)
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// measure times b.N dry-run deletes of node, one after another, and checks
// each answer: a blocked Node must be denied, an allowed one admitted. With
// timeoutsCount, a webhook timeout (failed closed by the API server) is
// counted, not a failure.
func measure(b *testing.B, kube kubernetes.Interface, node string, wantDenied, timeoutsCount bool) ([]time.Duration, int) {
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	timeouts := 0
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		err := kube.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		lat = append(lat, time.Since(start))
		switch {
		case timeoutsCount && err != nil && strings.Contains(err.Error(), "failed calling webhook") && strings.Contains(err.Error(), "deadline exceeded"):
			timeouts++
		case wantDenied && !apierrors.IsForbidden(err) || !wantDenied && err != nil:
			b.Fatalf("dry-run delete of Node %s: want denied=%v, got %v", node, wantDenied, err)
		}
		if *interval > 0 {
			b.StopTimer()
			time.Sleep(*interval) // time under test: the pace between deletes (-interval), outside the timer
			b.StartTimer()
		}
	}
	b.StopTimer()
	return lat, timeouts
}

// measureReads times b.N rounds of what nodeguard's fresh reads do for the
// blocked Node: GET its Machine and its DockerMachine at once (one wave),
// from a client like nodeguard's, straight from the API server.
func measureReads(b *testing.B, cfg *rest.Config) []time.Duration {
	dyn, err := dynamic.NewForConfig(cfg)
	require.NoError(b, err)
	r := localcluster.Current()
	gvrs := []schema.GroupVersionResource{r.GVR("cluster.x-k8s.io", "machines"), r.GVR("infrastructure.cluster.x-k8s.io", "dockermachines")}
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		var eg errgroup.Group
		for _, gvr := range gvrs {
			eg.Go(func() error {
				_, err := dyn.Resource(gvr).Namespace("team-0").Get(ctx, blockedNode, metav1.GetOptions{})
				return err
			})
		}
		require.NoError(b, eg.Wait())
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	return lat
}

func percentile(lat []time.Duration, p int) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

func table(results []result) string {
	var sb strings.Builder
	sb.WriteString("| Machines | webhook | Node | p50 | p99 | added p50 | added p99 | ready after start | RSS | timeouts |\n")
	sb.WriteString("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range results {
		added := "-"
		if r.haveBaseline {
			added = fmt.Sprintf("%.2f ms | %.2f ms", ms(r.addedP50), ms(r.addedP99))
		} else {
			added = "- | -"
		}
		server := "- | -"
		if r.haveServer {
			server = fmt.Sprintf("%.1f s | %.0f MiB", r.ready.Seconds(), r.rssMiB)
		}
		fmt.Fprintf(&sb, "| %d | %s | %s | %.2f ms | %.2f ms | %s | %s | %d |\n", r.size, r.mode, r.verdict, ms(r.p50), ms(r.p99), added, server, r.timeouts)
	}
	return sb.String()
}

// nodeguardBinaries returns -nodeguard-bin's binaries, or this tree's build.
func nodeguardBinaries(b *testing.B) []string {
	if *nodeguardBins != "" {
		return strings.Split(*nodeguardBins, ",")
	}
	return []string{buildNodeguard(b)}
}

// buildNodeguard builds the nodeguard binary, so it runs in its own process
// (its memory is its own) as in a cluster.
func buildNodeguard(b *testing.B) string {
	out := filepath.Join(b.TempDir(), "nodeguard")
	cmd := exec.Command("go", "build", "-o", out, "./enforcer/cmd/nodeguard")
	cmd.Dir = "../.."
	msg, err := cmd.CombinedOutput()
	require.NoError(b, err, "%s", msg)
	return out
}

// apiServer starts kube-apiserver and etcd with the current CAPI CRDs.
func apiServer(b *testing.B) (*envtest.Environment, *rest.Config) {
	env, err := localcluster.Environment(*binDir, b.TempDir(), localcluster.Current())
	require.NoError(b, err)
	if *apiBinary != "" {
		env.ControlPlane.GetAPIServer().Path = *apiBinary
	}
	_, err = env.Start()
	require.NoError(b, err)
	b.Cleanup(func() { _ = env.Stop() })
	cfg := localcluster.Config(env)
	// Filling the fleet is not what is measured: no client-side throttle.
	cfg.QPS, cfg.Burst = 10000, 10000
	return env, cfg
}

// populate creates n realistic CAPD Machines and DockerMachines over 10
// namespaces, the Machine of the blocked Node with its nodeRef, and the two
// Nodes.
func populate(b *testing.B, cfg *rest.Config, n int) {
	ctx := context.Background()
	dyn, err := dynamic.NewForConfig(cfg)
	require.NoError(b, err)
	kube, err := kubernetes.NewForConfig(cfg)
	require.NoError(b, err)
	for i := range 10 {
		_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("team-%d", i)}}, metav1.CreateOptions{})
		require.NoError(b, err)
	}
	r := localcluster.Current()
	machines, infra := r.GVR("cluster.x-k8s.io", "machines"), r.GVR("infrastructure.cluster.x-k8s.io", "dockermachines")
	each(b, n, 0, func(i int) error {
		m, d := objects(i)
		if i == 0 {
			m["status"] = map[string]any{"nodeRef": map[string]any{"name": blockedNode}}
		}
		if _, err := localcluster.Apply(ctx, dyn, infra, d); err != nil {
			return err
		}
		_, err := localcluster.Apply(ctx, dyn, machines, m)
		return err
	})
	for _, node := range []map[string]any{
		{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": blockedNode, "annotations": map[string]any{
			"cluster.x-k8s.io/cluster-name": "team-0", "cluster.x-k8s.io/cluster-namespace": "team-0", "cluster.x-k8s.io/machine": blockedNode}},
			"spec": map[string]any{"providerID": "docker:////" + blockedNode}},
		{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": allowedNode}, "spec": map[string]any{"providerID": "docker:////" + allowedNode}},
	} {
		_, err := localcluster.Apply(ctx, dyn, localcluster.Nodes(), node)
		require.NoError(b, err)
	}
}

// objects are Machine i (team-(i%10)/md-0-i, as a MachineSet makes it) and
// its DockerMachine, as the API server would hold them.
func objects(i int) (machine, docker map[string]any) {
	ns := fmt.Sprintf("team-%d", i%10)
	name := fmt.Sprintf("md-0-%06d", i)
	pid := "docker:////" + name
	machine = map[string]any{
		"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
		"metadata": map[string]any{"namespace": ns, "name": name,
			"labels": map[string]any{"cluster.x-k8s.io/cluster-name": ns, "cluster.x-k8s.io/deployment-name": "md-0",
				"cluster.x-k8s.io/set-name": "md-0-x7k2p"}},
		"spec": map[string]any{"clusterName": ns, "version": "v1.34.1", "providerID": pid,
			"bootstrap":         map[string]any{"dataSecretName": name + "-bootstrap"},
			"infrastructureRef": map[string]any{"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": name}},
	}
	docker = map[string]any{
		"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "DockerMachine",
		"metadata": map[string]any{"namespace": ns, "name": name, "labels": map[string]any{"cluster.x-k8s.io/cluster-name": ns}},
		"spec":     map[string]any{"providerID": pid, "customImage": "kindest/node:v1.34.1", "bootstrapped": true},
	}
	return machine, docker
}

// webhook is one running webhook server, or none.
type webhook struct {
	stop   func()
	ready  time.Duration
	rssMiB float64
	// rss reads the server's RSS now (MiB).
	rss func(b *testing.B) float64
}

// startWebhook starts the webhook of mode, points Node deletes at it and
// waits until it denies the blocked Node (so its data is synced).
func startWebhook(b *testing.B, env *envtest.Environment, kube kubernetes.Interface, mode, nodeguardBin string) webhook {
	ctx := context.Background()
	w := webhook{stop: func() {}}
	switch mode {
	case "none", "reads":
		return w
	case "nodeguard", "nodeguard-no-fresh-reads":
		args := strings.Fields(*nodeguardArgs)
		if mode == "nodeguard-no-fresh-reads" {
			args = append(args, "--fresh-reads=false")
		}
		w = startNodeguard(b, env, kube, nodeguardBin, args, asWebhook)
	case "admission-policy":
		w.stop, _ = startAdmissionPolicy(b, env, kube)
	case "gatekeeper", "gatekeeper-provider":
		start := time.Now()
		log, err := os.Create(filepath.Join(b.TempDir(), "gatekeeper.log"))
		require.NoError(b, err)
		constraints := "constraints"
		if mode == "gatekeeper-provider" {
			constraints = "constraints/external-data"
		}
		gk, err := localcluster.StartGatekeeper(ctx, env, *binDir, "../..", constraints, b.TempDir(), log)
		require.NoError(b, err)
		w.stop = func() {
			gk.Stop()
			_ = kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, "gatekeeper-validating-webhook-configuration", metav1.DeleteOptions{})
			// The next Gatekeeper must not load this one's template too.
			require.NoError(b, removeGatekeeperPolicy(ctx, env))
			_ = log.Close()
		}
		b.Logf("Gatekeeper started and %s applied in %s", constraints, time.Since(start).Round(time.Millisecond))
		if mode == "gatekeeper-provider" {
			// nodeguard as Gatekeeper's provider only: no webhook of its own;
			// it writes the Provider Gatekeeper calls.
			ng := startNodeguard(b, env, kube, nodeguardBin, append(strings.Fields(*nodeguardArgs), "--externaldata-client-ca-file", gk.CAFile), asProvider)
			stopGatekeeper := w.stop
			w = ng
			w.stop = func() { ng.stop(); stopGatekeeper() }
		}
	default:
		b.Fatalf("unknown mode %q", mode)
	}
	// Ready means both verdicts are right: a guard that fails closed denies
	// the blocked Node before it can judge (Gatekeeper does so until its
	// provider cache holds nodeguard's Provider), so a denial alone proves
	// nothing about the allowed Node.
	start := time.Now()
	dryRun := metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := kube.CoreV1().Nodes().Delete(ctx, blockedNode, dryRun); !apierrors.IsForbidden(err) {
			return false, nil
		}
		return kube.CoreV1().Nodes().Delete(ctx, allowedNode, dryRun) == nil, nil
	})
	require.NoError(b, err, "%s never denied the blocked Node and allowed the free one", mode)
	b.Logf("%s denies the blocked Node and allows the free one %s after its webhook was registered", mode, time.Since(start).Round(time.Millisecond))
	return w
}

// removeGatekeeperPolicy deletes what `kubectl apply -k` of either
// constraints kustomization created, and the Constraint CRDs Gatekeeper made
// of the templates (no garbage collector runs here).
func removeGatekeeperPolicy(ctx context.Context, env *envtest.Environment) error {
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		return err
	}
	for _, r := range []struct {
		gvr  schema.GroupVersionResource
		name string
	}{
		{schema.GroupVersionResource{Group: "templates.gatekeeper.sh", Version: "v1", Resource: "constrainttemplates"}, "k8snodeguard"},
		{schema.GroupVersionResource{Group: "templates.gatekeeper.sh", Version: "v1", Resource: "constrainttemplates"}, "k8snodeguardexternal"},
		{schema.GroupVersionResource{Group: "syncset.gatekeeper.sh", Version: "v1alpha1", Resource: "syncsets"}, "nodeguard"},
		{schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}, "k8snodeguard.constraints.gatekeeper.sh"},
		{schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}, "k8snodeguardexternal.constraints.gatekeeper.sh"},
	} {
		if err := dyn.Resource(r.gvr).Delete(ctx, r.name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete %s %s: %w", r.gvr.Resource, r.name, err)
		}
	}
	return nil
}

// role is what nodeguard serve is started as.
type role int

const (
	asWebhook  role = iota // its webhook registered for Node deletes
	asProvider             // Gatekeeper's external data provider, no webhook of its own
	asFleet                // --fleet --fleet-admission-policy: it guards the workload clusters
)

// startNodeguard runs `nodeguard serve` as its own process, measures the
// time from start to /readyz OK and its RSS then, and registers its webhook,
// or keeps Gatekeeper's Provider pointing at it, or guards the fleet.
func startNodeguard(b *testing.B, env *envtest.Environment, kube kubernetes.Interface, bin string, extra []string, as role) webhook {
	ctx := context.Background()
	dir := b.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	require.NoError(b, localcluster.AdminKubeconfig(env, kubeconfig))
	ca := testpki.New(b)
	cert, key := ca.ServerFiles(b, "nodeguard")
	addr, probes := freeAddr(b), freeAddr(b)
	args := append([]string{"serve", "--kubeconfig", kubeconfig, "--tls-cert-file", cert, "--tls-private-key-file", key,
		"--listen-address", addr, "--health-probe-bind-address", probes, "--metrics-bind-address", "0"}, extra...)
	switch as {
	case asProvider:
		args = append(args, "--gatekeeper-provider-url", "https://"+addr, "--gatekeeper-provider-ca-file", ca.CAFile(b))
	case asFleet:
		args = append(args, "--fleet", "--fleet-admission-policy", "--fleet-url", "https://"+addr, "--fleet-ca-file", ca.CAFile(b))
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), strings.Fields(*nodeguardEnv)...)
	cmd.Env = append(cmd.Env, "POD_NAMESPACE=default")
	log, err := os.Create(filepath.Join(dir, "nodeguard.log"))
	require.NoError(b, err)
	cmd.Stdout, cmd.Stderr = log, log
	start := time.Now()
	require.NoError(b, cmd.Start())
	stop := func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = log.Close()
		_ = kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, admission.Name, metav1.DeleteOptions{})
	}
	caPEM, err := os.ReadFile(ca.CAFile(b))
	require.NoError(b, err)
	client := &http.Client{Timeout: time.Second}
	url := "https://" + addr
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		resp, err := client.Get("http://" + probes + "/readyz")
		if err != nil {
			return false, nil
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	ready := time.Since(start)
	if err != nil {
		stop()
		logged, _ := os.ReadFile(log.Name())
		b.Fatalf("nodeguard not ready: %v\n%s", err, logged)
	}
	rss := rssMiB(b, cmd.Process.Pid)
	b.Logf("nodeguard serve %v: ready %s after start, RSS %.0f MiB", extra, ready.Round(time.Millisecond), rss)
	if as == asWebhook {
		vwc, err := admission.BuildWebhookConfig(admission.WebhookConfigOptions{URL: url, CABundle: caPEM})
		require.NoError(b, err)
		require.NoError(b, admission.ApplyWebhookConfig(ctx, dynamic.NewForConfigOrDie(localcluster.Config(env)), vwc))
	}
	return webhook{stop: stop, ready: ready, rssMiB: rss, rss: func(b *testing.B) float64 { return rssMiB(b, cmd.Process.Pid) }}
}

func freeAddr(b *testing.B) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	defer l.Close()
	return l.Addr().String()
}

// rssMiB reads a process's resident set size from /proc.
func rssMiB(b *testing.B, pid int) float64 {
	kb, err := procstatus.KiB(pid, "VmRSS")
	require.NoError(b, err)
	return float64(kb) / 1024
}

// startAdmissionPolicy installs mode admission-policy's generated policies
// and bindings, with the allowed Node released and -released-nodes other
// Nodes carrying a verdict, as the fleet does; the API server then decides
// alone. It returns what unbinds the delete policy, and the allowed Node's
// UID.
func startAdmissionPolicy(b *testing.B, env *envtest.Environment, kube kubernetes.Interface) (func(), string) {
	ctx := context.Background()
	dyn, err := dynamic.NewForConfig(env.Config)
	require.NoError(b, err)
	info, err := admission.LoadPolicyInfo()
	require.NoError(b, err)
	free, err := kube.CoreV1().Nodes().Get(ctx, allowedNode, metav1.GetOptions{})
	require.NoError(b, err)
	// Written before the guard is bound: it lets only nodeguard's identity
	// write them.
	patch, err := admission.VerdictPatch(info, admission.Verdict(string(free.UID), true, ""))
	require.NoError(b, err)
	_, err = kube.CoreV1().Nodes().Patch(ctx, allowedNode, types.MergePatchType, patch, metav1.PatchOptions{})
	require.NoError(b, err)
	each(b, *releasedNodes, 0, func(i int) error {
		_, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("gone-%06d", i),
			Annotations: map[string]string{info.Released: fmt.Sprintf("00000000-0000-4000-8000-%012d", i)}}}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
	policies, err := constraints.AdmissionPolicyManifests(filepath.Join("..", "..", "constraints"))
	require.NoError(b, err)
	applyOwned(b, dyn, admission.PolicyGVR, policies.Guard)
	applyOwned(b, dyn, admission.BindingGVR, policies.GuardBinding)
	applyOwned(b, dyn, admission.PolicyGVR, policies.Delete)
	applyOwned(b, dyn, admission.BindingGVR, policies.DeleteBinding)
	return func() {
		_ = dyn.Resource(admission.BindingGVR).Delete(ctx, policies.DeleteBinding.Name, metav1.DeleteOptions{})
	}, string(free.UID)
}

// applyOwned applies obj as nodeguard does (server-side apply, its field
// manager).
func applyOwned(b *testing.B, dyn dynamic.Interface, gvr schema.GroupVersionResource, obj runtime.Object) {
	b.Helper()
	applied, err := kube.OwnedFrom(gvr, obj)
	require.NoError(b, err)
	_, err = kube.ApplyOwned(context.Background(), dyn, applied)
	require.NoError(b, err)
}
