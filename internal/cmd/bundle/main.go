// Command bundle writes nodeguard's OPA bundle (see package bundle).
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/nodeguard/nodeguard/bundle"
)

func main() {
	out := flag.String("o", "build/nodeguard-bundle.tar.gz", "output tarball")
	revision := flag.String("revision", "", "revision recorded in the manifest (e.g. the git commit)")
	key := flag.String("signing-key", "", "PEM private key, or a path to one, to sign the bundle with (RS256)")
	flag.Parse()
	if err := run(context.Background(), *out, bundle.Options{Revision: *revision, SigningKey: *key}); err != nil {
		fmt.Fprintln(os.Stderr, "bundle:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out string, opts bundle.Options) error {
	var buf bytes.Buffer
	if err := bundle.Build(ctx, &buf, opts); err != nil {
		return err
	}
	if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	signed := "unsigned"
	if opts.SigningKey != "" {
		signed = "signed"
	}
	fmt.Printf("wrote %s (%s, revision %q, %d bytes)\n", out, signed, opts.Revision, buf.Len())
	return nil
}
