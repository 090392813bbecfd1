// This file loads nodeguard's rule from a signed OPA bundle (the
// tarball `make bundle` writes, or a directory), verified with OPA's own
// bundle verification before anything in it is compiled, and keeps a running
// Engine on the newest valid bundle when the file changes.

package rule

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/open-policy-agent/opa/v1/ast"
	opabundle "github.com/open-policy-agent/opa/v1/bundle"
)

// BundleOptions are the --bundle flags, named as OPA names them.
type BundleOptions struct {
	// Path is a bundle tarball (.tar.gz) or a directory holding one unpacked.
	Path string
	// VerificationKeyFile is the PEM public key (or HMAC secret) the bundle's
	// .signatures.json must verify with. Required: an unsigned bundle is
	// refused.
	VerificationKeyFile string
	// KeyID names the key (OPA's --verification-key-id); a signature whose
	// JWT names another key ID is refused. Default DefaultKeyID.
	KeyID string
	// Algorithm of the key (default RS256, what `make bundle` signs with).
	Algorithm string
	// Scope, when set, must equal the signature's scope claim (OPA's --scope).
	Scope string
}

// Defaults as OPA's CLI has them.
const (
	DefaultKeyID     = "default"
	DefaultAlgorithm = "RS256"
)

// LoadBundle reads, verifies and compiles the bundle and prepares the rule's entry
// point from it. Any failure (no signature, a file that does not match it,
// another key, Rego that does not compile, no entry point) is an error and
// nothing of the bundle is used.
func LoadBundle(ctx context.Context, opts BundleOptions) (*Engine, error) {
	b, err := read(opts)
	if err != nil {
		return nil, fmt.Errorf("bundle %s: %w", opts.Path, err)
	}
	e, err := compile(ctx, b)
	if err != nil {
		return nil, fmt.Errorf("bundle %s (revision %q): %w", opts.Path, b.Manifest.Revision, err)
	}
	return e, nil
}

// LoadEngine runs the verified bundle's policy when opts.Path is set, else the
// embedded rule.
func LoadEngine(ctx context.Context, opts BundleOptions) (*Engine, error) {
	if opts.Path == "" {
		return NewEngine(ctx)
	}
	return LoadBundle(ctx, opts)
}

func read(opts BundleOptions) (opabundle.Bundle, error) {
	if opts.VerificationKeyFile == "" {
		return opabundle.Bundle{}, errors.New("--bundle-verification-key is required: nodeguard runs only signed bundles")
	}
	key, err := os.ReadFile(opts.VerificationKeyFile)
	if err != nil {
		return opabundle.Bundle{}, fmt.Errorf("read verification key: %w", err)
	}
	keyID, alg := cmp.Or(opts.KeyID, DefaultKeyID), cmp.Or(opts.Algorithm, DefaultAlgorithm)
	verify := opabundle.NewVerificationConfig(map[string]*opabundle.KeyConfig{
		keyID: {Key: string(key), Algorithm: alg},
	}, keyID, opts.Scope, nil)

	info, err := os.Stat(opts.Path)
	if err != nil {
		return opabundle.Bundle{}, fmt.Errorf("open: %w", err)
	}
	var loader opabundle.DirectoryLoader
	if info.IsDir() {
		loader = opabundle.NewDirectoryLoader(opts.Path)
	} else {
		f, err := os.Open(opts.Path)
		if err != nil {
			return opabundle.Bundle{}, fmt.Errorf("open: %w", err)
		}
		defer f.Close()
		loader = opabundle.NewTarballLoaderWithBaseURL(f, "")
	}
	b, err := opabundle.NewCustomReader(loader).
		WithBundleVerificationConfig(verify).
		WithRegoVersion(ast.RegoV1).
		Read()
	if err != nil {
		return opabundle.Bundle{}, fmt.Errorf("read and verify: %w", err)
	}
	return b, nil
}

func compile(ctx context.Context, b opabundle.Bundle) (*Engine, error) {
	modules := make(map[string]*ast.Module, len(b.Modules))
	for _, m := range b.Modules {
		modules[m.Path] = m.Parsed
	}
	c := ast.NewCompiler()
	if c.Compile(modules); c.Failed() {
		return nil, fmt.Errorf("compile: %w", c.Errors)
	}
	return CompileEngine(ctx, c, b.Data, Policy{Source: SourceBundle, Revision: b.Manifest.Revision})
}
