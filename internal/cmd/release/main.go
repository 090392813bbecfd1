// Command release writes the release artifacts clusterctl reads for the
// nodeguard add-on provider into a directory: addon-components.yaml, rendered
// from clusterctl/, and the committed metadata.yaml (which
// `make generate` keeps in step with versions.yaml). Upload both to the
// release; a clusterctl configuration's provider URL names the components.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nodeguard/nodeguard/internal/addon"
)

func main() {
	root := flag.String("root", ".", "repository root")
	out := flag.String("out", "build/release", "directory to write the artifacts to")
	flag.Parse()
	if err := run(*root, *out); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func run(root, out string) error {
	components, err := addon.Components(root)
	if err != nil {
		return err
	}
	metadata, err := os.ReadFile(filepath.Join(root, addon.MetadataFile))
	if err != nil {
		return fmt.Errorf("read %s (make generate writes it): %w", addon.MetadataFile, err)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", out, err)
	}
	for name, b := range map[string][]byte{addon.ComponentsFile: components, addon.MetadataFile: metadata} {
		if err := os.WriteFile(filepath.Join(out, name), b, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	fmt.Printf("%s: %s and %s; variables:", out, addon.ComponentsFile, addon.MetadataFile)
	for _, v := range addon.Variables(components) {
		if v.HasDefault {
			fmt.Printf(" %s (default %q)", v.Name, v.Default)
		} else {
			fmt.Printf(" %s (required)", v.Name)
		}
	}
	fmt.Println()
	return nil
}
