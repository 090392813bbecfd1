// Command generate writes the Gatekeeper manifests in constraints/ from the
// Rego in policies/. With -check it writes nothing and fails when a committed
// file differs from what it would write, which is how CI catches hand edits.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/nodeguard/nodeguard/internal/gatekeeper"
)

func main() {
	dir := flag.String("dir", "constraints", "directory the generated files belong in")
	check := flag.Bool("check", false, "fail if a generated file is missing or differs, instead of writing")
	flag.Parse()
	if err := run(context.Background(), *dir, *check); err != nil {
		fmt.Fprintln(os.Stderr, "generate:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dir string, check bool) error {
	files, err := gatekeeper.Render(ctx)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	var stale []string
	for _, name := range names {
		path := filepath.Join(dir, name)
		if check {
			have, err := os.ReadFile(path)
			if err != nil || !bytes.Equal(have, files[name]) {
				stale = append(stale, path)
			}
			continue
		}
		if err := os.WriteFile(path, files[name], 0o644); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	if len(stale) > 0 {
		return fmt.Errorf("%v out of date with policies/; run `make generate` and commit the result", stale)
	}
	return nil
}
