// Package bundle builds the OPA bundle of nodeguard's policies: the rule
// library and the enforcer entry point (data.nodeguard.decision), tests
// excluded, with the .manifest beside this file and the revision from git.
package bundle

import (
	"context"
	_ "embed"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/open-policy-agent/opa/v1/ast"
	opabundle "github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/compile"

	"github.com/nodeguard/nodeguard/policies"
)

//go:embed .manifest
var manifest []byte

// Options say what to build.
type Options struct {
	Revision string // recorded in the manifest, e.g. the git commit
	// SigningKey, when set, is a PEM private key or a path to one; the
	// bundle then carries .signatures.json (RS256).
	SigningKey string
}

// Build writes a gzipped bundle tarball to w.
func Build(ctx context.Context, w io.Writer, opts Options) error {
	dir, err := os.MkdirTemp("", "nodeguard-bundle-")
	if err != nil {
		return fmt.Errorf("create staging dir: %w", err)
	}
	defer os.RemoveAll(dir)
	if err := stage(dir); err != nil {
		return err
	}
	c := compile.New().
		WithAsBundle(true).
		WithPaths(dir).
		WithRevision(opts.Revision).
		WithRegoVersion(ast.RegoV1).
		WithOutput(w)
	if opts.SigningKey != "" {
		c = c.WithBundleSigningConfig(opabundle.NewSigningConfig(opts.SigningKey, "RS256", ""))
	}
	if err := c.Build(ctx); err != nil {
		return fmt.Errorf("build bundle: %w", err)
	}
	return nil
}

// stage lays out the manifest and the non-test Rego files under dir.
func stage(dir string) error {
	if err := os.WriteFile(filepath.Join(dir, ".manifest"), manifest, 0o644); err != nil {
		return fmt.Errorf("stage manifest: %w", err)
	}
	files, err := policies.All()
	if err != nil {
		return err
	}
	for _, f := range files {
		if f.Path == policies.GatekeeperEntry {
			continue // reads data.inventory, which only Gatekeeper provides
		}
		path := filepath.Join(dir, filepath.FromSlash(f.Path))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return fmt.Errorf("stage %s: %w", f.Path, err)
		}
		if err := os.WriteFile(path, []byte(f.Source), 0o644); err != nil {
			return fmt.Errorf("stage %s: %w", f.Path, err)
		}
	}
	return nil
}
