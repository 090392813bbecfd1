//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/nodeguard/nodeguard/enforcer/kube"
)

// withShippedRateLimits is cfg with the client rate limits `nodeguard serve`
// ships (envtest's admin config allows 1000/s, which would hide a starved
// client, as it hid client-go's 5/s default before).
func withShippedRateLimits(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = kube.DefaultQPS, kube.DefaultBurst
	return cfg
}

// A MachineDeployment scaled down by 30: CAPI deletes 30 InfraMachines, and
// as each is gone it deletes that Node, once. Every delete must be admitted
// at its first attempt, within CAPI's 10 s window; with client-go's default
// 5 requests/s the fresh reads were throttled and 21 of 29 were denied.
func TestBurstOfNodeDeletesIsAdmitted(t *testing.T) {
	cfg := apiServer(t)
	nodeguard(t, withShippedRateLimits(cfg), "")
	kube, dyn := clientsFor(t, cfg)
	ctx := context.Background()
	const n = 30
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("md-0-burst-%02d", i)
		capdMachine(t, dyn, names[i], false)
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		err := dryRunDelete(ctx, kube, names[0])
		require.Error(c, err)
		assert.Contains(c, err.Error(), "DockerMachine default/"+names[0])
	}, 30*time.Second, 200*time.Millisecond, "nodeguard must deny once ready")

	for _, name := range names {
		require.NoError(t, dyn.Resource(dockerMachine).Namespace("default").Delete(ctx, name, metav1.DeleteOptions{}))
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, n)
	took := make([]time.Duration, n)
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			errs[i] = kube.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
			took[i] = time.Since(t0)
		}()
	}
	wg.Wait()
	var slowest time.Duration
	for i := range names {
		assert.NoError(t, errs[i], "Node %s: its DockerMachine is gone, the one delete CAPI makes must be admitted", names[i])
		assert.Less(t, took[i], 10*time.Second, names[i])
		slowest = max(slowest, took[i])
	}
	t.Logf("%d parallel Node deletes right after their DockerMachines vanished: all answered in %s, slowest %s",
		n, time.Since(start).Round(time.Millisecond), slowest.Round(time.Millisecond))
}

// Anyone who reaches the review port can send forged reviews (no client
// certificate is required by default). 20 workers flood it with reviews that
// cost fresh reads, while the API server's own reviews keep being answered
// correctly: the linked Node denied, the Node whose DockerMachine is gone
// allowed.
func TestFloodOfForgedReviewsDoesNotStarveRealOnes(t *testing.T) {
	cfg := apiServer(t)
	ng := nodeguard(t, withShippedRateLimits(cfg), "")
	kube, dyn := clientsFor(t, cfg)
	ctx := context.Background()
	capdMachine(t, dyn, "linked", false)
	capdMachine(t, dyn, "gone", false)
	// Decoys: forged reviews naming them need GETs of their own, so the
	// flood is not absorbed by shared reads alone.
	decoys := make([]string, 12)
	for i := range decoys {
		decoys[i] = fmt.Sprintf("decoy-%02d", i)
		capdMachine(t, dyn, decoys[i], false)
	}
	require.NoError(t, dyn.Resource(dockerMachine).Namespace("default").Delete(ctx, "gone", metav1.DeleteOptions{}))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		err := dryRunDelete(ctx, kube, "linked")
		require.Error(c, err)
		assert.Contains(c, err.Error(), "DockerMachine default/linked")
	}, 30*time.Second, 200*time.Millisecond, "nodeguard must deny once ready")

	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: ng.ca.Pool(), MinVersion: tls.VersionTLS12}, MaxIdleConnsPerHost: 32}}
	floodCtx, stopFlood := context.WithCancel(ctx)
	var sent, answered atomic.Int64
	var wg sync.WaitGroup
	for w := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; floodCtx.Err() == nil; i++ {
				// Each forged review names a real Node with Machines to
				// re-read, as another user each time: no two share a decision.
				node := decoys[(w+i)%len(decoys)]
				body := forgedReview(node, fmt.Sprintf("mallory-%d-%d", w, i))
				req, _ := http.NewRequestWithContext(floodCtx, http.MethodPost, ng.url+"/validate", bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				sent.Add(1)
				resp, err := client.Do(req)
				if err != nil {
					continue
				}
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					answered.Add(1)
				}
			}
		}()
	}
	defer func() { stopFlood(); wg.Wait() }()
	require.Eventually(t, func() bool { return answered.Load() >= 20 }, 30*time.Second, 10*time.Millisecond,
		"the flood is on: as many forged reviews answered as there are workers")

	const checks = 20
	var slowest time.Duration
	for i := range checks {
		t0 := time.Now()
		err := dryRunDelete(ctx, kube, "gone")
		slowest = max(slowest, time.Since(t0))
		require.NoError(t, err, "check %d: the Node whose DockerMachine is gone must be allowed during the flood", i)
		t0 = time.Now()
		err = dryRunDelete(ctx, kube, "linked")
		slowest = max(slowest, time.Since(t0))
		require.Error(t, err, "check %d", i)
		require.Contains(t, err.Error(), "DockerMachine default/linked", "check %d: denied for its blocker, not for overload", i)
	}
	stopFlood()
	wg.Wait()
	t.Logf("during a flood of %d forged reviews (%d answered) from 20 workers: %d real reviews all correct, slowest %s",
		sent.Load(), answered.Load(), 2*checks, slowest.Round(time.Millisecond))
	assert.Greater(t, answered.Load(), int64(100), "the flood did reach nodeguard")
}

// forgedReview is a DELETE review of a real Node, as the API server would
// send it, from a caller that is not the API server.
func forgedReview(node, user string) []byte {
	obj, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": node, "annotations": map[string]any{
			"cluster.x-k8s.io/cluster-namespace": "default", "cluster.x-k8s.io/machine": node}},
		"spec": map[string]any{"providerID": "docker:////" + node}})
	b, _ := json.Marshal(map[string]any{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
		"request": map[string]any{"uid": "forged-" + user, "operation": "DELETE", "name": node,
			"kind": map[string]any{"group": "", "version": "v1", "kind": "Node"}, "oldObject": json.RawMessage(obj),
			"userInfo": map[string]any{"username": user}}})
	return b
}
