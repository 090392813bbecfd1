package serve_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"

	"github.com/nodeguard/nodeguard/enforcer/kubeclient"
	"github.com/nodeguard/nodeguard/enforcer/manifest"
	"github.com/nodeguard/nodeguard/enforcer/policybundle"
	"github.com/nodeguard/nodeguard/enforcer/serve"
	"github.com/nodeguard/nodeguard/internal/testbundle"
	"github.com/nodeguard/nodeguard/internal/testcluster"
	"github.com/nodeguard/nodeguard/internal/testpki"
	"github.com/nodeguard/nodeguard/policies"
)

// server is a running `nodeguard serve` over a fake API server holding the
// CAPD example (its Node is blocked by its DockerMachine).
type server struct {
	base   string
	side   map[string]string // "metrics" and "health probes": their http base URLs
	client *http.Client
	review []byte
	done   chan error
	cancel context.CancelFunc
}

func startServe(t *testing.T, bundle policybundle.Options) (*server, error) {
	t.Helper()
	return startServeWith(t, serve.Options{Bundle: bundle})
}

// startServeWith is startServe with more of serve's options.
func startServeWith(t *testing.T, opts serve.Options) (*server, error) {
	t.Helper()
	client, mapper := testcluster.CAPD(t, "../../examples/capd-v1beta2", [2]string{"default", "dev"})
	ca := testpki.New(t)
	cert, key := ca.ServerFiles(t, "serving")
	ctx, cancel := context.WithCancel(context.Background())
	s := &server{done: make(chan error, 1), cancel: cancel,
		client: &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}}}}
	addr := make(chan net.Addr, 1)
	side := make(chan string, 2)
	go func() {
		s.done <- serve.RunWith(ctx, kubeclient.Clients{Dynamic: client, Mapper: mapper},
			serve.Options{Listen: "127.0.0.1:0", CertFile: cert, KeyFile: key, Bundle: opts.Bundle, Orphans: opts.Orphans,
				MetricsBindAddress: "127.0.0.1:0", HealthProbeBindAddress: "127.0.0.1:0",
				SideListening: func(name string, a net.Addr) { side <- name + "=" + a.String() }},
			slog.New(slog.NewJSONHandler(io.Discard, nil)), func(a net.Addr) { addr <- a })
	}()
	select {
	case a := <-addr:
		s.base = "https://" + a.String()
	case err := <-s.done:
		cancel()
		return nil, err
	}
	s.side = map[string]string{}
	for range 2 {
		name, a, _ := strings.Cut(<-side, "=")
		s.side[name] = "http://" + a
	}
	t.Cleanup(func() {
		s.cancel()
		assert.NoError(t, <-s.done)
	})
	require.Eventually(t, func() bool {
		resp, err := s.client.Get(s.side["health probes"] + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 10*time.Second, 20*time.Millisecond)
	objs, err := manifest.Load("../../examples/capd-v1beta2/node.yaml")
	require.NoError(t, err)
	node, _ := json.Marshal(objs[0].Object)
	s.review, _ = json.Marshal(map[string]any{
		"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
		"request": map[string]any{"uid": "u1", "operation": "DELETE", "name": objs[0].GetName(),
			"kind": map[string]any{"group": "", "version": "v1", "kind": "Node"}, "oldObject": json.RawMessage(node),
			"userInfo": map[string]any{"username": "alice"}},
	})
	return s, nil
}

// ask sends the review; an error is any answer that is not a decision.
func (s *server) ask() (*admissionv1.AdmissionResponse, error) {
	resp, err := s.client.Post(s.base+"/validate", "application/json", bytes.NewReader(s.review))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, err
	}
	if out.Response == nil || (out.Response.Result != nil && out.Response.Result.Code >= 500) {
		return nil, assert.AnError
	}
	return out.Response, nil
}

func (s *server) metrics(t *testing.T) string {
	t.Helper()
	resp, err := s.client.Get(s.side["metrics"] + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

func TestServeRefusesToStartOnABundleItCannotTrust(t *testing.T) {
	key := testbundle.NewKey(t)
	other := testbundle.NewKey(t)
	signed := testbundle.Nodeguard(t, "r1", key.Private)
	broken := testbundle.Sources(t)
	broken["nodeguard/decision.rego"] = "package nodeguard\n\ndecision := no_such_function(input)\n"
	noEntry := testbundle.Sources(t)
	delete(noEntry, "nodeguard/decision.rego")
	for name, tc := range map[string]struct {
		bundle []byte
		want   string
	}{
		"unsigned":          {testbundle.Nodeguard(t, "r1", ""), "bundle missing .signatures.json"},
		"tampered":          {testbundle.Tamper(t, signed), "digest mismatch"},
		"wrong key":         {testbundle.Nodeguard(t, "r1", other.Private), "verification error"},
		"does not compile":  {testbundle.Signed(t, broken, "r1", key.Private), "undefined function"},
		"lacks entry point": {testbundle.Signed(t, noEntry, "r1", key.Private), "no rule data.nodeguard.decision"},
	} {
		t.Run(name, func(t *testing.T) {
			path := testbundle.WriteFile(t, t.TempDir(), "bundle.tar.gz", tc.bundle)
			s, err := startServe(t, policybundle.Options{Path: path, VerificationKeyFile: key.PublicKeyFile})
			require.Error(t, err)
			assert.Nil(t, s)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// A new signed bundle replaces the policy while reviews keep coming; none
// fails, and a bad update afterwards leaves the new policy in place.
func TestServeReloadsTheBundleUnderLoad(t *testing.T) {
	key := testbundle.NewKey(t)
	path := filepath.Join(t.TempDir(), "bundle.tar.gz")
	require.NoError(t, os.WriteFile(path, testbundle.Nodeguard(t, "r1", key.Private), 0o600))
	s, err := startServe(t, policybundle.Options{Path: path, VerificationKeyFile: key.PublicKeyFile})
	require.NoError(t, err)
	m := s.metrics(t)
	assert.Contains(t, m, `nodeguard_policy_info{revision="r1",source="bundle",version=""} 1`)
	assert.Regexp(t, `nodeguard_build_info\{commit="[^"]+",goversion="go[^"]+",version="[^"]+"\} 1`, m)
	assert.Contains(t, m, "nodeguard_policy_reload_errors_total 0")

	r, err := s.ask()
	require.NoError(t, err)
	require.False(t, r.Allowed, "r1 is nodeguard's rule: the DockerMachine blocks")

	// Load: 4 clients asking in a loop until told to stop.
	var (
		allowed, denied, failed atomic.Int64
		firstErr                atomic.Pointer[error]
		stop                    = make(chan struct{})
		wg                      sync.WaitGroup
	)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				r, err := s.ask()
				switch {
				case err != nil:
					failed.Add(1)
					firstErr.CompareAndSwap(nil, &err)
				case r.Allowed:
					allowed.Add(1)
				default:
					denied.Add(1)
				}
			}
		}()
	}
	require.Eventually(t, func() bool { return denied.Load() > 20 }, 10*time.Second, 10*time.Millisecond)

	custom := testbundle.Sources(t)
	custom["nodeguard/decision.rego"] = testbundle.AllowAll
	writeAtomically(t, path, testbundle.Signed(t, custom, "r2", key.Private))
	require.Eventually(t, func() bool { return allowed.Load() > 20 }, 10*time.Second, 10*time.Millisecond,
		"the customized policy (allow all) starts deciding")

	writeAtomically(t, path, testbundle.Tamper(t, testbundle.Nodeguard(t, "r3", key.Private)))
	require.Eventually(t, func() bool {
		return bytes.Contains([]byte(s.metrics(t)), []byte("nodeguard_policy_reload_errors_total 1"))
	}, 10*time.Second, 20*time.Millisecond)
	before := allowed.Load()
	require.Eventually(t, func() bool { return allowed.Load() > before+20 }, 10*time.Second, 10*time.Millisecond,
		"r2 keeps deciding after the tampered update")
	close(stop)
	wg.Wait()

	if p := firstErr.Load(); p != nil {
		t.Errorf("first failure: %v", *p)
	}
	assert.Zero(t, failed.Load(), "no review failed across the reloads")
	t.Logf("reviews answered during the test: %d denied (r1), %d allowed (r2), %d failed", denied.Load(), allowed.Load(), failed.Load())
	r, err = s.ask()
	require.NoError(t, err)
	assert.True(t, r.Allowed)
	assert.Contains(t, s.metrics(t), `nodeguard_policy_info{revision="r2",source="bundle",version=""} 1`)
}

// EveryNodeAnOrphan is an orphan entry point that calls every Node an
// orphan: a stand-in for a team's customized criteria.
const everyNodeAnOrphan = `package nodeguard

orphan := {"node": input.node.metadata.name, "orphan": true, "managed": true, "cluster": "", "machine": "",
	"notReadySince": "", "reason": "customized", "kept": []}

orphan_screen := {"passes": true, "recheckAt": ""}
`

// The orphan scan runs the bundle's criteria, and a reloaded bundle's at
// once, like the webhook: not a copy of the embedded ones.
func TestServeScansOrphansWithTheBundlesCriteria(t *testing.T) {
	key := testbundle.NewKey(t)
	path := filepath.Join(t.TempDir(), "bundle.tar.gz")
	require.NoError(t, os.WriteFile(path, testbundle.Nodeguard(t, "r1", key.Private), 0o600))
	s, err := startServeWith(t, serve.Options{Bundle: policybundle.Options{Path: path, VerificationKeyFile: key.PublicKeyFile},
		Orphans: serve.ReapOptions{Interval: time.Hour}})
	require.NoError(t, err)
	gauge := func(want string) func() bool {
		return func() bool { return strings.Contains(s.metrics(t), `nodeguard_orphan_nodes{cluster=""} `+want) }
	}
	require.Eventually(t, gauge("0"), 10*time.Second, 20*time.Millisecond, "r1's criteria: the example's Node has its Machine")

	custom := testbundle.Sources(t)
	custom["nodeguard/orphans.rego"] = everyNodeAnOrphan
	writeAtomically(t, path, testbundle.Signed(t, custom, "r2", key.Private))
	require.Eventually(t, gauge("1"), 10*time.Second, 20*time.Millisecond,
		"r2's criteria judge every Node again on reload, well before the next full pass (an hour)")
}

func TestServeReportsTheEmbeddedPolicy(t *testing.T) {
	s, err := startServe(t, policybundle.Options{})
	require.NoError(t, err)
	v, err := policies.TemplateVersion()
	require.NoError(t, err)
	assert.Contains(t, s.metrics(t), `nodeguard_policy_info{revision="",source="embedded",version="`+v+`"} 1`)
}

func writeAtomically(t *testing.T, path string, b []byte) {
	t.Helper()
	tmp := path + ".new"
	require.NoError(t, os.WriteFile(tmp, b, 0o600))
	require.NoError(t, os.Rename(tmp, path))
}
