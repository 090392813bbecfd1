package main

import (
	"archive/tar"
	"context"
	"encoding/json"
	"flag"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/policies"
)

// imagePlatforms are the platforms the image test builds: linux/amd64 in
// `make test` (another architecture recompiles every dependency, minutes on
// a cold cache), all the image ships in `make image`.
var imagePlatforms = flag.String("image-platforms", "linux/amd64", "comma-separated OS/ARCH list the image test builds")

// Two builds of the same source give one digest; the index holds one image
// per platform; the amd64 image holds only the static binary, runs as 65532,
// carries the labels, and its binary says which version and commit it is.
func TestImageIsReproducibleAndRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the image test compiles nodeguard per platform, twice")
	}
	root, err := filepath.Abs("../../..")
	require.NoError(t, err)
	platforms := strings.Split(*imagePlatforms, ",")
	require.Contains(t, platforms, "linux/amd64", "the image's contents are checked on linux/amd64")
	o := options{
		platforms: platforms,
		version:   "v9.9.9-test",
		revision:  "0123456789abcdef0123456789abcdef01234567",
		source:    "https://example.com/nodeguard",
		created:   time.Unix(1700000000, 0).UTC(),
		root:      root,
	}
	ctx := context.Background()
	o.out = filepath.Join(t.TempDir(), "one")
	first, err := run(ctx, o)
	require.NoError(t, err)
	o.out = filepath.Join(t.TempDir(), "two")
	second, err := run(ctx, o)
	require.NoError(t, err)
	assert.Equal(t, first, second, "same source, same digest")

	p, err := layout.FromPath(o.out)
	require.NoError(t, err)
	outer, err := p.ImageIndex()
	require.NoError(t, err)
	idx, err := outer.ImageIndex(first)
	require.NoError(t, err)
	m, err := idx.IndexManifest()
	require.NoError(t, err)
	require.Len(t, m.Manifests, len(platforms))
	assert.Equal(t, "v9.9.9-test", m.Annotations["org.opencontainers.image.version"])
	var indexed []string
	var amd64 v1.Hash
	for _, d := range m.Manifests {
		indexed = append(indexed, d.Platform.OS+"/"+d.Platform.Architecture)
		if d.Platform.Architecture == "amd64" {
			amd64 = d.Digest
		}
	}
	assert.ElementsMatch(t, o.platforms, indexed)

	img, err := idx.Image(amd64)
	require.NoError(t, err)
	cfg, err := img.ConfigFile()
	require.NoError(t, err)
	assert.Equal(t, "65532:65532", cfg.Config.User)
	assert.Equal(t, []string{"/nodeguard"}, cfg.Config.Entrypoint)
	assert.Equal(t, map[string]string{
		"org.opencontainers.image.title":    "nodeguard",
		"org.opencontainers.image.version":  "v9.9.9-test",
		"org.opencontainers.image.revision": o.revision,
		"org.opencontainers.image.source":   "https://example.com/nodeguard",
		"org.opencontainers.image.created":  "2023-11-14T22:13:20Z",
	}, cfg.Config.Labels)
	assert.Equal(t, o.created, cfg.Created.Time)

	// Unpack: one file, no shell or anything else.
	layers, err := img.Layers()
	require.NoError(t, err)
	require.Len(t, layers, 1)
	rc, err := layers[0].Uncompressed()
	require.NoError(t, err)
	defer rc.Close()
	tr := tar.NewReader(rc)
	dir := t.TempDir()
	var names []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		names = append(names, hdr.Name)
		assert.Equal(t, o.created, hdr.ModTime.UTC())
		f, err := os.OpenFile(filepath.Join(dir, filepath.Base(hdr.Name)), os.O_CREATE|os.O_WRONLY, 0o755)
		require.NoError(t, err)
		_, err = io.Copy(f, tr)
		require.NoError(t, err)
		require.NoError(t, f.Close())
	}
	assert.Equal(t, []string{"nodeguard"}, names)

	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skipf("cannot run the linux/amd64 binary on %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	out, err := exec.Command(filepath.Join(dir, "nodeguard"), "version", "-o", "json").Output()
	require.NoError(t, err)
	var v map[string]any
	require.NoError(t, json.Unmarshal(out, &v))
	assert.Equal(t, "v9.9.9-test", v["version"])
	assert.Equal(t, o.revision, v["commit"])
	want, err := policies.TemplateVersion()
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"source": "embedded", "version": want}, v["policy"])

	// Static: no ELF interpreter (a dynamic binary would need a libc the
	// image does not have).
	if file, err := exec.LookPath("file"); err == nil {
		desc, err := exec.Command(file, filepath.Join(dir, "nodeguard")).Output()
		require.NoError(t, err)
		assert.Contains(t, string(desc), "statically linked")
	}
}

// -push writes the index to a registry: here go-containerregistry's own
// registry on loopback, from which the same index digest is read back.
func TestImagePushesTheIndex(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the push test compiles nodeguard")
	}
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	root, err := filepath.Abs("../../..")
	require.NoError(t, err)
	ref := strings.TrimPrefix(reg.URL, "http://") + "/team/nodeguard:v9.9.9-test"
	o := options{
		platforms: []string{"linux/amd64"},
		version:   "v9.9.9-test",
		revision:  "0123456789abcdef0123456789abcdef01234567",
		source:    "https://example.com/nodeguard",
		created:   time.Unix(1700000000, 0).UTC(),
		root:      root,
		out:       t.TempDir(),
		push:      ref,
	}
	digest, err := run(context.Background(), o)
	require.NoError(t, err)
	r, err := name.ParseReference(ref)
	require.NoError(t, err)
	pulled, err := remote.Index(r)
	require.NoError(t, err)
	got, err := pulled.Digest()
	require.NoError(t, err)
	assert.Equal(t, digest, got, "the registry holds the index make image printed")
}
