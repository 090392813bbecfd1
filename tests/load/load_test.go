// Package load drives `nodeguard serve`'s handler over real TLS on loopback
// with many concurrent AdmissionReviews, and reports decisions per second and
// latency percentiles: from the cache alone (BenchmarkWebhook) and on the
// live path with fresh reads against a real API server
// (BenchmarkWebhookFresh). Run with `make load`; the client shares the
// machine's cores with the server, so the figure is a floor for the server
// alone.
package load

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/enforcer/serve"
	"github.com/nodeguard/nodeguard/internal/localcluster"
	"github.com/nodeguard/nodeguard/internal/testcluster"
	"github.com/nodeguard/nodeguard/internal/testpki"
)

var (
	machines    = flag.Int("machines", 10000, "Machines in the cache, each with its DockerMachine")
	parallelism = flag.Int("parallelism", 8, "concurrent clients per core (b.SetParallelism)")
)

var (
	machineGVK = schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "Machine"}
	dockerGVK  = schema.GroupVersionKind{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Kind: "DockerMachine"}
)

// fleet caches n CAPD Machines and DockerMachines and returns one DELETE
// review per Node, so requests spread over the inventory.
func fleet(b *testing.B, n int) (*facts.Inventory, [][]byte) {
	inv := facts.NewInventory(rule.MustEmbeddedModel())
	ms, ds := inv.NewStore(facts.Machine), inv.NewStore(facts.InfraMachine)
	inv.AddKind(machineGVK, facts.Machine, ms)
	inv.AddKind(dockerGVK, facts.InfraMachine, ds)
	add := func(store interface{ Add(any) error }, gvk schema.GroupVersionKind, obj map[string]any) {
		role := facts.InfraMachine
		if gvk == machineGVK {
			role = facts.Machine
		}
		r, err := inv.Transform(role)(unstructuredOf(obj))
		require.NoError(b, err)
		require.NoError(b, store.Add(r))
	}
	reviews := make([][]byte, 0, n)
	for i := range n {
		ns, name := fmt.Sprintf("team-%d", i%10), fmt.Sprintf("md-0-%06d", i)
		pid := "docker:////" + name
		add(ms, machineGVK, map[string]any{
			"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
			"metadata": map[string]any{"namespace": ns, "name": name, "labels": map[string]any{"cluster.x-k8s.io/cluster-name": ns}},
			"spec": map[string]any{"clusterName": ns, "providerID": pid,
				"infrastructureRef": map[string]any{"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": name}},
			"status": map[string]any{"nodeRef": map[string]any{"name": name}},
		})
		add(ds, dockerGVK, map[string]any{
			"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "DockerMachine",
			"metadata": map[string]any{"namespace": ns, "name": name, "labels": map[string]any{"cluster.x-k8s.io/cluster-name": ns}},
			"spec":     map[string]any{"providerID": pid},
		})
		node, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Node",
			"metadata": map[string]any{"name": name, "annotations": map[string]any{
				"cluster.x-k8s.io/cluster-namespace": ns, "cluster.x-k8s.io/machine": name}},
			"spec": map[string]any{"providerID": pid}})
		body, _ := json.Marshal(map[string]any{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
			"request": map[string]any{"uid": fmt.Sprintf("uid-%d", i), "operation": "DELETE", "name": name,
				"kind": map[string]any{"group": "", "version": "v1", "kind": "Node"}, "oldObject": json.RawMessage(node),
				"userInfo": map[string]any{"username": "kubernetes-admin", "groups": []string{"system:masters"}}}})
		reviews = append(reviews, body)
	}
	return inv, reviews
}

func TestMain(m *testing.M) {
	// envtest logs through controller-runtime; without a logger it says so
	// in the middle of the benchmark's output.
	ctrllog.SetLogger(logr.Discard())
	os.Exit(m.Run())
}

func BenchmarkWebhook(b *testing.B) {
	inv, reviews := fleet(b, *machines)
	g, err := guard.New(context.Background(), inv, guard.Options{Engine: testcluster.Engine(b)})
	require.NoError(b, err)
	ca := testpki.New(b)
	url, _ := ca.Serve(b, admission.NewWebhook(admission.WebhookOptions{Decider: g}), admission.TLSOptions{})
	client := &http.Client{Transport: &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12},
		MaxIdleConnsPerHost: 1024,
	}}
	ask := reviewer(client, url)
	drive(b, reviews, func(body []byte) error {
		out, err := ask(body)
		if err != nil || out == nil || out.Allowed {
			return fmt.Errorf("every Node here has its DockerMachine: want a denial, got %+v (%v)", out, err)
		}
		return nil
	})
}

// reviewer posts an AdmissionReview to base's /validate and returns the
// response.
func reviewer(client *http.Client, base string) func(body []byte) (*admissionv1.AdmissionResponse, error) {
	return func(body []byte) (*admissionv1.AdmissionResponse, error) {
		return testpki.Ask(client, base+"/validate", body)
	}
}

// drive sends the reviews in turn from b's parallel clients, timing each
// one with send (which fails on a wrong answer), and reports decisions/s,
// p50 and p99.
func drive(b *testing.B, reviews [][]byte, send func(body []byte) error) {
	var (
		mu        sync.Mutex
		latencies []time.Duration
		next      atomic.Int64
	)
	b.SetParallelism(*parallelism)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		for pb.Next() {
			body := reviews[int(next.Add(1))%len(reviews)]
			t0 := time.Now()
			err := send(body)
			mine = append(mine, time.Since(t0))
			if err != nil {
				b.Error(err)
				return
			}
		}
		mu.Lock()
		latencies = append(latencies, mine...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(latencies)
	b.ReportMetric(float64(len(latencies))/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(float64(latencies[len(latencies)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(latencies[len(latencies)*99/100].Microseconds()), "p99-µs")
}

func unstructuredOf(obj map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: obj}
}

var (
	binDir       = flag.String("bin", os.Getenv("NODEGUARD_E2E_BIN"), "directory with kube-apiserver and etcd, for BenchmarkWebhookFresh (tests/e2e/tools/build.sh prints it)")
	freshNodes   = flag.Int("fresh-nodes", 100, "CAPD Machines (Node, Machine, DockerMachine) on the API server for BenchmarkWebhookFresh")
	kubeAPIQPS   = flag.Float64("kube-api-qps", float64(kube.DefaultQPS), "nodeguard's client rate limit in BenchmarkWebhookFresh")
	kubeAPIBurst = flag.Int("kube-api-burst", kube.DefaultBurst, "nodeguard's client burst in BenchmarkWebhookFresh")
)

// BenchmarkWebhookFresh is the live path: `nodeguard serve` with informers
// and fresh reads against a real kube-apiserver and etcd on loopback, at the
// client rate limits it ships. Every review re-reads the Node's Machine and
// DockerMachine, so throughput is bound by those GETs (and by
// --kube-api-qps), not by the rule.
func BenchmarkWebhookFresh(b *testing.B) {
	if *binDir == "" {
		b.Skip("no kube-apiserver/etcd: set NODEGUARD_E2E_BIN or -bin (make load builds them with tests/e2e/tools/build.sh)")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env, err := localcluster.Environment(*binDir, b.TempDir(), localcluster.Current())
	require.NoError(b, err)
	env.ControlPlane.Etcd = &envtest.Etcd{}
	_, err = env.Start()
	require.NoError(b, err)
	defer func() { _ = env.Stop() }()
	admin := localcluster.Config(env) // envtest's 1000/s: the fixture, not the subject
	dyn, err := dynamic.NewForConfig(admin)
	require.NoError(b, err)
	names := make([]string, *freshNodes)
	for i := range names {
		names[i] = fmt.Sprintf("md-0-%04d", i)
		require.NoError(b, localcluster.Current().CAPDMachine(ctx, dyn, names[i], false))
	}
	cfg := rest.CopyConfig(admin)
	cfg.QPS, cfg.Burst = float32(*kubeAPIQPS), *kubeAPIBurst
	clients, err := kube.FromConfig(cfg)
	require.NoError(b, err)
	ca := testpki.New(b)
	cert, key := ca.ServerFiles(b, "load")
	url, stop, err := localcluster.Serve(ctx, clients, serve.Options{Listen: "127.0.0.1:0", CertFile: cert, KeyFile: key},
		slog.New(slog.DiscardHandler))
	require.NoError(b, err)
	defer stop()
	client := &http.Client{Transport: &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12},
		MaxIdleConnsPerHost: 1024,
	}}
	reviews := make([][]byte, len(names))
	for i, name := range names {
		reviews[i] = nodeReview(i, "default", name)
	}
	ask := reviewer(client, url)
	// Ready: the first Node's delete is denied for its DockerMachine.
	require.Eventually(b, func() bool {
		out, err := ask(reviews[0])
		return err == nil && out != nil && !out.Allowed && strings.Contains(out.Result.Message, "DockerMachine default/"+names[0])
	}, 30*time.Second, 100*time.Millisecond, "nodeguard never became ready")
	// Let the rate limiter's bucket refill after the readiness polls (burst
	// over QPS: 2 s at the defaults); nothing announces it.
	time.Sleep(2 * time.Second) // time under test: load pacing, the measured run starts with a full client bucket

	drive(b, reviews, func(body []byte) error {
		out, err := ask(body)
		if err != nil || out == nil || out.Allowed || !strings.Contains(out.Result.Message, "DockerMachine") {
			return fmt.Errorf("every Node here has its DockerMachine: want a denial naming it, got %+v (%v)", out, err)
		}
		return nil
	})
}

// nodeReview is the API server's review of deleting CAPD Node name.
func nodeReview(i int, ns, name string) []byte {
	node, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": name, "annotations": map[string]any{
			"cluster.x-k8s.io/cluster-namespace": ns, "cluster.x-k8s.io/machine": name}},
		"spec": map[string]any{"providerID": "docker:////" + name}})
	body, _ := json.Marshal(map[string]any{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
		"request": map[string]any{"uid": fmt.Sprintf("uid-%d", i), "operation": "DELETE", "name": name,
			"kind": map[string]any{"group": "", "version": "v1", "kind": "Node"}, "oldObject": json.RawMessage(node),
			"userInfo": map[string]any{"username": "kubernetes-admin", "groups": []string{"system:masters"}}}})
	return body
}
