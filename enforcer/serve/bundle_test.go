package serve_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/enforcer/serve"
	"github.com/nodeguard/nodeguard/internal/testbundle"
	"github.com/nodeguard/nodeguard/policies"
)

func TestServeRefusesToStartOnABundleItCannotTrust(t *testing.T) {
	key := testbundle.NewKey(t)
	for name, tc := range testbundle.Refusals(t, key) {
		t.Run(name, func(t *testing.T) {
			path := testbundle.WriteFile(t, t.TempDir(), "bundle.tar.gz", tc.Bundle)
			s, err := startServe(t, rule.BundleOptions{Path: path, VerificationKeyFile: key.PublicKeyFile})
			require.Error(t, err)
			assert.Nil(t, s)
			assert.Contains(t, err.Error(), tc.Want)
		})
	}
}

// A new signed bundle replaces the policy while reviews keep coming; none
// fails, and a bad update afterwards leaves the new policy in place.
func TestServeReloadsTheBundleUnderLoad(t *testing.T) {
	key := testbundle.NewKey(t)
	path := filepath.Join(t.TempDir(), "bundle.tar.gz")
	require.NoError(t, os.WriteFile(path, testbundle.Nodeguard(t, "r1", key.Private), 0o600))
	s, err := startServe(t, rule.BundleOptions{Path: path, VerificationKeyFile: key.PublicKeyFile})
	require.NoError(t, err)
	m := s.metrics(t)
	assert.Contains(t, m, `nodeguard_policy_info{revision="r1",source="bundle",version=""} 1`)
	assert.Regexp(t, `nodeguard_build_info\{commit="[^"]+",goversion="go[^"]+",version="[^"]+"\} 1`, m)
	assert.Contains(t, m, "nodeguard_policy_reload_errors_total 0")

	r, err := s.ask("/validate")
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
				r, err := s.ask("/validate")
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
	r, err = s.ask("/validate")
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
	s, err := startServeWith(t, serve.Options{Bundle: rule.BundleOptions{Path: path, VerificationKeyFile: key.PublicKeyFile},
		Orphans: serve.ReapOptions{Interval: time.Hour}})
	require.NoError(t, err)
	gauge := func(want string) func() bool {
		return func() bool { return strings.Contains(s.metrics(t), `nodeguard_orphan_nodes{cluster=""} `+want) }
	}
	require.Eventually(t, gauge("0"), 10*time.Second, 20*time.Millisecond, "r1's criteria: the example's Node has its Machine")

	custom := testbundle.Sources(t)
	custom["nodeguard/verdicts.rego"] = everyNodeAnOrphan
	writeAtomically(t, path, testbundle.Signed(t, custom, "r2", key.Private))
	require.Eventually(t, gauge("1"), 10*time.Second, 20*time.Millisecond,
		"r2's criteria judge every Node again on reload, well before the next full pass (an hour)")
}

func TestServeReportsTheEmbeddedPolicy(t *testing.T) {
	s, err := startServe(t, rule.BundleOptions{})
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
