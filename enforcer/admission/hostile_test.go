package admission_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"

	"bufio"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/internal/hostile"
	"github.com/nodeguard/nodeguard/internal/stacks"
	"github.com/nodeguard/nodeguard/internal/testlog"
	"github.com/nodeguard/nodeguard/internal/testpki"
)

// arrivals counts requests reaching the handler, so a test can wait until
// concurrent reviews are all inside before letting a decision finish.
type arrivals struct {
	next http.Handler
	n    atomic.Int64
}

func (a *arrivals) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.n.Add(1)
	a.next.ServeHTTP(w, r)
}

// post sends body and returns the answer; safe from many goroutines.
func (s *server) answer(path string, body []byte) (*admissionv1.AdmissionResponse, error) {
	return testpki.Ask(s.client, s.url+path, body)
}

// answerAll posts bodies to /validate all at once; each answer must allow
// the delete where allowed(i) says so, and deny it elsewhere.
func (s *server) answerAll(t *testing.T, bodies [][]byte, allowed func(i int) bool) {
	t.Helper()
	var wg sync.WaitGroup
	for i, body := range bodies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := s.answer("/validate", body)
			if assert.NoError(t, err, "review %d", i) {
				assert.Equal(t, allowed(i), out.Allowed, "review %d: %v", i, out.Result)
			}
		}()
	}
	wg.Wait()
}

func always(int) bool { return true }

// sendLarge sends n ~1 MiB reviews (Nodes large-0, large-1, ...) at once,
// whatever their answers; the func returned waits for them all.
func (s *server) sendLarge(n int) (wait func()) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = s.answer("/validate", review(admissionv1.Delete, "Node", hostileNode(fmt.Sprintf("large-%d", i))))
		}()
	}
	return wg.Wait
}

// Concurrent reviews of the same Node by the same user share one decision;
// another user (exemptions read the user) gets a decision of its own.
func TestSameReviewsShareOneDecision(t *testing.T) {
	_, _, nodes := example(t)
	var calls atomic.Int64
	release := make(chan struct{})
	blocking := deciderFunc(func(_ context.Context, req guard.Request) (rule.Decision, error) {
		calls.Add(1)
		<-release
		return rule.Decision{Allowed: req.UserInfo.Username == "bob", Reason: rule.ReasonNoLink}, nil
	})
	in := &arrivals{next: admission.NewWebhook(admission.WebhookOptions{Decider: blocking})}
	s := serve(t, in, admission.TLSOptions{}, nil)
	alice := review(admissionv1.Delete, "Node", nodes[linkedNode].Object)
	bob := bytes.Replace(alice, []byte(`"username":"alice"`), []byte(`"username":"bob"`), 1)

	const n = 10
	var wg sync.WaitGroup
	answers := make([]*admissionv1.AdmissionResponse, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := alice
			if i == n-1 {
				body = bob
			}
			answers[i], errs[i] = s.answer("/validate", body)
		}()
	}
	require.Eventually(t, func() bool { return in.n.Load() == n }, 10*time.Second, time.Millisecond)
	// From arrival to joining the flight is decoding only, but no event
	// announces the join: the stacks show the two leaders deciding and the
	// other reviews waiting on their flights.
	require.Eventually(t, func() bool { return calls.Load() == 2 && stacks.Count(flightWaiter...) == n-2 }, 10*time.Second, time.Millisecond,
		"alice's first review and bob's decide, alice's eight others wait on the first's flight")
	close(release)
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i])
		assert.Equal(t, i == n-1, answers[i].Allowed, "review %d", i)
	}
	assert.EqualValues(t, 2, calls.Load(), "one decision for alice's nine reviews, one for bob's")

	// Nothing outlives the reviews that waited: the next review decides anew.
	_, err := s.answer("/validate", alice)
	require.NoError(t, err)
	assert.EqualValues(t, 3, calls.Load())
}

// Where a goroutine waits, by the functions on its stack (goroutinesIn):
// a review that joined another's decision; one queued for a decision slot;
// one queued for its bytes in the budget.
var (
	flightWaiter = []string{"singleflight.(*Group).Do(", "sync.(*WaitGroup).Wait"}
	slotWaiter   = []string{"admission.Do[", "semaphore.(*Weighted).Acquire"}
	bytesWaiter  = []string{"admission.(*Intake).acquire", "semaphore.(*Weighted).Acquire"}
)

// heldDecider allows every request once released; it counts the decisions
// under way and keeps the most it saw at once.
type heldDecider struct {
	running, peak atomic.Int64
	gate          atomic.Pointer[chan struct{}]
}

func newHeldDecider() *heldDecider {
	d := &heldDecider{}
	d.hold()
	return d
}

// hold makes the decisions that start from now on wait for release.
func (d *heldDecider) hold() {
	gate := make(chan struct{})
	d.gate.Store(&gate)
}

// release lets the held decisions, and those that start until the next
// hold, finish.
func (d *heldDecider) release() { close(*d.gate.Load()) }

func (d *heldDecider) decider() deciderFunc {
	return func(context.Context, guard.Request) (rule.Decision, error) {
		now := d.running.Add(1)
		defer d.running.Add(-1)
		for p := d.peak.Load(); now > p && !d.peak.CompareAndSwap(p, now); p = d.peak.Load() {
		}
		<-*d.gate.Load()
		return rule.Decision{Allowed: true, Reason: rule.ReasonNoLink}, nil
	}
}

// At most the Intake's MaxConcurrent decide at once; the others wait their turn
// and are all answered; one that cannot get a slot before its deadline is
// denied, in time.
func TestConcurrentDecisionsAreBounded(t *testing.T) {
	_, _, nodes := example(t)
	held := newHeldDecider()
	s := serve(t, admission.NewWebhook(admission.WebhookOptions{Decider: held.decider(), Intake: admission.NewIntake(admission.IntakeOptions{MaxConcurrent: 2})}), admission.TLSOptions{}, nil)
	bodies := make([][]byte, 12)
	for i := range bodies {
		// A user each: no two reviews share a decision.
		bodies[i] = review(admissionv1.Delete, "Node", nodes[linkedNode].Object, fmt.Sprintf("group-%d", i))
	}
	answered := make(chan struct{})
	go func() { defer close(answered); s.answerAll(t, bodies, always) }()
	require.Eventually(t, func() bool { return held.running.Load() == 2 && stacks.Count(slotWaiter...) == len(bodies)-2 }, 10*time.Second, 10*time.Millisecond,
		"two reviews deciding, the ten others queued for a slot")
	held.release()
	<-answered
	assert.EqualValues(t, 2, held.peak.Load())

	// A decider that ignores its deadline holds the only slot until the end
	// of the test.
	holding, unstick := make(chan struct{}), make(chan struct{})
	var once sync.Once
	stuck := deciderFunc(func(context.Context, guard.Request) (rule.Decision, error) {
		once.Do(func() { close(holding) })
		<-unstick
		return rule.Decision{Allowed: true, Reason: rule.ReasonNoLink}, nil
	})
	s = serve(t, admission.NewWebhook(admission.WebhookOptions{Decider: stuck, Intake: admission.NewIntake(admission.IntakeOptions{MaxConcurrent: 1, Timeout: 300 * time.Millisecond})}), admission.TLSOptions{}, nil)
	t.Cleanup(func() { close(unstick) }) // before the server's stop, which drains the first review
	go func() {
		_, _ = s.answer("/validate", review(admissionv1.Delete, "Node", nodes[linkedNode].Object, "first"))
	}()
	<-holding
	start := time.Now()
	out, err := s.answer("/validate", review(admissionv1.Delete, "Node", nodes[linkedNode].Object, "second"))
	require.NoError(t, err)
	assert.Less(t, time.Since(start), 2*time.Second)
	assert.False(t, out.Allowed)
	assert.Contains(t, out.Result.Message, "--max-concurrent-decisions")
	assert.EqualValues(t, http.StatusInternalServerError, out.Result.Code, "not the rule's denial")
}

// Malformed requests are counted by reason and logged at a bounded rate.
func TestRejectedRequestsAreCountedAndLoggedSparingly(t *testing.T) {
	g, _, nodes := example(t)
	reg := prometheus.NewRegistry()
	im, err := admission.NewIntakeMetrics(reg)
	require.NoError(t, err)
	log, logs := testlog.JSON()
	in := admission.NewIntake(admission.IntakeOptions{Metrics: im, Log: log, LogInterval: time.Hour})
	s := serve(t, admission.NewWebhook(admission.WebhookOptions{Decider: g, Intake: in}), admission.TLSOptions{}, nil)
	for range 50 {
		s.post(t, "/validate", "application/json", []byte(`{"apiVersion":`))
	}
	for range 3 {
		s.post(t, "/validate", "text/plain", nil)
	}
	undecodable := review(admissionv1.Delete, "Node", map[string]any{"apiVersion": "v1", "kind": "Node", "spec": "x"})
	code, _, _ := s.post(t, "/validate", "application/json", undecodable)
	assert.Equal(t, http.StatusBadRequest, code)
	code, _, _ = s.post(t, "/validate", "application/json", review(admissionv1.Delete, "Node", nodes[linkedNode].Object))
	assert.Equal(t, http.StatusOK, code)

	rejected, err := testutil.GatherAndCount(reg, "nodeguard_rejected_requests_total")
	require.NoError(t, err)
	assert.Equal(t, 3, rejected, "three reasons")
	assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP nodeguard_rejected_requests_total Requests answered with an HTTP error instead of a decision (malformed, wrong method or type, too large, no client certificate), by reason.
# TYPE nodeguard_rejected_requests_total counter
nodeguard_rejected_requests_total{reason="bad-old-object"} 1
nodeguard_rejected_requests_total{reason="content-type"} 3
nodeguard_rejected_requests_total{reason="malformed"} 50
`), "nodeguard_rejected_requests_total"))
	assert.Equal(t, 1, strings.Count(logs.String(), "bad admission request"), "one line per interval, however many requests")
}

// hostileNode is a ~1 MiB oldObject: a Node with 340,000 empty objects under
// spec, which costs ~180 MB when converted whole into the rule's input.
func hostileNode(name string) map[string]any {
	junk := make([]any, 340_000)
	for i := range junk {
		junk[i] = map[string]any{}
	}
	return map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": name},
		"spec": map[string]any{"providerID": "docker:////" + name, "taints": junk}}
}

// Eight concurrent ~1 MiB hostile reviews of each shape (internal/hostile:
// Nodes full of empty objects or nested lists, huge annotations or managed
// fields, users in 95,000 groups or with a huge userInfo.extra), under the
// deployment's GOGC=400 and GOMEMLIMIT=400MiB, keep the Go heap's peak under
// 128 MiB: nothing the rule does not read is built.
func TestHostileReviewsStayWithinTheMemoryBound(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the memory test sends 48 MiB of reviews")
	}
	g, _, _ := example(t)
	// A deadline far past the default: this measures memory, and under the
	// race detector on a loaded machine a 1 MiB decode can take seconds.
	s := serve(t, admission.NewWebhook(admission.WebhookOptions{Decider: g, Intake: admission.NewIntake(admission.IntakeOptions{Timeout: time.Minute})}), admission.TLSOptions{}, nil)
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(400 << 20))

	const bound = 128 << 20
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	for _, shape := range hostile.Shapes {
		// The bodies, built just before their round: bodies held across the
		// test would count in the heap they are measured against.
		batch := make([][]byte, 8)
		for i := range batch {
			batch[i] = hostile.Review(shape, fmt.Sprintf("hostile-%d", i), i)
			require.Less(t, len(batch[i]), admission.MaxBodyBytes)
		}
		runtime.GC()
		metrics.Read(sample)
		base := sample[0].Value.Uint64()
		var peak atomic.Uint64
		done, sampled := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(sampled)
			for {
				metrics.Read(sample)
				if v := sample[0].Value.Uint64(); v > peak.Load() {
					peak.Store(v)
				}
				select {
				case <-done:
					return
				case <-time.After(time.Millisecond):
				}
			}
		}()
		s.answerAll(t, batch, always) // nothing links to these Nodes
		close(done)
		<-sampled
		t.Logf("%s: peak heap with 8 concurrent ~%d KiB reviews: %d MiB (%d MiB before; bound %d MiB)",
			shape, len(batch[0])>>10, peak.Load()>>20, base>>20, bound>>20)
		assert.Less(t, peak.Load(), uint64(bound), shape)
	}
}

// realisticLargeNode is as large as a real Node gets: kubelet's 50 images
// (its --node-status-max-images default), each with a tag and a digest name,
// annotations at the API server's 256 KiB total limit, and managed fields
// naming each annotation once more.
func realisticLargeNode() map[string]any {
	images := make([]any, 50)
	for i := range images {
		repo := fmt.Sprintf("registry.example.com/platform/team-%02d/some-long-service-name-%02d", i, i)
		images[i] = map[string]any{"sizeBytes": 123456789, "names": []any{
			repo + "@sha256:" + strings.Repeat("0123456789abcdef", 4), repo + ":v1.2.3-build.4567"}}
	}
	annotations := map[string]any{}
	owned := map[string]any{}
	for i, size := 0, 0; size < 256<<10-400; i++ {
		key := fmt.Sprintf("example.com/annotation-%05d", i)
		value := strings.Repeat("v", 300)
		annotations[key] = value
		owned["f:"+key] = map[string]any{}
		size += len(key) + len(value)
	}
	return map[string]any{"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": "big", "annotations": annotations,
			"managedFields": []any{map[string]any{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
				"fieldsType": "FieldsV1", "fieldsV1": map[string]any{"f:metadata": map[string]any{"f:annotations": owned}}}}},
		"spec":   map[string]any{"providerID": "aws:///us-east-1a/i-0123456789abcdef0"},
		"status": map[string]any{"images": images}}
}

// MaxBodyBytes leaves room for the largest real Node: a delete of it is
// judged, not refused as too large.
func TestLargestRealNodeFits(t *testing.T) {
	g, _, _ := example(t)
	s := serve(t, admission.NewWebhook(admission.WebhookOptions{Decider: g}), admission.TLSOptions{}, nil)
	body := review(admissionv1.Delete, "Node", realisticLargeNode())
	t.Logf("review of a Node with 50 images and 256 KiB of annotations: %d KiB (limit %d KiB)", len(body)>>10, admission.MaxBodyBytes>>10)
	assert.Less(t, len(body), admission.MaxBodyBytes*3/4, "a quarter of the limit to spare")
	code, msg, out := s.post(t, "/validate", "application/json", body)
	require.Equal(t, http.StatusOK, code, msg)
	assert.True(t, out.Response.Allowed)
}

// Large reviews take a share of a byte budget while they are decoded and
// decided: ~1 MiB ones go about four at a time, small ones are not held up.
func TestLargeReviewsQueueForTheirBytes(t *testing.T) {
	held := newHeldDecider()
	// Deadlines far past the default: the reviews waiting for their bytes
	// wait until the test has seen them all, and under the race detector on
	// a loaded machine decoding 1 MiB takes seconds.
	s := serve(t, admission.NewWebhook(admission.WebhookOptions{Decider: held.decider(), Intake: admission.NewIntake(admission.IntakeOptions{Timeout: time.Minute})}), admission.TLSOptions{}, nil)
	send := func(bodies [][]byte, queued func() bool, why string) {
		answered := make(chan struct{})
		go func() { defer close(answered); s.answerAll(t, bodies, always) }()
		require.Eventually(t, queued, time.Minute, 10*time.Millisecond, why)
		held.release()
		<-answered
	}
	large := make([][]byte, 8)
	for i := range large {
		large[i] = review(admissionv1.Delete, "Node", hostileNode(fmt.Sprintf("large-%d", i)))
	}
	send(large, func() bool { return held.running.Load() == 4 && stacks.Count(bytesWaiter...) == 4 },
		"four large reviews deciding, the four others waiting for their bytes")
	assert.LessOrEqual(t, held.peak.Load(), int64(4), "at most four ~1 MiB reviews at once")
	assert.Positive(t, held.peak.Load())

	held.hold()
	held.peak.Store(0)
	small := make([][]byte, 12)
	for i := range small {
		small[i] = review(admissionv1.Delete, "Node", map[string]any{"apiVersion": "v1", "kind": "Node",
			"metadata": map[string]any{"name": fmt.Sprintf("small-%d", i)}})
	}
	send(small, func() bool { return held.running.Load() == int64(len(small)) }, "the twelve small reviews deciding at once")
	assert.Greater(t, held.peak.Load(), int64(4), "small reviews are not held to the large ones' pace")
}

// realisticNode is a Node as kubelet registers it in a CAPI cluster: labels,
// CAPI's annotations, taints, conditions, addresses, node info, kubelet's 50
// images (its default nodeStatusMaxImages) and the managed fields of kubelet,
// kubeadm, CAPI and the controller manager.
func realisticNode(name string) map[string]any {
	images := make([]any, 50)
	for i := range images {
		repo := fmt.Sprintf("registry.k8s.io/team-%02d/some-service-%02d", i, i)
		images[i] = map[string]any{"sizeBytes": 123456789, "names": []any{
			repo + "@sha256:" + strings.Repeat("0123456789abcdef", 4), repo + ":v1.36.3"}}
	}
	labels := map[string]any{"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
		"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "m6i.large",
		"topology.kubernetes.io/region": "eu-west-1", "topology.kubernetes.io/zone": "eu-west-1a",
		"node-role.kubernetes.io/worker": "", "node.cluster.x-k8s.io/nodegroup": "md-0"}
	annotations := map[string]any{"cluster.x-k8s.io/cluster-name": "prod", "cluster.x-k8s.io/cluster-namespace": "fleet",
		"cluster.x-k8s.io/machine": name, "cluster.x-k8s.io/owner-kind": "MachineSet", "cluster.x-k8s.io/owner-name": "prod-md-0-x7k2p",
		"cluster.x-k8s.io/labels-from-machine":   "node.cluster.x-k8s.io/nodegroup",
		"kubeadm.alpha.kubernetes.io/cri-socket": "unix:///var/run/containerd/containerd.sock",
		"node.alpha.kubernetes.io/ttl":           "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"}
	conditions := []any{}
	for _, c := range []string{"MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable", "Ready"} {
		conditions = append(conditions, map[string]any{"type": c, "status": "False", "reason": "Kubelet" + c,
			"message": "kubelet has sufficient resources for " + c, "lastHeartbeatTime": "2026-12-01T10:00:00Z",
			"lastTransitionTime": "2026-11-01T10:00:00Z"})
	}
	fields := func(m map[string]any) map[string]any {
		out := map[string]any{}
		for k := range m {
			out["f:"+k] = map[string]any{}
		}
		return out
	}
	managed := []any{}
	for _, manager := range []string{"kubelet", "kubeadm", "manager", "kube-controller-manager"} {
		managed = append(managed, map[string]any{"manager": manager, "operation": "Update", "apiVersion": "v1", "time": "2026-12-01T10:00:00Z",
			"fieldsType": "FieldsV1", "fieldsV1": map[string]any{"f:metadata": map[string]any{"f:labels": fields(labels), "f:annotations": fields(annotations)},
				"f:status": map[string]any{"f:conditions": map[string]any{}, "f:images": map[string]any{}, "f:nodeInfo": map[string]any{}}}})
	}
	return map[string]any{"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": name, "uid": "6b8f3c1e-0000-4000-8000-000000000001", "resourceVersion": "123456789",
			"creationTimestamp": "2026-11-01T10:00:00Z", "labels": labels, "annotations": annotations, "managedFields": managed},
		"spec": map[string]any{"providerID": "aws:///eu-west-1a/i-0123456789abcdef0", "podCIDR": "10.244.3.0/24", "podCIDRs": []any{"10.244.3.0/24"},
			"taints": []any{map[string]any{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}}, "unschedulable": true},
		"status": map[string]any{
			"capacity":    map[string]any{"cpu": "2", "memory": "8012344Ki", "pods": "110", "ephemeral-storage": "81106868Ki"},
			"allocatable": map[string]any{"cpu": "2", "memory": "7909944Ki", "pods": "110", "ephemeral-storage": "74746816Ki"},
			"conditions":  conditions,
			"addresses": []any{map[string]any{"type": "InternalIP", "address": "10.0.1.17"},
				map[string]any{"type": "Hostname", "address": name}, map[string]any{"type": "InternalDNS", "address": "ip-10-0-1-17.eu-west-1.compute.internal"}},
			"daemonEndpoints": map[string]any{"kubeletEndpoint": map[string]any{"Port": 10250}},
			"nodeInfo": map[string]any{"machineID": strings.Repeat("a", 32), "systemUUID": "ec2f1234-0000-0000-0000-000000000000",
				"bootID": "0b1c2d3e-0000-0000-0000-000000000000", "kernelVersion": "6.8.0-1021-aws", "osImage": "Ubuntu 24.04.1 LTS",
				"containerRuntimeVersion": "containerd://2.1.4", "kubeletVersion": "v1.36.3", "kubeProxyVersion": "v1.36.3",
				"operatingSystem": "linux", "architecture": "amd64"},
			"images": images}}
}

// A real Node's DELETE review takes the small lane, with room.
func TestRealNodeReviewsTakeTheSmallLane(t *testing.T) {
	body := review(admissionv1.Delete, "Node", realisticNode("prod-md-0-x7k2p-abcde"), "system:masters", "system:authenticated")
	t.Logf("DELETE review of a Node with kubelet's 50 images, labels, conditions and managed fields: %.1f KiB; the small lane takes up to %d KiB",
		float64(len(body))/1024, admission.SmallBytes>>10)
	assert.Less(t, len(body), admission.SmallBytes/2, "twice the room")
}

// Small reviews never wait behind large ones: with the large lane full of
// ~1 MiB reviews held in their decisions, and more waiting for it, 30 small
// reviews are all answered.
func TestSmallReviewsNeverWaitBehindLargeOnes(t *testing.T) {
	release := make(chan struct{})
	var large atomic.Int64
	decider := deciderFunc(func(ctx context.Context, req guard.Request) (rule.Decision, error) {
		if req.Node != nil && strings.HasPrefix(req.Node.GetName(), "large-") {
			large.Add(1)
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return rule.Decision{Allowed: true, Reason: rule.ReasonNoLink}, nil
	})
	// Deadlines far past the default: the order is what is tested, and under
	// the race detector on a loaded machine decoding 1 MiB takes seconds.
	s := serve(t, admission.NewWebhook(admission.WebhookOptions{Decider: decider, Intake: admission.NewIntake(admission.IntakeOptions{Timeout: time.Minute})}), admission.TLSOptions{}, nil)
	wait := s.sendLarge(8)
	defer func() { close(release); wait() }()
	require.Eventually(t, func() bool { return large.Load() == 4 }, time.Minute, 10*time.Millisecond, "four large reviews hold the large lane")
	start := time.Now()
	var small sync.WaitGroup
	for i := range 30 {
		small.Add(1)
		go func() {
			defer small.Done()
			out, err := s.answer("/validate", review(admissionv1.Delete, "Node", realisticNode(fmt.Sprintf("small-%d", i))))
			if assert.NoError(t, err) {
				assert.True(t, out.Allowed, "small review %d", i)
			}
		}()
	}
	small.Wait()
	t.Logf("30 small reviews answered in %s while 8 large ones held or waited for the large lane", time.Since(start).Round(time.Millisecond))
	assert.EqualValues(t, 4, large.Load(), "the waiting large reviews are still waiting")
}

// rawPost sends a request's head (and body, if any) over its own TLS
// connection and returns the status: the body need not be what its
// Content-Length says, or come at all.
func rawPost(t *testing.T, s *server, head string, body []byte) int {
	t.Helper()
	// HTTP/1.1 spoken by hand: not the h2 the client's transport may have
	// added to its config.
	cfg := s.client.Transport.(*http.Transport).TLSClientConfig.Clone()
	cfg.NextProtos = []string{"http/1.1"}
	conn, err := tls.Dial("tcp", strings.TrimPrefix(s.url, "https://"), cfg)
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.Write(append([]byte(head), body...))
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	_ = resp.Body.Close()
	return resp.StatusCode
}

// The budget is taken for the declared length before a byte of the body is
// read: a body over the limit is refused on its head alone, and a large one
// waiting for budget is shed at its deadline though it never sent its bytes.
func TestTheBudgetComesBeforeTheBody(t *testing.T) {
	// Decisions that ignore their deadline hold the large lane until
	// released.
	release := make(chan struct{})
	var held atomic.Int64
	decider := deciderFunc(func(context.Context, guard.Request) (rule.Decision, error) {
		held.Add(1)
		<-release
		return rule.Decision{Allowed: true, Reason: rule.ReasonNoLink}, nil
	})
	s := serve(t, admission.NewWebhook(admission.WebhookOptions{Decider: decider, Intake: admission.NewIntake(admission.IntakeOptions{Timeout: 2 * time.Second})}), admission.TLSOptions{}, nil)
	head := func(length string) string {
		return "POST /validate HTTP/1.1\r\nHost: nodeguard\r\nContent-Type: application/json\r\n" + length + "\r\n"
	}
	assert.Equal(t, http.StatusRequestEntityTooLarge, rawPost(t, s, head(fmt.Sprintf("Content-Length: %d\r\n", admission.MaxBodyBytes+1)), nil))

	wait := s.sendLarge(4)
	require.Eventually(t, func() bool { return held.Load() == 4 }, time.Minute, 10*time.Millisecond) // four large bodies decoded: slow under -race on a loaded machine
	start := time.Now()
	code := rawPost(t, s, head(fmt.Sprintf("Content-Length: %d\r\n", 900<<10)), nil)
	assert.Equal(t, http.StatusServiceUnavailable, code, "no budget for its bytes before the deadline")
	assert.Less(t, time.Since(start), 5*time.Second, "shed at the review's deadline, not at the connection's read timeout")

	// Without Content-Length (chunked), a small body is read, a large one is
	// refused.
	close(release)
	wait()
	small := review(admissionv1.Delete, "Node", map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": "n"}})
	chunked := func(b []byte) []byte {
		return []byte(fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(b), b))
	}
	assert.Equal(t, http.StatusOK, rawPost(t, s, head("Transfer-Encoding: chunked\r\n"), chunked(small)))
	big := review(admissionv1.Delete, "Node", hostileNode("chunked"))
	assert.Equal(t, http.StatusLengthRequired, rawPost(t, s, head("Transfer-Encoding: chunked\r\n"), chunked(big)))
}
