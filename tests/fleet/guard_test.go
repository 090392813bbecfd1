package fleet

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	ngfleet "github.com/nodeguard/nodeguard/enforcer/fleet"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/internal/procstatus"
	"github.com/nodeguard/nodeguard/internal/testcluster"
	"github.com/nodeguard/nodeguard/internal/testpki"
)

var (
	guardClustersFlag = flag.Int("guard-clusters", 1000, "workload clusters the fleet reconciler guards (BenchmarkFleetGuard)")
	guardWindowFlag   = flag.Duration("guard-window", time.Minute, "how long nothing changes while the fleet reconciler's CPU and requests are counted")
	guardProofFlag    = flag.Duration("guard-proof-interval", ngfleet.DefaultProofInterval, "the fleet's proof interval; below the window, the window's CPU includes proofs")
	guardProbeFlag    = flag.Duration("guard-probe-interval", kube.DefaultProbeInterval, "how often each workload API server is health-checked")
	guardRecheckFlag  = flag.Duration("guard-recheck", kube.DefaultClusterRecheck, "how often each kubeconfig Secret is read again")
	guardApartFlag    = flag.Bool("guard-servers-apart", false, "run the simulated workload API servers in a child process, so the CPU, heap and RSS measured are nodeguard's alone")
)

// farmEnv, set to a number of clusters, makes the test binary a farm of
// that many simulated workload API servers (serveFarm) instead of a test.
const farmEnv = "NODEGUARD_FLEET_FARM"

func TestMain(m *testing.M) {
	if n, err := strconv.Atoi(os.Getenv(farmEnv)); err == nil {
		serveFarm(n)
		return
	}
	os.Exit(m.Run())
}

// farmServer is one server of a farm, as the farm announces it, with the
// certificate that verifies it (PEM).
type farmServer struct {
	Cluster, URL string
	CA           []byte
}

// farmCounts are a farm's request counts (guardFleet.requests).
type farmCounts struct {
	All, Proofs, Health int64
}

// serveFarm runs n guardServers, prints the URL of its counts, then one
// farmServer a line, and serves until its standard input closes (the
// benchmark that started it ended).
func serveFarm(n int) {
	servers := make([]*guardServer, 0, n)
	for i := range n {
		servers = append(servers, newGuardServer(fmt.Sprintf("fleet/prod-%04d", i)))
	}
	counts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		var c farmCounts
		for _, s := range servers {
			c.All += s.total()
			c.Proofs += s.requests["proof"].Load()
			c.Health += s.requests["health"].Load()
		}
		writeJSON(w, http.StatusOK, c)
	}))
	out := json.NewEncoder(os.Stdout)
	_ = out.Encode(counts.URL)
	for _, s := range servers {
		_ = out.Encode(farmServer{Cluster: s.cluster, URL: s.srv.URL, CA: s.caPEM()})
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// startFarm starts a farm of n servers in a child process and returns
// their URLs by cluster and the URL of their counts.
func startFarm(t testing.TB, n int) (map[string]farmServer, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", farmEnv, n))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	in := json.NewDecoder(stdout)
	var counts string
	require.NoError(t, in.Decode(&counts))
	servers := map[string]farmServer{}
	for range n {
		var s farmServer
		require.NoError(t, in.Decode(&s))
		servers[s.Cluster] = s
	}
	return servers, counts
}

const vwcPath = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"

// guardServer is a simulated workload API server for the fleet reconciler:
// it stores nodeguard's one ValidatingWebhookConfiguration (apply, update,
// delete, list and watch with a field selector, JSON), serves one Node, and
// answers a dry-run Node delete as an API server whose webhook reached
// nodeguard's route does: with the route's warning, when the stored
// configuration points there. It is a stand-in: nodeguard's review itself
// is measured elsewhere (docs/performance.md).
type guardServer struct {
	srv     *httptest.Server
	cluster string

	requests map[string]*atomic.Int64 // vwc-read, vwc-write, watch, proof

	mu       sync.Mutex
	vwc      map[string]any // nil: none
	rv       int
	watchers map[chan []byte]bool
}

func newGuardServer(cluster string) *guardServer {
	s := &guardServer{cluster: cluster, requests: map[string]*atomic.Int64{}, watchers: map[chan []byte]bool{}}
	for _, k := range []string{"vwc-read", "vwc-write", "watch", "proof", "identity", "health", "other"} {
		s.requests[k] = &atomic.Int64{}
	}
	// HTTPS and HTTP/2, as a kube-apiserver serves: each connection is kept
	// and multiplexed, so a health check costs what it costs a real fleet.
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	s.srv.EnableHTTP2 = true
	s.srv.StartTLS()
	return s
}

func (s *guardServer) serve(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	switch {
	case r.URL.Path == vwcPath && q.Get("watch") == "true":
		s.requests["watch"].Add(1)
		s.watch(w, r)
	case r.URL.Path == vwcPath && r.Method == http.MethodGet:
		s.requests["vwc-read"].Add(1)
		s.mu.Lock()
		list := map[string]any{"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfigurationList",
			"metadata": map[string]any{"resourceVersion": strconv.Itoa(s.rv)}, "items": s.items()}
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, list)
	case strings.HasPrefix(r.URL.Path, vwcPath+"/"):
		s.config(w, r)
	case r.URL.Path == "/api/v1/nodes" && r.Method == http.MethodGet:
		s.requests["proof"].Add(1)
		writeJSON(w, http.StatusOK, map[string]any{"apiVersion": "v1", "kind": "NodeList", "metadata": map[string]any{"resourceVersion": "1"},
			"items": []any{map[string]any{"metadata": map[string]any{"name": strings.ReplaceAll(s.cluster, "/", "-") + "-node", "uid": "u-1"}}}})
	case strings.HasPrefix(r.URL.Path, "/api/v1/nodes/") && r.Method == http.MethodDelete:
		s.requests["proof"].Add(1)
		s.mu.Lock()
		url := ""
		if s.vwc != nil {
			hooks, _ := s.vwc["webhooks"].([]any)
			if len(hooks) == 1 {
				url, _ = hooks[0].(map[string]any)["clientConfig"].(map[string]any)["url"].(string)
			}
		}
		s.mu.Unlock()
		if strings.HasSuffix(url, "/validate/clusters/"+s.cluster) {
			w.Header().Add("Warning", `299 - "`+admission.DryRunWarning(s.cluster)+`"`)
		}
		writeJSON(w, http.StatusOK, map[string]any{"apiVersion": "v1", "kind": "Status", "status": "Success"})
	case serveIdentity(w, r, s.cluster):
		s.requests["identity"].Add(1)
	case r.URL.Path == "/readyz":
		s.requests["health"].Add(1)
		_, _ = w.Write([]byte("ok"))
	default:
		s.requests["other"].Add(1)
		http.Error(w, "not served here", http.StatusNotFound)
	}
}

// caPEM is the certificate the server serves, which verifies it.
func (s *guardServer) caPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.srv.Certificate().Raw})
}

func (s *guardServer) items() []any {
	if s.vwc == nil {
		return []any{}
	}
	return []any{s.vwc}
}

func (s *guardServer) config(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
		s.requests["vwc-read"].Add(1)
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.vwc == nil {
			writeJSON(w, http.StatusNotFound, map[string]any{"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404})
			return
		}
		writeJSON(w, http.StatusOK, s.vwc)
	case http.MethodPatch, http.MethodPut:
		s.requests["vwc-write"].Add(1)
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var obj map[string]any
		if err := json.Unmarshal(body, &obj); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		s.rv++
		meta, _ := obj["metadata"].(map[string]any)
		meta["resourceVersion"], meta["uid"] = strconv.Itoa(s.rv), "uid-"+s.cluster
		s.vwc = obj
		event := mustJSON(map[string]any{"type": "MODIFIED", "object": obj})
		for ch := range s.watchers {
			ch <- event
		}
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, obj)
	default:
		s.requests["other"].Add(1)
		http.Error(w, "not served here", http.StatusMethodNotAllowed)
	}
}

func (s *guardServer) watch(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	flusher := w.(http.Flusher)
	events := make(chan []byte, 16)
	s.mu.Lock()
	if r.URL.Query().Get("sendInitialEvents") == "true" {
		for _, item := range s.items() {
			_, _ = w.Write(mustJSON(map[string]any{"type": "ADDED", "object": item}))
		}
		_, _ = w.Write(mustJSON(map[string]any{"type": "BOOKMARK", "object": map[string]any{"apiVersion": "admissionregistration.k8s.io/v1",
			"kind": "ValidatingWebhookConfiguration", "metadata": map[string]any{"resourceVersion": strconv.Itoa(s.rv),
				"annotations": map[string]any{metav1.InitialEventsAnnotationKey: "true"}}}}))
	}
	s.watchers[events] = true
	s.mu.Unlock()
	flusher.Flush()
	defer func() {
		s.mu.Lock()
		delete(s.watchers, events)
		s.mu.Unlock()
	}()
	for {
		select {
		case <-r.Context().Done():
			return
		case raw := <-events:
			_, _ = w.Write(raw)
			flusher.Flush()
		}
	}
}

func (s *guardServer) total() int64 {
	var n int64
	for _, c := range s.requests {
		n += c.Load()
	}
	return n
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(mustJSON(v))
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return append(b, '\n')
}

// guardFleet is n simulated workload clusters and the fleet reconciler over
// them, on a fake management cluster.
type guardFleet struct {
	servers map[string]*guardServer
	// farm, when the servers run apart (startFarm), is the URL of their
	// request counts.
	farm string
	r    *ngfleet.Reconciler
	// guards counts the ClusterGuard requests of the fleet's status writer
	// to the (fake) management cluster.
	guards *guardWrites
}

// guardWrites stands in for the management API server's ClusterGuards: it
// counts the status writer's requests and remembers which objects exist.
type guardWrites struct {
	requests atomic.Int64
	mu       sync.Mutex
	exists   map[string]bool
}

func (g *guardWrites) client() *dynamicfake.FakeDynamicClient {
	c := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(k8sruntime.NewScheme(),
		map[schema.GroupVersionResource]string{ngfleet.ClusterGuards: ngfleet.ClusterGuardKind + "List"})
	c.PrependReactor("*", "clusterguards", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		g.requests.Add(1)
		p, ok := a.(k8stesting.PatchAction)
		if !ok {
			return true, nil, fmt.Errorf("unexpected %s", a.GetVerb())
		}
		key := p.GetNamespace() + "/" + p.GetName()
		g.mu.Lock()
		defer g.mu.Unlock()
		if p.GetSubresource() == "status" && !g.exists[key] {
			return true, nil, apierrors.NewNotFound(ngfleet.ClusterGuards.GroupResource(), p.GetName())
		}
		g.exists[key] = true
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(p.GetPatch()); err != nil {
			return true, nil, err
		}
		return true, obj, nil
	})
	return c
}

func startGuardFleet(t testing.TB, ctx context.Context, n int) *guardFleet {
	t.Helper()
	secrets := fake.NewClientset()
	var objs []k8sruntime.Object
	f := &guardFleet{servers: map[string]*guardServer{}}
	var apart map[string]farmServer
	if *guardApartFlag {
		apart, f.farm = startFarm(t, n)
	}
	for i := range n {
		name := fmt.Sprintf("prod-%04d", i)
		at, ok := apart["fleet/"+name]
		if !ok {
			s := newGuardServer("fleet/" + name)
			t.Cleanup(s.srv.Close)
			f.servers["fleet/"+name] = s
			at = farmServer{URL: s.srv.URL, CA: s.caPEM()}
		}
		objs = append(objs, testcluster.Object(clusterGVK, "fleet", name, nil))
		_, err := secrets.CoreV1().Secrets("fleet").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "fleet", Name: name + "-kubeconfig"},
			Data: map[string][]byte{"value": testcluster.KubeconfigTLS(t, at.URL, at.CA)}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	dyn, mapper := testcluster.Serve([]testcluster.Kind{{GVK: clusterGVK, Resource: "clusters"}}, objs...)
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(caFile, testpki.CAPEM(t), 0o600))
	set, err := kube.NewClusterSet(kube.ClusterSetOptions{Management: kube.Clients{Dynamic: dyn, Mapper: mapper}, Secrets: secrets,
		ProbeInterval: *guardProbeFlag, Recheck: *guardRecheckFlag,
		Identity: &kube.IdentityOptions{Delete: true, Owns: admission.WebhookRules()},
		Start:    func(ctx context.Context, c *kube.Cluster) { f.r.Session(ctx, c) },
		Changed:  func(key string) { f.r.Changed(key) }})
	require.NoError(t, err)
	f.guards = &guardWrites{exists: map[string]bool{}}
	status := &ngfleet.Status{Client: f.guards.client(), Owner: set.Meta}
	f.r, err = ngfleet.New(ngfleet.Options{Clusters: set, URL: "https://nodeguard.example.com", CAFiles: []string{caFile}, ProofInterval: *guardProofFlag,
		Report: status.Report, Forgotten: status.Forget})
	require.NoError(t, err)
	go func() { _ = set.Run(ctx) }()
	go status.Run(ctx)
	go f.r.Run(ctx)
	return f
}

func (f *guardFleet) guarded() int {
	n := 0
	for _, s := range f.r.States() {
		if s.Guarded {
			n++
		}
	}
	return n
}

func (f *guardFleet) requests(t testing.TB) (all, proofs, health int64) {
	if f.farm != "" {
		resp, err := http.Get(f.farm)
		require.NoError(t, err)
		defer resp.Body.Close()
		var c farmCounts
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&c))
		return c.All, c.Proofs, c.Health
	}
	for _, s := range f.servers {
		all += s.total()
		proofs += s.requests["proof"].Load()
		health += s.requests["health"].Load()
	}
	return all, proofs, health
}

// The fleet reconciler at scale: N simulated workload API servers, from a
// cold start until every one is guarded and proven, then a window where
// nothing changes (docs/performance.md, "The fleet").
func BenchmarkFleetGuard(b *testing.B) {
	for range b.N {
		n := *guardClustersFlag
		ctx, cancel := context.WithCancel(context.Background())
		cpu0, start := cpu(b), time.Now()
		f := startGuardFleet(b, ctx, n)
		require.Eventually(b, func() bool { return f.guarded() == n }, 10*time.Minute, 100*time.Millisecond, "every cluster guarded")
		took, coldCPU := time.Since(start), cpu(b)-cpu0
		heapGuarded := heap()
		all0, proofs0, health0 := f.requests(b)
		guards0 := f.guards.requests.Load()
		cpu1 := cpu(b)
		time.Sleep(*guardWindowFlag) // time under test: the measured window, nothing changing
		idleCPU := cpu(b) - cpu1
		all1, proofs1, health1 := f.requests(b)
		guards1 := f.guards.requests.Load()
		perMin := float64(time.Minute) / float64(*guardWindowFlag)
		health := float64(health1-health0) * perMin / float64(n)
		other := float64((all1-all0)-(proofs1-proofs0)-(health1-health0)) * perMin / float64(n)
		b.ReportMetric(took.Seconds(), "s-to-guard-all")
		b.ReportMetric(float64(idleCPU)*perMin/float64(time.Second), "cpu-s/min-idle")
		b.ReportMetric(float64(heapGuarded)/(1<<20), "heap-MiB")
		b.ReportMetric(other, "req/cluster/min-besides-proofs-and-health")
		b.ReportMetric(health, "health-req/cluster/min")
		b.ReportMetric(float64(guards1-guards0)*perMin/float64(n), "clusterguard-req/cluster/min")
		b.Logf("ClusterGuard requests to the management cluster: %.2f a cluster until all were guarded (creation: a status apply finding none, the object, its status), %.3f a cluster a minute after",
			float64(guards0)/float64(n), float64(guards1-guards0)*perMin/float64(n))
		b.Logf("proof interval %s; %d clusters: all guarded and proven %s after a cold start (%s CPU); nothing changing: %s CPU/min, %.3f health checks/cluster/min, %.3f other requests/cluster/min besides the proofs (%d proofs in the %s window), heap %.0f MiB, RSS %.0f MiB (%s)",
			*guardProofFlag, n, took.Round(100*time.Millisecond), coldCPU.Round(10*time.Millisecond), time.Duration(float64(idleCPU)*perMin).Round(10*time.Millisecond),
			health, other, proofs1-proofs0, *guardWindowFlag, float64(heapGuarded)/(1<<20), rssMiB(b), servers(f))
		cancel()
	}
}

// A small fleet, as the benchmark runs it: every cluster guarded and
// proven, a configuration deleted there restored, nothing written while
// nothing changes.
func TestSmallFleetIsGuarded(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := startGuardFleet(t, ctx, 20)
	require.Eventually(t, func() bool { return f.guarded() == 20 }, time.Minute, 50*time.Millisecond)
	for _, st := range f.r.States() {
		assert.Equal(t, kube.Username, st.Identity, "%s: proven as nodeguard's own identity", st.Cluster)
	}
	// Each Cluster's ClusterGuard created once: a status apply finding
	// none, the object, its status.
	require.Eventually(t, func() bool { return f.guards.requests.Load() >= 3*20 }, 10*time.Second, 10*time.Millisecond)
	f.guards.mu.Lock()
	assert.Len(t, f.guards.exists, 20)
	f.guards.mu.Unlock()
	s := f.servers["fleet/prod-0007"]
	writes := s.requests["vwc-write"].Load()
	s.mu.Lock()
	s.vwc = nil
	s.rv++
	event := mustJSON(map[string]any{"type": "DELETED", "object": map[string]any{"apiVersion": "admissionregistration.k8s.io/v1",
		"kind": "ValidatingWebhookConfiguration", "metadata": map[string]any{"name": "nodeguard", "resourceVersion": strconv.Itoa(s.rv)}}})
	for ch := range s.watchers {
		ch <- event
	}
	s.mu.Unlock()
	require.Eventually(t, func() bool { return s.requests["vwc-write"].Load() > writes }, 10*time.Second, 10*time.Millisecond, "restored")
	s.mu.Lock()
	assert.NotNil(t, s.vwc)
	s.mu.Unlock()
}

// servers says where the figures' simulated servers ran.
func servers(f *guardFleet) string {
	if f.farm != "" {
		return "nodeguard alone: the simulated servers ran in a child process"
	}
	return "simulated servers included"
}

// rssMiB is the process's resident set.
func rssMiB(t testing.TB) float64 {
	kb, err := procstatus.KiB(os.Getpid(), "VmRSS")
	require.NoError(t, err)
	return float64(kb) / 1024
}
