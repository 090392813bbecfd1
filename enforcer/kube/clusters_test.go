package kube_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/internal/testcluster"
	"github.com/nodeguard/nodeguard/internal/testlog"
)

var (
	clusterGVK = testcluster.ClusterGVK
	clusterGVR = clusterGVK.GroupVersion().WithResource("clusters")
)

var (
	kubeconfig = testcluster.Kubeconfig
	closedPort = testcluster.ClosedPort
)

// management is a management cluster: Clusters through a fake dynamic
// client, kubeconfig Secrets through a fake typed one.
type management struct {
	dyn     dynamic.Interface
	secrets *fake.Clientset
	clients kube.Clients
}

func newManagement() *management {
	dyn, mapper := testcluster.Serve([]testcluster.Kind{{GVK: clusterGVK, Resource: "clusters"}})
	return &management{dyn: dyn, secrets: fake.NewClientset(), clients: kube.Clients{Dynamic: dyn, Mapper: mapper}}
}

func (m *management) cluster(t testing.TB, name string) {
	t.Helper()
	_, err := m.dyn.Resource(clusterGVR).Namespace("fleet").Create(context.Background(), testcluster.Object(clusterGVK, "fleet", name, nil), metav1.CreateOptions{})
	require.NoError(t, err)
}

func (m *management) deleteCluster(t testing.TB, name string) {
	t.Helper()
	require.NoError(t, m.dyn.Resource(clusterGVR).Namespace("fleet").Delete(context.Background(), name, metav1.DeleteOptions{}))
}

func (m *management) secret(t testing.TB, name string, value []byte) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "fleet", Name: name + "-kubeconfig"}, Data: map[string][]byte{"value": value}}
	_, err := m.secrets.CoreV1().Secrets("fleet").Update(context.Background(), s, metav1.UpdateOptions{})
	if err != nil {
		_, err = m.secrets.CoreV1().Secrets("fleet").Create(context.Background(), s, metav1.CreateOptions{})
	}
	require.NoError(t, err)
}

// sessions records what the Set starts and stops.
type sessions struct {
	mu      sync.Mutex
	running map[string]string // key -> server
	log     []string
}

func (s *sessions) start(ctx context.Context, c *kube.Cluster) {
	s.mu.Lock()
	s.running[c.Key] = c.Config.Host
	s.log = append(s.log, "start "+c.Key+" "+c.Config.Host)
	s.mu.Unlock()
	<-ctx.Done()
	s.mu.Lock()
	delete(s.running, c.Key)
	s.log = append(s.log, "stop "+c.Key)
	s.mu.Unlock()
}

func (s *sessions) server(key string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running[key]
}

func run(t *testing.T, set *kube.ClusterSet) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- set.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

// seriesOf counts the series of reg labelled with cluster.
func seriesOf(t *testing.T, reg *prometheus.Registry, cluster string) int {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	n := 0
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "cluster" && l.GetValue() == cluster {
					n++
				}
			}
		}
	}
	return n
}

func TestSessionsFollowClustersAndTheirSecrets(t *testing.T) {
	m := newManagement()
	var failing atomic.Bool
	m.secrets.PrependReactor("get", "secrets", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
		if failing.Load() {
			return true, nil, apierrors.NewInternalError(errors.New("etcd is away"))
		}
		return false, nil, nil
	})
	s := &sessions{running: map[string]string{}}
	reg := prometheus.NewRegistry()
	metrics, err := kube.NewClusterMetrics(reg)
	require.NoError(t, err)
	logs := &testlog.Buffer{}
	set, err := kube.NewClusterSet(kube.ClusterSetOptions{Management: m.clients, Secrets: m.secrets, Recheck: 100 * time.Millisecond, ProbeTimeout: 100 * time.Millisecond,
		Start: s.start, Metrics: metrics, Log: slog.New(slog.NewJSONHandler(logs, nil))})
	require.NoError(t, err)
	run(t, set)

	m.secret(t, "prod-1", kubeconfig(t, "https://prod-1.example:6443"))
	m.cluster(t, "prod-1")
	require.Eventually(t, func() bool { return s.server("fleet/prod-1") == "https://prod-1.example:6443" }, 5*time.Second, 10*time.Millisecond)
	c, ok := set.Get("fleet/prod-1")
	require.True(t, ok)
	assert.NotNil(t, c.Kube)
	assert.NotNil(t, c.Dynamic)
	assert.Equal(t, []string{"fleet/prod-1"}, set.Keys())

	// A Cluster whose Secret is not there yet: counted, logged, retried.
	m.cluster(t, "prod-2")
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(metrics.Errors().WithLabelValues("fleet/prod-2", "kubeconfig")) >= 2
	}, 5*time.Second, 10*time.Millisecond)
	assert.Contains(t, logs.String(), `read the kubeconfig of Cluster fleet/prod-2: secrets \"prod-2-kubeconfig\" not found`)
	m.secret(t, "prod-2", kubeconfig(t, "https://prod-2.example:6443"))
	require.Eventually(t, func() bool { return s.server("fleet/prod-2") != "" }, 5*time.Second, 10*time.Millisecond)

	// A rotated kubeconfig: the session is replaced.
	m.secret(t, "prod-1", kubeconfig(t, "https://prod-1-new.example:6443"))
	require.Eventually(t, func() bool { return s.server("fleet/prod-1") == "https://prod-1-new.example:6443" }, 5*time.Second, 10*time.Millisecond)

	// A deleted Cluster: its session stops, its series go.
	m.deleteCluster(t, "prod-2")
	require.Eventually(t, func() bool { return s.server("fleet/prod-2") == "" }, 5*time.Second, 10*time.Millisecond)
	_, ok = set.Get("fleet/prod-2")
	assert.False(t, ok)
	require.Eventually(t, func() bool {
		return seriesOf(t, reg, "fleet/prod-2") == 0
	}, 5*time.Second, 10*time.Millisecond)

	// The management API server fails to answer: the session, built from a
	// kubeconfig that worked, keeps running.
	failing.Store(true)
	before := testutil.ToFloat64(metrics.Errors().WithLabelValues("fleet/prod-1", "kubeconfig"))
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(metrics.Errors().WithLabelValues("fleet/prod-1", "kubeconfig")) > before
	}, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, "https://prod-1-new.example:6443", s.server("fleet/prod-1"))
	failing.Store(false)

	// A deleted Secret: the session stops until it is back.
	require.NoError(t, m.secrets.CoreV1().Secrets("fleet").Delete(context.Background(), "prod-1-kubeconfig", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool { return s.server("fleet/prod-1") == "" }, 5*time.Second, 10*time.Millisecond)

	s.mu.Lock()
	defer s.mu.Unlock()
	assert.Equal(t, []string{
		"start fleet/prod-1 https://prod-1.example:6443",
		"start fleet/prod-2 https://prod-2.example:6443",
		"stop fleet/prod-1",
		"start fleet/prod-1 https://prod-1-new.example:6443",
		"stop fleet/prod-2",
		"stop fleet/prod-1",
	}, s.log)
}

// An unreachable workload cluster costs client-go's bounded retries and a
// count per failure; it leaves no goroutine and no memory behind once its
// Cluster goes, however often that happens.
func TestAnUnreachableClusterLeaksNothing(t *testing.T) {
	m := newManagement()
	eval, err := rule.NewEngine(context.Background())
	require.NoError(t, err)
	shape, err := facts.NodeShapeOf(eval)
	require.NoError(t, err)
	var mu sync.Mutex
	failures := map[string]int{}
	watching := map[string]bool{}
	set, err := kube.NewClusterSet(kube.ClusterSetOptions{Management: m.clients, Secrets: m.secrets, Recheck: time.Minute,
		Start: func(ctx context.Context, c *kube.Cluster) {
			w, err := facts.NewNodeWatch(facts.NodeWatchOptions{Shape: shape, Kube: c.Kube, OnError: func(error) {
				mu.Lock()
				failures[c.Key]++
				mu.Unlock()
			}})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			watching[c.Key] = true
			mu.Unlock()
			w.Run(ctx)
			mu.Lock()
			watching[c.Key] = false
			mu.Unlock()
		}})
	require.NoError(t, err)
	run(t, set)
	count := func(key string) (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		return failures[key], watching[key]
	}
	cycle := func(i int) {
		name := fmt.Sprintf("gone-%d", i)
		m.secret(t, name, kubeconfig(t, closedPort(t)))
		m.cluster(t, name)
		require.Eventually(t, func() bool { n, _ := count("fleet/" + name); return n >= 1 }, 10*time.Second, 10*time.Millisecond,
			"the failed list is reported")
		m.deleteCluster(t, name)
		require.Eventually(t, func() bool { _, on := count("fleet/" + name); return !on }, 10*time.Second, 10*time.Millisecond)
	}
	cycle(0) // warms up what is started once per process (client-go's caches)
	runtime.GC()
	baseline := runtime.NumGoroutine()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	const cycles = 20
	for i := 1; i <= cycles; i++ {
		cycle(i)
	}
	// Nothing of the twenty sessions is left running. (Polled with wait,
	// which runs its condition on this goroutine, not with assert.Eventually,
	// which starts goroutines of its own; the assertion below reports a
	// timeout.)
	_ = wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) { return runtime.NumGoroutine() <= baseline, nil })
	if !assert.LessOrEqual(t, runtime.NumGoroutine(), baseline, "goroutines left running") {
		var b bytes.Buffer
		_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
		t.Log(b.String())
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap after %d sessions against an unreachable API server: %+d bytes", cycles, grown)
	assert.Less(t, grown, int64(1<<20), "a session leaves no memory behind")
	for i := 1; i <= cycles; i++ {
		n, _ := count(fmt.Sprintf("fleet/gone-%d", i))
		assert.LessOrEqual(t, n, 5, "client-go backs off between attempts")
	}
}

// Without Cluster API's Cluster resource, the Set waits for it (logged
// once) instead of giving up: Cluster API may be installed later.
func TestWaitsForTheClusterResource(t *testing.T) {
	dyn, mapper := testcluster.Serve(nil)
	logs := &testlog.Buffer{}
	set, err := kube.NewClusterSet(kube.ClusterSetOptions{Management: kube.Clients{Dynamic: dyn, Mapper: mapper}, Secrets: fake.NewClientset(),
		Start: func(context.Context, *kube.Cluster) {}, Log: slog.New(slog.NewJSONHandler(logs, nil))})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err = set.Run(ctx)
	assert.ErrorContains(t, err, "find the Cluster resource")
	assert.Equal(t, 1, strings.Count(logs.String(), "the Cluster resource is not served"))
}

// The one way from a kubeconfig Secret to a REST config: a missing Secret
// is NotFound, one without a kubeconfig, one that does not parse, or a
// key without a namespace is an error that says which.
func TestConnectReadsTheKubeconfigSecret(t *testing.T) {
	ctx := context.Background()
	m := newManagement()
	_, err := kube.ConnectCluster(ctx, m.secrets, "fleet/prod-1")
	assert.True(t, apierrors.IsNotFound(err), "%v", err)
	m.secret(t, "prod-1", kubeconfig(t, "https://a.example:6443"))
	cfg, err := kube.ConnectCluster(ctx, m.secrets, "fleet/prod-1")
	require.NoError(t, err)
	assert.Equal(t, "https://a.example:6443", cfg.Host)
	m.secret(t, "prod-1", nil)
	_, err = kube.ConnectCluster(ctx, m.secrets, "fleet/prod-1")
	assert.ErrorContains(t, err, `Secret fleet/prod-1-kubeconfig has no key "value"`)
	m.secret(t, "prod-1", []byte("{not yaml"))
	_, err = kube.ConnectCluster(ctx, m.secrets, "fleet/prod-1")
	assert.ErrorContains(t, err, "kubeconfig of Cluster fleet/prod-1 (Secret fleet/prod-1-kubeconfig)")
	_, err = kube.ConnectCluster(ctx, m.secrets, "prod-1")
	assert.ErrorContains(t, err, "want NAMESPACE/NAME")
}

// readyz is a workload API server's /readyz that can be made to fail, and
// counts what it is asked.
type readyz struct {
	srv    *httptest.Server
	down   atomic.Bool
	probes atomic.Int64
	other  atomic.Int64
}

func newReadyz(t *testing.T) *readyz {
	r := &readyz{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if r.down.Load() {
			// As an API server that is shutting down: no answer at all.
			if hj, ok := w.(http.Hijacker); ok {
				conn, _, err := hj.Hijack()
				if err == nil {
					_ = conn.Close()
				}
			}
			return
		}
		if req.URL.Path == "/readyz" {
			r.probes.Add(1)
			_, _ = w.Write([]byte("ok"))
			return
		}
		r.other.Add(1)
		http.Error(w, "not served here", http.StatusNotFound)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// A connection is probed when it starts and then on its schedule; an API
// server that stops answering is reported unreachable at the next probe, or
// at once when a request through the connection fails, and reachable again
// once it answers; whoever depends on it is told each time.
func TestHealthIsCheckedAndTold(t *testing.T) {
	m := newManagement()
	api := newReadyz(t)
	changed := make(chan string, 100)
	sessions := make(chan *kube.Cluster, 1)
	reg := prometheus.NewRegistry()
	metrics, err := kube.NewClusterMetrics(reg)
	require.NoError(t, err)
	set, err := kube.NewClusterSet(kube.ClusterSetOptions{Management: m.clients, Secrets: m.secrets, Recheck: time.Hour,
		ProbeInterval: time.Hour, UnreachableProbeInterval: 200 * time.Millisecond, ProbeTimeout: time.Second, Metrics: metrics,
		Start: func(ctx context.Context, c *kube.Cluster) {
			sessions <- c
			<-ctx.Done()
		},
		Changed: func(key string) { changed <- key }})
	require.NoError(t, err)
	run(t, set)
	m.secret(t, "prod-1", kubeconfig(t, api.srv.URL))
	m.cluster(t, "prod-1")
	session := <-sessions
	require.Eventually(t, func() bool { h := set.Health("fleet/prod-1"); return h.Checked && h.Reachable }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, int64(1), api.probes.Load(), "probed once when connected")
	assert.Equal(t, 1.0, testutil.ToFloat64(metrics.HealthChecks().WithLabelValues("ok")))

	// A request of the session fails: probed at once (the schedule says an
	// hour), unreachable, told.
	for len(changed) > 0 {
		<-changed
	}
	api.down.Store(true)
	_, err = session.Kube.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	require.Error(t, err)
	select {
	case key := <-changed:
		assert.Equal(t, "fleet/prod-1", key)
	case <-time.After(5 * time.Second):
		t.Fatal("not told the cluster became unreachable")
	}
	h := set.Health("fleet/prod-1")
	assert.True(t, h.Checked)
	assert.False(t, h.Reachable)
	assert.ErrorContains(t, h.Err, "GET /readyz")

	// It answers again: seen at the next probe of an unreachable cluster.
	api.down.Store(false)
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("not told the cluster is reachable again")
	}
	assert.True(t, set.Health("fleet/prod-1").Reachable)
	// Then probed on its (hourly) schedule only: nothing more is asked.
	probes := api.probes.Load()
	require.Never(t, func() bool { return api.probes.Load() > probes }, 500*time.Millisecond, 20*time.Millisecond)
}

// A failure that turns into another is a change its watchers are told of:
// the fleet reports a Cluster whose Secret was missing as unreachable once
// the Secret points at an API server that does not answer.
func TestChangedWhenTheFailureChanges(t *testing.T) {
	m := newManagement()
	changed := make(chan string, 100)
	set, err := kube.NewClusterSet(kube.ClusterSetOptions{Management: m.clients, Secrets: m.secrets, Recheck: time.Hour,
		Identity: &kube.IdentityOptions{}, Start: func(ctx context.Context, _ *kube.Cluster) { <-ctx.Done() },
		Changed: func(key string) { changed <- key }})
	require.NoError(t, err)
	run(t, set)
	failure := func() string {
		if err := set.Failure("fleet/prod-1"); err != nil {
			return err.Error()
		}
		return ""
	}
	m.cluster(t, "prod-1")
	require.Eventually(t, func() bool { return strings.Contains(failure(), "not found") }, 5*time.Second, 10*time.Millisecond)
	for len(changed) > 0 {
		<-changed
	}
	m.secret(t, "prod-1", kubeconfig(t, closedPort(t)))
	select {
	case key := <-changed:
		assert.Equal(t, "fleet/prod-1", key)
		assert.Contains(t, failure(), "connection refused")
	case <-time.After(10 * time.Second):
		t.Fatalf("not told of the new failure: %s", failure())
	}
}

// Await rides out a young failure (CAPI writes a Cluster's kubeconfig Secret
// after the Cluster) and returns the connection once there is one; a failure
// that has lasted the wait is returned at once.
func TestAwaitWaitsOutAYoungFailureOnly(t *testing.T) {
	m := newManagement()
	set, err := kube.NewClusterSet(kube.ClusterSetOptions{Management: m.clients, Secrets: m.secrets, Recheck: time.Hour,
		Start: func(ctx context.Context, _ *kube.Cluster) { <-ctx.Done() }})
	require.NoError(t, err)
	run(t, set)
	ctx := context.Background()

	m.cluster(t, "prod-1")
	require.Eventually(t, func() bool { return set.Failure("fleet/prod-1") != nil }, 5*time.Second, 10*time.Millisecond)
	go func() {
		time.Sleep(200 * time.Millisecond)
		m.secret(t, "prod-1", kubeconfig(t, "https://prod-1.example:6443"))
	}()
	c, err := set.Await(ctx, "fleet/prod-1", 10*time.Second)
	require.NoError(t, err, "the retry after the Secret came connects")
	assert.Equal(t, "fleet/prod-1", c.Key)

	m.cluster(t, "prod-2")
	require.Eventually(t, func() bool { return set.Failure("fleet/prod-2") != nil }, 5*time.Second, 10*time.Millisecond)
	_, err = set.Await(ctx, "fleet/prod-2", 300*time.Millisecond)
	require.ErrorContains(t, err, "not found", "the wait ends with the failure")
	start := time.Now()
	_, err = set.Await(ctx, "fleet/prod-2", 300*time.Millisecond)
	require.ErrorContains(t, err, "not found")
	assert.Less(t, time.Since(start), 250*time.Millisecond, "a failure older than the wait does not wait again")
}
