package webhook_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"log/slog"
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

	"github.com/nodeguard/nodeguard/enforcer/decision"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/webhook"
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
	resp, err := s.client.Post(s.url+path, "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("status %d: %w", resp.StatusCode, err)
	}
	return out.Response, nil
}

// Concurrent reviews of the same Node by the same user share one decision;
// another user (exemptions read the user) gets a decision of its own.
func TestSameReviewsShareOneDecision(t *testing.T) {
	_, _, nodes := example(t)
	var calls atomic.Int64
	release := make(chan struct{})
	blocking := deciderFunc(func(_ context.Context, req guard.Request) (decision.Decision, error) {
		calls.Add(1)
		<-release
		return decision.Decision{Allowed: req.UserInfo.Username == "bob", Reason: decision.ReasonNoLink}, nil
	})
	in := &arrivals{next: webhook.New(webhook.Options{Decider: blocking})}
	s := serve(t, in, webhook.TLSOptions{}, nil)
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
	time.Sleep(100 * time.Millisecond) // from arrival to joining the flight: decoding only
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

// At most MaxConcurrentDecisions decide at once; the others wait their turn
// and are all answered; one that cannot get a slot before its deadline is
// denied, in time.
func TestConcurrentDecisionsAreBounded(t *testing.T) {
	_, _, nodes := example(t)
	var running, peak atomic.Int64
	slow := deciderFunc(func(context.Context, guard.Request) (decision.Decision, error) {
		now := running.Add(1)
		for p := peak.Load(); now > p && !peak.CompareAndSwap(p, now); p = peak.Load() {
		}
		time.Sleep(20 * time.Millisecond)
		running.Add(-1)
		return decision.Decision{Allowed: true, Reason: decision.ReasonNoLink}, nil
	})
	s := serve(t, webhook.New(webhook.Options{Decider: slow, MaxConcurrentDecisions: 2}), webhook.TLSOptions{}, nil)
	var wg sync.WaitGroup
	errs := make(chan error, 12)
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A user each: no two reviews share a decision.
			body := review(admissionv1.Delete, "Node", nodes[linkedNode].Object, fmt.Sprintf("group-%d", i))
			out, err := s.answer("/validate", body)
			if err == nil && !out.Allowed {
				err = fmt.Errorf("review %d denied: %v", i, out.Result)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	assert.EqualValues(t, 2, peak.Load())

	// A decider that ignores its deadline holds the only slot for a second.
	stuck := deciderFunc(func(context.Context, guard.Request) (decision.Decision, error) {
		time.Sleep(time.Second)
		return decision.Decision{Allowed: true, Reason: decision.ReasonNoLink}, nil
	})
	s = serve(t, webhook.New(webhook.Options{Decider: stuck, MaxConcurrentDecisions: 1, Timeout: 300 * time.Millisecond}), webhook.TLSOptions{}, nil)
	go func() {
		_, _ = s.answer("/validate", review(admissionv1.Delete, "Node", nodes[linkedNode].Object, "first"))
	}()
	time.Sleep(50 * time.Millisecond)
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
	m, err := webhook.NewMetrics(reg, nil)
	require.NoError(t, err)
	var logs bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewJSONHandler(lockedWriter{&mu, &logs}, nil))
	s := serve(t, webhook.New(webhook.Options{Decider: g, Metrics: m, Log: log, LogInterval: time.Hour}), webhook.TLSOptions{}, nil)
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
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, 1, strings.Count(logs.String(), "bad admission request"), "one line per interval, however many requests")
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
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

// Eight concurrent ~1 MiB hostile reviews, under the deployment's GOGC=400
// and GOMEMLIMIT=400MiB, keep the Go heap's peak under the 256 MiB the
// issue sets for the process (the container limit is 512Mi): Nodes full of
// empty objects, and users with ~95,000 groups (the rule reads the groups,
// for exemptions, so they reach its input whole).
func TestHostileReviewsStayWithinTheMemoryBound(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the memory test sends 16 MiB of reviews")
	}
	g, _, nodes := example(t)
	s := serve(t, webhook.New(webhook.Options{Decider: g}), webhook.TLSOptions{}, nil)
	// The bodies of a round, built just before it: bodies held across the
	// whole test would count in the heap they are measured against.
	bodies := func(round int) [][]byte {
		out := make([][]byte, 8)
		for i := range out {
			if round%2 == 0 {
				out[i] = review(admissionv1.Delete, "Node", hostileNode(fmt.Sprintf("hostile-%d", i)))
			} else {
				groups := make([]string, 95_000)
				for j := range groups {
					groups[j] = fmt.Sprintf("%d-%d", i, j)
				}
				out[i] = review(admissionv1.Delete, "Node", nodes[linkedNode].Object, groups...)
			}
			require.Less(t, len(out[i]), webhook.MaxBodyBytes)
			require.Greater(t, len(out[i]), webhook.MaxBodyBytes*3/4, "about 1 MiB")
		}
		return out
	}
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(400 << 20))
	runtime.GC()

	const bound = 256 << 20
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	var peak atomic.Uint64
	var measuring atomic.Bool
	done := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			metrics.Read(sample)
			if v := sample[0].Value.Uint64(); measuring.Load() && v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	for round := range 4 {
		// Even rounds: the hostile Nodes (nothing links to them); odd:
		// the linked Node from users with many groups. The test's own
		// building of the bodies is not the server's cost.
		batch := bodies(round)
		runtime.GC()
		measuring.Store(true)
		var wg sync.WaitGroup
		for i, body := range batch {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out, err := s.answer("/validate", body)
				if assert.NoError(t, err, "round %d review %d", round, i) {
					assert.Equal(t, round%2 == 0, out.Allowed, "round %d review %d", round, i)
				}
			}()
		}
		wg.Wait()
		measuring.Store(false)
	}
	close(done)
	<-sampled
	t.Logf("peak heap with 8 concurrent 1 MiB reviews: %d MiB (bound %d MiB)", peak.Load()>>20, bound>>20)
	assert.Less(t, peak.Load(), uint64(bound))
}

// The default TLS settings refuse CBC suites; a TLS 1.3 minimum refuses 1.2.
func TestTLSSettings(t *testing.T) {
	g, _, _ := example(t)
	h := webhook.New(webhook.Options{Decider: g})
	s := serve(t, h, webhook.TLSOptions{}, nil)
	addr := strings.TrimPrefix(s.url, "https://")
	dial := func(cfg *tls.Config) error {
		cfg.InsecureSkipVerify = true //nolint:gosec // only the handshake's parameters are tested
		c, err := tls.Dial("tcp", addr, cfg)
		if err == nil {
			c.Close()
		}
		return err
	}
	assert.Error(t, dial(&tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA}}), "CBC refused")
	assert.NoError(t, dial(&tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}}), "AEAD accepted")
	assert.NoError(t, dial(&tls.Config{MinVersion: tls.VersionTLS13}))

	only13 := serve(t, h, webhook.TLSOptions{MinVersion: "VersionTLS13"}, nil)
	addr = strings.TrimPrefix(only13.url, "https://")
	assert.Error(t, dial(&tls.Config{MaxVersion: tls.VersionTLS12}))

	_, err := webhook.NewServer(h, webhook.TLSOptions{CertFile: "x", KeyFile: "y"}, nil)
	assert.Error(t, err)
	cert, key := testpki.New(t).ServerFiles(t, "settings")
	_, err = webhook.NewServer(h, webhook.TLSOptions{CertFile: cert, KeyFile: key, MinVersion: "VersionTLS11"}, nil)
	assert.ErrorContains(t, err, "--tls-min-version")
	_, err = webhook.NewServer(h, webhook.TLSOptions{CertFile: cert, KeyFile: key, CipherSuites: []string{"TLS_NOPE"}}, nil)
	assert.ErrorContains(t, err, "--tls-cipher-suites")
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
	s := serve(t, webhook.New(webhook.Options{Decider: g}), webhook.TLSOptions{}, nil)
	body := review(admissionv1.Delete, "Node", realisticLargeNode())
	t.Logf("review of a Node with 50 images and 256 KiB of annotations: %d KiB (limit %d KiB)", len(body)>>10, webhook.MaxBodyBytes>>10)
	assert.Less(t, len(body), webhook.MaxBodyBytes*3/4, "a quarter of the limit to spare")
	code, msg, out := s.post(t, "/validate", "application/json", body)
	require.Equal(t, http.StatusOK, code, msg)
	assert.True(t, out.Response.Allowed)
}

// Large reviews take a share of a byte budget while they are decoded and
// decided: ~1 MiB ones go about four at a time, small ones are not held up.
func TestLargeReviewsQueueForTheirBytes(t *testing.T) {
	var running, peak atomic.Int64
	slow := deciderFunc(func(context.Context, guard.Request) (decision.Decision, error) {
		now := running.Add(1)
		for p := peak.Load(); now > p && !peak.CompareAndSwap(p, now); p = peak.Load() {
		}
		time.Sleep(100 * time.Millisecond)
		running.Add(-1)
		return decision.Decision{Allowed: true, Reason: decision.ReasonNoLink}, nil
	})
	s := serve(t, webhook.New(webhook.Options{Decider: slow}), webhook.TLSOptions{}, nil)
	send := func(bodies [][]byte) {
		var wg sync.WaitGroup
		for i, body := range bodies {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out, err := s.answer("/validate", body)
				if assert.NoError(t, err, "review %d", i) {
					assert.True(t, out.Allowed, "review %d", i)
				}
			}()
		}
		wg.Wait()
	}
	large := make([][]byte, 8)
	for i := range large {
		large[i] = review(admissionv1.Delete, "Node", hostileNode(fmt.Sprintf("large-%d", i)))
	}
	send(large)
	assert.LessOrEqual(t, peak.Load(), int64(4), "at most four ~1 MiB reviews at once")
	assert.Positive(t, peak.Load())

	peak.Store(0)
	small := make([][]byte, 12)
	for i := range small {
		small[i] = review(admissionv1.Delete, "Node", map[string]any{"apiVersion": "v1", "kind": "Node",
			"metadata": map[string]any{"name": fmt.Sprintf("small-%d", i)}})
	}
	send(small)
	assert.Greater(t, peak.Load(), int64(4), "small reviews are not held to the large ones' pace")
}
