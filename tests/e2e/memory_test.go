//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/internal/hostile"
	"github.com/nodeguard/nodeguard/internal/procstatus"
	"github.com/nodeguard/nodeguard/internal/testpki"
)

// process is the nodeguard binary running as deployed (GOGC=400,
// GOMEMLIMIT=400MiB) against an API server.
type process struct {
	url string
	ca  *testpki.CA
	pid int
	log string
}

// nodeguardProcess builds and runs `nodeguard serve` against env until the
// test ends, waits until it is ready and, with register, makes it the API
// server's Node-delete webhook.
func nodeguardProcess(t *testing.T, env *envtest.Environment, register bool) process {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "nodeguard")
	out, err := exec.Command("go", "build", "-o", bin, "../../enforcer/cmd/nodeguard").CombinedOutput()
	require.NoError(t, err, "%s", out)
	ca := testpki.New(t)
	cert, key := ca.ServerFiles(t, "nodeguard")
	listen, probes := fmt.Sprintf("127.0.0.1:%d", freePort(t)), fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cmd := exec.Command(bin, "serve", "--kubeconfig", adminKubeconfig(t, env),
		"--listen-address", listen, "--health-probe-bind-address", probes, "--metrics-bind-address", "0",
		"--tls-cert-file", cert, "--tls-private-key-file", key)
	cmd.Env = append(os.Environ(), "GOGC=400", "GOMEMLIMIT=400MiB")
	log := keepLog(t, "nodeguard", &cmd.Stdout, &cmd.Stderr)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + probes + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 100*time.Millisecond, "nodeguard never became ready")
	p := process{url: "https://" + listen, ca: ca, pid: cmd.Process.Pid, log: log}
	if register {
		caPEM, err := os.ReadFile(ca.CAFile(t))
		require.NoError(t, err)
		vwc, err := admission.BuildWebhookConfig(admission.WebhookConfigOptions{URL: p.url, CABundle: caPEM})
		require.NoError(t, err)
		require.NoError(t, admission.ApplyWebhookConfig(context.Background(), dynamic.NewForConfigOrDie(env.Config), vwc))
	}
	return p
}

// clientFrom is an HTTPS client of p whose connections come from the
// loopback address source: nodeguard bounds connections per client address,
// and the API server is 127.0.0.1.
func (p process) clientFrom(source string, conns int) *http.Client {
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}, Timeout: 10 * time.Second}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext:         dialer.DialContext,
		TLSClientConfig:     &tls.Config{RootCAs: p.ca.Pool(), MinVersion: tls.VersionTLS12},
		MaxIdleConnsPerHost: conns,
	}}
}

// Every hostile shape (internal/hostile: Nodes full of empty objects or
// nested lists, huge annotations or managed fields, users in 95,000 groups or
// with a huge userInfo.extra), 8 concurrent ~1 MiB reviews twice over, keeps
// the nodeguard binary, as deployed, under 200 MiB of peak RSS: nothing the
// rule does not read is built. Its log stays JSON.
func TestHostileReviewsPeakRSS(t *testing.T) {
	_, env := apiServerEnv(t)
	p := nodeguardProcess(t, env, false)
	client := p.clientFrom("127.0.0.2", 8)
	before := peakRSS(t, p.pid)
	var report []string
	for _, shape := range hostile.Shapes {
		bodies := make([][]byte, 8)
		for i := range bodies {
			bodies[i] = hostile.Review(shape, fmt.Sprintf("hostile-%d", i), i)
		}
		for round := range 2 {
			var wg sync.WaitGroup
			for i, body := range bodies {
				wg.Add(1)
				go func() {
					defer wg.Done()
					resp, err := client.Post(p.url+"/validate", "application/json", bytes.NewReader(body))
					if !assert.NoError(t, err, "%s round %d review %d", shape, round, i) {
						return
					}
					defer resp.Body.Close()
					assert.Equal(t, http.StatusOK, resp.StatusCode, "%s round %d review %d is judged, not refused", shape, round, i)
				}()
			}
			wg.Wait()
		}
		peak := peakRSS(t, p.pid)
		report = append(report, fmt.Sprintf("%s (~%d KiB) %d MiB", shape, len(bodies[0])>>10, peak>>20))
		// The peak is the process's high-water mark, so this holds each shape
		// and the ones before it.
		assert.Less(t, peak, int64(200<<20), shape)
	}
	t.Logf("nodeguard serve (GOGC=400, GOMEMLIMIT=400MiB): peak RSS %d MiB ready; after each shape's 2 rounds of 8 concurrent reviews: %s",
		before>>20, strings.Join(report, ", "))
	assertJSONLog(t, p.log)
}

// Floods of forged ~1 MiB reviews from clients that are not the API server
// (no client certificate is required by default): 128 at once deny none of
// 40 real Node deletes; 512 at once (from two addresses, within the per-client
// bound) keep the process under 256 MiB of peak RSS, while 40 real deletes are
// each answered correctly: the byte budget, taken before a body is read,
// bounds memory, and review-sized requests have a lane of their own.
func TestFloodsOfForged1MiBReviews(t *testing.T) {
	cfg, env := apiServerEnv(t)
	kube, dyn := clientsFor(t, cfg)
	ctx := context.Background()
	capdMachine(t, dyn, "linked", false)
	capdMachine(t, dyn, "gone", false)
	require.NoError(t, dyn.Resource(dockerMachine).Namespace("default").Delete(ctx, "gone", metav1.DeleteOptions{}))
	p := nodeguardProcess(t, env, true)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		err := dryRunDelete(ctx, kube, "linked")
		require.Error(c, err)
		assert.Contains(c, err.Error(), "DockerMachine default/linked")
	}, 30*time.Second, 200*time.Millisecond, "nodeguard must deny once its webhook is registered")
	forged := [][]byte{hostile.Review("empty-objects", "linked", 0), hostile.Review("extra", "gone", 1), hostile.Review("groups", "decoy", 2)}

	for _, flood := range []struct {
		workers int
		sources []string
		linked  int // of the 40 real deletes, how many of the linked Node (denied)
	}{
		{workers: 128, sources: []string{"127.0.0.2"}, linked: 0},
		{workers: 512, sources: []string{"127.0.0.2", "127.0.0.3"}, linked: 20},
	} {
		floodCtx, stop := context.WithCancel(ctx)
		var sent, answered, busy atomic.Int64
		var wg sync.WaitGroup
		for _, source := range flood.sources {
			per := flood.workers / len(flood.sources)
			client := p.clientFrom(source, per)
			for w := range per {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; floodCtx.Err() == nil; i++ {
						req, _ := http.NewRequestWithContext(floodCtx, http.MethodPost, p.url+"/validate", bytes.NewReader(forged[(w+i)%len(forged)]))
						req.Header.Set("Content-Type", "application/json")
						sent.Add(1)
						resp, err := client.Do(req)
						if err != nil {
							continue
						}
						resp.Body.Close()
						switch resp.StatusCode {
						case http.StatusOK:
							answered.Add(1)
						case http.StatusServiceUnavailable:
							busy.Add(1)
						}
					}
				}()
			}
		}
		require.Eventually(t, func() bool { return answered.Load()+busy.Load() >= int64(flood.workers) }, 60*time.Second, 10*time.Millisecond,
			"the flood is on: as many forged reviews answered as there are workers")
		var slowest time.Duration
		var wrong []string
		for i := range 40 {
			name := "gone"
			if i < flood.linked {
				name = "linked"
			}
			t0 := time.Now()
			err := dryRunDelete(ctx, kube, name)
			slowest = max(slowest, time.Since(t0))
			switch {
			case name == "gone" && err != nil:
				wrong = append(wrong, fmt.Sprintf("delete %d of %s denied: %v", i, name, err))
			case name == "linked" && (err == nil || !strings.Contains(err.Error(), "DockerMachine default/linked")):
				wrong = append(wrong, fmt.Sprintf("delete %d of %s not denied for its blocker: %v", i, name, err))
			}
		}
		rss := peakRSS(t, p.pid)
		stop()
		wg.Wait()
		t.Logf("%d concurrent forged ~1 MiB reviews (%d sent, %d answered, %d shed with 503): 40 real deletes (%d of a linked Node), "+
			"%d answered wrongly, slowest %s; peak RSS %d MiB", flood.workers, sent.Load(), answered.Load(), busy.Load(), flood.linked,
			len(wrong), slowest.Round(time.Millisecond), rss>>20)
		assert.Empty(t, wrong, "%d workers", flood.workers)
		// Most forged requests end at the connection bounds or, unread, with
		// their connection; enough reach the budget to keep it full.
		assert.Greater(t, answered.Load()+busy.Load(), int64(flood.workers/2), "the flood did reach nodeguard")
		assert.Less(t, rss, int64(256<<20), "%d workers", flood.workers)
	}
	assertJSONLog(t, p.log)
}

// assertJSONLog checks that every line nodeguard logged is JSON (client-go's
// warnings and klog lines included) and that the API server's warnings came
// once each.
func assertJSONLog(t *testing.T, path string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	warnings := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var entry map[string]any
		if !assert.NoError(t, json.Unmarshal([]byte(line), &entry), "a log line that is not JSON: %q", line) {
			continue
		}
		if entry["msg"] == "API server warning" {
			warnings[fmt.Sprint(entry["warning"])]++
		}
	}
	for w, n := range warnings {
		assert.Equal(t, 1, n, "warning %q logged once", w)
	}
}

// peakRSS is the process's high-water resident set (VmHWM), in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	kb, err := procstatus.KiB(pid, "VmHWM")
	if errors.Is(err, fs.ErrNotExist) {
		t.Skipf("no /proc to read the peak RSS from: %v", err)
	}
	require.NoError(t, err)
	return kb << 10
}
