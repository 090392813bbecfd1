//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/internal/testpki"
)

// The nodeguard binary, as deployed (GOGC=400, GOMEMLIMIT=400MiB), answers 8
// concurrent ~1 MiB hostile reviews, three rounds, with a peak RSS under
// 256 MiB; the container's limit is 512Mi. Before the Node was reduced to
// what the rule reads, the same load peaked at 628 MB. Two kinds alternate:
// Nodes full of empty objects, and users with 95,000 groups.
func TestHostileReviewsPeakRSS(t *testing.T) {
	_, env := apiServerEnv(t)
	bin := filepath.Join(t.TempDir(), "nodeguard")
	build := exec.Command("go", "build", "-o", bin, "../../enforcer/cmd/nodeguard")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	ca := testpki.New(t)
	cert, key := ca.ServerFiles(t, "nodeguard")
	listen, probes := fmt.Sprintf("127.0.0.1:%d", freePort(t)), fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cmd := exec.Command(bin, "serve", "--kubeconfig", adminKubeconfig(t, env),
		"--listen-address", listen, "--health-probe-bind-address", probes, "--metrics-bind-address", "0",
		"--tls-cert-file", cert, "--tls-private-key-file", key)
	cmd.Env = append(os.Environ(), "GOGC=400", "GOMEMLIMIT=400MiB")
	keepLog(t, "nodeguard", &cmd.Stdout, &cmd.Stderr)
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
	before := peakRSS(t, cmd.Process.Pid)

	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}}}
	nodes, users := make([][]byte, 8), make([][]byte, 8)
	for i := range nodes {
		nodes[i] = hostileReview(fmt.Sprintf("hostile-%d", i), nil)
		groups := make([]string, 95_000)
		for j := range groups {
			groups[j] = fmt.Sprintf("%d-%d", i, j)
		}
		users[i] = hostileReview("some-node", groups)
	}
	for round := range 4 {
		var wg sync.WaitGroup
		bodies := nodes
		if round%2 == 1 {
			bodies = users
		}
		for i, body := range bodies {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := client.Post("https://"+listen+"/validate", "application/json", bytes.NewReader(body))
				if !assert.NoError(t, err, "round %d review %d", round, i) {
					return
				}
				defer resp.Body.Close()
				assert.Equal(t, http.StatusOK, resp.StatusCode, "round %d review %d is judged, not refused", round, i)
			}()
		}
		wg.Wait()
	}
	peak := peakRSS(t, cmd.Process.Pid)
	t.Logf("nodeguard serve (GOGC=400, GOMEMLIMIT=400MiB): peak RSS %d MiB ready, %d MiB after 4 rounds of 8 concurrent ~%d KiB reviews",
		before>>20, peak>>20, len(nodes[0])>>10)
	assert.Less(t, peak, int64(256<<20))
}

// hostileReview is a ~1 MiB DELETE review: without groups, its Node holds
// 340,000 empty objects under spec; with them, the user is in all of them.
func hostileReview(name string, groups []string) []byte {
	junk := strings.Repeat("{},", 340_000)
	if groups != nil {
		junk = "{},"
	}
	node := `{"apiVersion":"v1","kind":"Node","metadata":{"name":"` + name + `"},"spec":{"taints":[` + junk[:len(junk)-1] + `]}}`
	b, _ := json.Marshal(map[string]any{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
		"request": map[string]any{"uid": "hostile-" + name, "operation": "DELETE", "name": name,
			"kind": map[string]any{"group": "", "version": "v1", "kind": "Node"}, "oldObject": json.RawMessage(node),
			"userInfo": map[string]any{"username": "mallory", "groups": groups}}})
	return b
}

// peakRSS is the process's high-water resident set (VmHWM), in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("no /proc to read the peak RSS from: %v", err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/PID/status")
	return 0
}
