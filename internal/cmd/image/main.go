// Command image builds nodeguard's container image without a Docker daemon:
// a static binary per platform on an empty base, one OCI image index, written
// as an OCI layout. Everything that goes into it is fixed by the commit (the
// binary is built with -trimpath and no build ID, file times and the creation
// time are the commit's), so building twice gives the same index digest,
// which is printed as the last line. With -push, the index is also pushed.
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Where the binary lives in the image, and who runs it: the restricted Pod
// Security profile wants a non-root user; 65532 is the usual "nonroot".
const (
	binaryPath = "nodeguard"
	user       = "65532:65532"
	versionPkg = "github.com/nodeguard/nodeguard/enforcer/rule"
)

type options struct {
	out       string
	platforms []string
	version   string
	revision  string
	source    string
	created   time.Time
	push      string
	root      string // repository root, where ./enforcer/cmd/nodeguard is
	pin       string // repository to pin the chart and kustomization to
}

func main() {
	var (
		o         options
		platforms string
		epoch     int64
	)
	flag.StringVar(&o.out, "o", "build/image", "OCI layout directory to write (replaced)")
	flag.StringVar(&platforms, "platforms", "linux/amd64,linux/arm64", "comma-separated OS/ARCH list")
	flag.StringVar(&o.version, "version", "", "image version (label, `nodeguard version`)")
	flag.StringVar(&o.revision, "revision", "", "git commit (label, `nodeguard version`)")
	flag.StringVar(&o.source, "source", "https://github.com/nodeguard/nodeguard", "source repository URL (label)")
	flag.Int64Var(&epoch, "source-date-epoch", 0, "creation time and file times, seconds since 1970 (the commit time)")
	flag.StringVar(&o.root, "root", ".", "repository root")
	flag.StringVar(&o.pin, "pin", "", "point charts/nodeguard/values.yaml and enforcer/deploy/kustomization.yaml at this repository, the version and the digest")
	flag.StringVar(&o.push, "push", "", "also push the index to this reference, e.g. registry.example.com/nodeguard:v0.2.0")
	flag.Parse()
	o.platforms = strings.Split(platforms, ",")
	o.created = time.Unix(epoch, 0).UTC()
	digest, err := run(context.Background(), o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	fmt.Println(digest)
}

func run(ctx context.Context, o options) (v1.Hash, error) {
	if o.version == "" || o.revision == "" {
		return v1.Hash{}, fmt.Errorf("-version and -revision are required")
	}
	work, err := os.MkdirTemp("", "nodeguard-image-")
	if err != nil {
		return v1.Hash{}, fmt.Errorf("create work dir: %w", err)
	}
	defer os.RemoveAll(work)

	labels := map[string]string{
		"org.opencontainers.image.title":    "nodeguard",
		"org.opencontainers.image.version":  o.version,
		"org.opencontainers.image.revision": o.revision,
		"org.opencontainers.image.source":   o.source,
		"org.opencontainers.image.created":  o.created.Format(time.RFC3339),
	}
	var idx v1.ImageIndex = mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range o.platforms {
		platform, err := v1.ParsePlatform(p)
		if err != nil {
			return v1.Hash{}, fmt.Errorf("platform %q: %w", p, err)
		}
		bin, err := filepath.Abs(filepath.Join(work, platform.OS+"-"+platform.Architecture, "nodeguard"))
		if err != nil {
			return v1.Hash{}, err
		}
		if err := build(ctx, o, *platform, bin); err != nil {
			return v1.Hash{}, err
		}
		img, err := image(o, *platform, bin, labels)
		if err != nil {
			return v1.Hash{}, err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: platform}})
	}
	idx = mutate.Annotations(idx, labels).(v1.ImageIndex)
	digest, err := idx.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("index digest: %w", err)
	}
	if err := os.RemoveAll(o.out); err != nil {
		return v1.Hash{}, fmt.Errorf("clear %s: %w", o.out, err)
	}
	l, err := layout.Write(o.out, empty.Index)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("write layout %s: %w", o.out, err)
	}
	if err := l.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": o.version})); err != nil {
		return v1.Hash{}, fmt.Errorf("write index to %s: %w", o.out, err)
	}
	if o.push != "" {
		ref, err := name.ParseReference(o.push)
		if err != nil {
			return v1.Hash{}, fmt.Errorf("-push %q: %w", o.push, err)
		}
		if err := remote.WriteIndex(ref, idx, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
			return v1.Hash{}, fmt.Errorf("push %s: %w", ref, err)
		}
		fmt.Fprintf(os.Stderr, "pushed %s@%s\n", ref.Context(), digest)
	}
	if o.pin != "" {
		if err := pin(o.root, o.pin, o.version, digest.String()); err != nil {
			return v1.Hash{}, err
		}
		fmt.Fprintf(os.Stderr, "pinned %s and %s to %s:%s@%s\n", chartValues, kustomization, o.pin, o.version, digest)
	}
	return digest, nil
}

// build compiles a static nodeguard for one platform, reproducibly: no cgo,
// no file paths, no build ID, no VCS stamp (the version comes from -X).
func build(ctx context.Context, o options, p v1.Platform, out string) error {
	ldflags := fmt.Sprintf("-s -w -buildid= -X %s.linkVersion=%s -X %s.linkCommit=%s", versionPkg, o.version, versionPkg, o.revision)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", out, "./enforcer/cmd/nodeguard")
	cmd.Dir = o.root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Architecture)
	if p.Variant != "" && p.Architecture == "arm" {
		cmd.Env = append(cmd.Env, "GOARM="+strings.TrimPrefix(p.Variant, "v"))
	}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build for %s/%s: %w", p.OS, p.Architecture, err)
	}
	return nil
}

// image is the empty base plus one layer holding the binary.
func image(o options, p v1.Platform, bin string, labels map[string]string) (v1.Image, error) {
	layerTar, err := layerOf(bin, o.created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerTar)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: o.created}, CreatedBy: "nodeguard internal/cmd/image", Comment: "static nodeguard binary"},
	})
	if err != nil {
		return nil, fmt.Errorf("append layer: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture, cfg.Variant = p.OS, p.Architecture, p.Variant
	cfg.Created = v1.Time{Time: o.created}
	cfg.Config.Entrypoint = []string{"/" + binaryPath}
	cfg.Config.User = user
	cfg.Config.Labels = labels
	cfg.Config.Env = []string{"PATH=/"}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, fmt.Errorf("set config: %w", err)
	}
	return img, nil
}

// layerOf is a tar holding the binary at /nodeguard, owned by root and
// executable by all, with the fixed time.
func layerOf(bin string, mtime time.Time) ([]byte, error) {
	body, err := os.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("read binary: %w", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := &tar.Header{Name: binaryPath, Mode: 0o555, Size: int64(len(body)), ModTime: mtime, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, fmt.Errorf("layer tar: %w", err)
	}
	if _, err := tw.Write(body); err != nil {
		return nil, fmt.Errorf("layer tar: %w", err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("layer tar: %w", err)
	}
	return buf.Bytes(), nil
}
