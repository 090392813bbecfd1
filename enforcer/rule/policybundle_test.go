package rule_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/internal/testbundle"
)

// blockedReview is a DELETE of a Node whose DockerMachine still exists.
func blockedReview() rule.Input {
	node := map[string]any{
		"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": "n1"},
		"spec":     map[string]any{"providerID": "docker:////n1"},
	}
	infra := map[string]any{
		"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "DockerMachine",
		"metadata": map[string]any{"namespace": "default", "name": "n1"},
		"spec":     map[string]any{"providerID": "docker:////n1"},
	}
	return rule.Input{
		Review: map[string]any{
			"operation": "DELETE",
			"kind":      map[string]any{"group": "", "version": "v1", "kind": "Node"},
			"name":      "n1",
			"oldObject": node,
		},
		Inventory: map[string]any{"namespace": map[string]any{"default": map[string]any{
			"infrastructure.cluster.x-k8s.io/v1beta2": map[string]any{"DockerMachine": map[string]any{"n1": infra}},
		}}},
	}
}

func TestLoadAcceptsTheSignedBundleAsTarballAndDirectory(t *testing.T) {
	ctx := context.Background()
	key := testbundle.NewKey(t)
	tarball := testbundle.Nodeguard(t, "0.1.1+abc", key.Private)
	dir := t.TempDir()
	unpack(t, tarball, filepath.Join(dir, "unpacked"))
	embedded, err := rule.NewEngine(ctx)
	require.NoError(t, err)
	want, err := rule.Evaluate(ctx, embedded, blockedReview())
	require.NoError(t, err)
	require.False(t, want.Allowed)

	for name, path := range map[string]string{
		"tarball":   testbundle.WriteFile(t, dir, "bundle.tar.gz", tarball),
		"directory": filepath.Join(dir, "unpacked"),
	} {
		t.Run(name, func(t *testing.T) {
			e, err := rule.LoadBundle(ctx, rule.BundleOptions{Path: path, VerificationKeyFile: key.PublicKeyFile})
			require.NoError(t, err)
			assert.Equal(t, rule.Policy{Source: rule.SourceBundle, Revision: "0.1.1+abc"}, e.Policy())
			assert.Equal(t, embedded.DefaultParameters(), e.DefaultParameters())
			got, err := rule.Evaluate(ctx, e, blockedReview())
			require.NoError(t, err)
			assert.Equal(t, want, got, "the bundle decides like the embedded rule")
		})
	}
}

func TestLoadRefusesBundlesItCannotTrust(t *testing.T) {
	ctx := context.Background()
	key := testbundle.NewKey(t)
	signed := testbundle.Nodeguard(t, "r1", key.Private)
	dir := t.TempDir()

	type refusal struct {
		bundle []byte
		opts   rule.BundleOptions
		want   string
	}
	cases := map[string]refusal{
		"wrong scope":        {signed, rule.BundleOptions{Scope: "prod"}, "scope mismatch"},
		"no key given":       {signed, rule.BundleOptions{VerificationKeyFile: "-"}, "--bundle-verification-key is required"},
		"not a bundle":       {[]byte("hello"), rule.BundleOptions{}, "read and verify"},
		"key file not found": {signed, rule.BundleOptions{VerificationKeyFile: filepath.Join(dir, "nope.pem")}, "read verification key"},
	}
	for name, r := range testbundle.Refusals(t, key) {
		cases[name] = refusal{bundle: r.Bundle, want: r.Want}
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			opts := tc.opts
			opts.Path = testbundle.WriteFile(t, t.TempDir(), "bundle.tar.gz", tc.bundle)
			switch opts.VerificationKeyFile {
			case "":
				opts.VerificationKeyFile = key.PublicKeyFile
			case "-":
				opts.VerificationKeyFile = ""
			}
			e, err := rule.LoadBundle(ctx, opts)
			require.Error(t, err)
			assert.Nil(t, e)
			assert.Contains(t, err.Error(), tc.want)
			assert.Contains(t, err.Error(), opts.Path, "the error names the bundle")
		})
	}
}

func TestWatchSwapsInANewBundleAndKeepsTheOldOnABadOne(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	key := testbundle.NewKey(t)
	dir := t.TempDir()
	path := testbundle.WriteFile(t, dir, "bundle.tar.gz", testbundle.Nodeguard(t, "r1", key.Private))
	opts := rule.BundleOptions{Path: path, VerificationKeyFile: key.PublicKeyFile}
	running, err := rule.LoadBundle(ctx, opts)
	require.NoError(t, err)

	var ok, failed atomic.Int32
	lastErr := atomic.Pointer[error]{}
	go func() {
		_ = rule.WatchBundle(ctx, opts, running, slog.New(slog.DiscardHandler), func(err error) {
			if err != nil {
				failed.Add(1)
				lastErr.Store(&err)
				return
			}
			ok.Add(1)
		})
	}()

	// A customized policy (allow everything), signed: swapped in. The watch
	// is set up with no signal, so the bundle is written until its reload
	// shows (written again, the same bytes reload nothing).
	custom := testbundle.Sources(t)
	custom["nodeguard/decision.rego"] = testbundle.AllowAll
	r2 := testbundle.Signed(t, custom, "r2", key.Private)
	require.Eventually(t, func() bool {
		if ok.Load() > 0 {
			return true
		}
		_ = write(path, r2)
		return false
	}, 10*time.Second, watchRetry, "the watch sees the new bundle")
	assert.EqualValues(t, 1, ok.Load())
	assert.Equal(t, "r2", running.Policy().Revision)
	d, err := rule.Evaluate(ctx, running, blockedReview())
	require.NoError(t, err)
	assert.True(t, d.Allowed, "the new policy decides")

	// Tampered: refused, r2 keeps running.
	replace(t, path, testbundle.Tamper(t, testbundle.Nodeguard(t, "r3", key.Private)))
	require.Eventually(t, func() bool { return failed.Load() == 1 }, 10*time.Second, 20*time.Millisecond)
	assert.Contains(t, (*lastErr.Load()).Error(), "digest mismatch")
	assert.Equal(t, "r2", running.Policy().Revision)

	// Different defaults would leave the informers watching the old kinds.
	defaults := testbundle.Sources(t)
	defaults["lib/nodeguard/parameters.rego"] = string(bytes.Replace([]byte(defaults["lib/nodeguard/parameters.rego"]),
		[]byte(`"DockerMachine"`), []byte(`"DockerMachineX"`), 1))
	require.NotEqual(t, testbundle.Sources(t)["lib/nodeguard/parameters.rego"], defaults["lib/nodeguard/parameters.rego"])
	replace(t, path, testbundle.Signed(t, defaults, "r4", key.Private))
	require.Eventually(t, func() bool { return failed.Load() == 2 }, 10*time.Second, 20*time.Millisecond)
	assert.Contains(t, (*lastErr.Load()).Error(), "default parameters differ")
	assert.Equal(t, "r2", running.Policy().Revision)

	// Another link model would need other cached fields and indexes: refused.
	// Only its words changed: swapped in.
	words := testbundle.Sources(t)
	words["lib/nodeguard/links.rego"] = strings.Replace(words["lib/nodeguard/links.rego"],
		`"phrase": "its own spec.providerID",`, `"phrase": "its own spec.providerID (same field)",`, 1)
	require.NotEqual(t, testbundle.Sources(t)["lib/nodeguard/links.rego"], words["lib/nodeguard/links.rego"])
	replace(t, path, testbundle.Signed(t, words, "r4b", key.Private))
	require.Eventually(t, func() bool { return ok.Load() == 2 }, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, "r4b", running.Policy().Revision)
	model := testbundle.Sources(t)
	model["lib/nodeguard/links.rego"] = strings.Replace(model["lib/nodeguard/links.rego"],
		`"fields": [["spec", "providerIDList"]],`, `"fields": [["status", "providerIDList"]],`, 1)
	require.NotEqual(t, testbundle.Sources(t)["lib/nodeguard/links.rego"], model["lib/nodeguard/links.rego"])
	replace(t, path, testbundle.Signed(t, model, "r4c", key.Private))
	require.Eventually(t, func() bool { return failed.Load() == 3 }, 10*time.Second, 20*time.Millisecond)
	assert.Contains(t, (*lastErr.Load()).Error(), "another link model")
	assert.Equal(t, "r4b", running.Policy().Revision)

	// The embedded rule again, signed: back to denying.
	replace(t, path, testbundle.Nodeguard(t, "r5", key.Private))
	require.Eventually(t, func() bool { return ok.Load() == 3 }, 10*time.Second, 20*time.Millisecond)
	d, err = rule.Evaluate(ctx, running, blockedReview())
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	assert.Equal(t, "r5", running.Policy().Revision)
}

// replace writes b next to path and renames it over path, as careful
// writers (and kubelet) do.
func replace(t *testing.T, path string, b []byte) {
	t.Helper()
	require.NoError(t, write(path, b))
}

func write(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// watchRetry is how often a test writes a bundle again until the watch,
// set up with no signal, sees it: longer than the watch's settle (200 ms),
// which each write restarts.
const watchRetry = 500 * time.Millisecond

func unpack(t *testing.T, tarball []byte, dir string) {
	t.Helper()
	gz, err := gzip.NewReader(bytes.NewReader(tarball))
	require.NoError(t, err)
	tr := tar.NewReader(gz)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return
		}
		require.NoError(t, err)
		body, err := io.ReadAll(tr)
		require.NoError(t, err)
		p := filepath.Join(dir, filepath.FromSlash(hdr.Name))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, body, 0o600))
	}
}

// kubelet updates a mounted ConfigMap by swapping the ..data symlink; the
// bundle's own path is a symlink through it and never changes itself.
func TestWatchFollowsAConfigMapUpdate(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	key := testbundle.NewKey(t)
	dir := t.TempDir()
	version := func(name string, b []byte) error {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, name, "bundle.tar.gz"), b, 0o600); err != nil {
			return err
		}
		if err := os.Symlink(name, filepath.Join(dir, "..data_tmp")); err != nil {
			return err
		}
		return os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data"))
	}
	require.NoError(t, version("..v1", testbundle.Nodeguard(t, "r1", key.Private)))
	require.NoError(t, os.Symlink("..data/bundle.tar.gz", filepath.Join(dir, "bundle.tar.gz")))
	opts := rule.BundleOptions{Path: filepath.Join(dir, "bundle.tar.gz"), VerificationKeyFile: key.PublicKeyFile}
	running, err := rule.LoadBundle(ctx, opts)
	require.NoError(t, err)
	reloaded := make(chan error, 4)
	go func() {
		_ = rule.WatchBundle(ctx, opts, running, slog.New(slog.DiscardHandler), func(err error) { reloaded <- err })
	}()

	// The watch is set up with no signal: the swap is made until a reload
	// shows (made again, the same bundle reloads nothing).
	r2 := testbundle.Nodeguard(t, "r2", key.Private)
	var got error
	require.Eventually(t, func() bool {
		select {
		case got = <-reloaded:
			return true
		default:
			_ = version("..v2", r2)
			return false
		}
	}, 10*time.Second, watchRetry, "a reload after the ..data swap")
	require.NoError(t, got)
	assert.Equal(t, "r2", running.Policy().Revision)
}
