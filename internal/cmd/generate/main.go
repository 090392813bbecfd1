// Command generate writes, from the Rego in policies/: the Gatekeeper
// manifests in constraints/, docs/policy.md, the decision snapshots in
// docs/decisions.md, the version ledger versions.yaml and clusterctl's
// metadata.yaml; and, from
// internal/monitoring, the alerts and dashboard of both install paths. It
// refuses when decisions changed but the template version did not. With
// -check it writes nothing and fails when a committed file differs from what
// it would write, which is how CI catches hand edits and missing bumps.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/internal/addon"
	"github.com/nodeguard/nodeguard/internal/constraints"
	"github.com/nodeguard/nodeguard/internal/monitoring"
	"github.com/nodeguard/nodeguard/internal/policydoc"
	"github.com/nodeguard/nodeguard/policies"
)

func main() {
	root := flag.String("root", ".", "repository root")
	check := flag.Bool("check", false, "fail if a generated file is missing or differs, instead of writing")
	version := flag.Bool("version", false, "print the template version and exit")
	flag.Parse()
	if *version {
		info, err := constraints.LoadInfo()
		if err != nil {
			fmt.Fprintln(os.Stderr, "generate:", err)
			os.Exit(1)
		}
		fmt.Println(info.Version)
		return
	}
	if err := run(context.Background(), *root, *check); err != nil {
		fmt.Fprintln(os.Stderr, "generate:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, root string, check bool) error {
	rendered, err := constraints.Render(ctx)
	if err != nil {
		return err
	}
	files := map[string][]byte{}
	for name, b := range rendered {
		files[filepath.Join("constraints", name)] = b
	}
	docs, err := reviewDocs(ctx, root, check)
	if err != nil {
		return err
	}
	for name, b := range docs {
		files[name] = b
	}
	ledger, err := admissionPolicyLedger(root, rendered, check)
	if err != nil {
		return err
	}
	maps.Copy(files, ledger)
	// clusterctl's metadata.yaml: a release series per minor of the ledger.
	entries, err := policydoc.ParseLedger(files["versions.yaml"])
	if err != nil {
		return err
	}
	if files[addon.MetadataFile], err = addon.Metadata(entries); err != nil {
		return err
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		return fmt.Errorf("read README.md: %w", err)
	}
	if files["README.md"], err = policydoc.SpliceLinks(ctx, readme); err != nil {
		return err
	}
	operate, err := os.ReadFile(filepath.Join(root, monitoring.OperateDocPath))
	if err != nil {
		return fmt.Errorf("read %s: %w", monitoring.OperateDocPath, err)
	}
	mon, err := monitoring.Render(operate)
	if err != nil {
		return err
	}
	maps.Copy(files, mon)
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	var stale []string
	for _, name := range names {
		path := filepath.Join(root, name)
		if check {
			have, err := os.ReadFile(path)
			if err != nil || !bytes.Equal(have, files[name]) {
				stale = append(stale, path)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return fmt.Errorf("create the directory of %s: %w", path, err)
		}
		if err := os.WriteFile(path, files[name], 0o644); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	if len(stale) > 0 {
		return fmt.Errorf("%v out of date with policies/ or internal/monitoring (or hand-edited); run `make generate` and commit the result", stale)
	}
	return nil
}

// reviewDocs renders docs/policy.md, docs/decisions.md and each template's
// ledger, and enforces the versioning rules against the committed snapshots.
func reviewDocs(ctx context.Context, root string, check bool) (map[string][]byte, error) {
	defaults, err := constraints.LoadDefaults(ctx)
	if err != nil {
		return nil, err
	}
	policy, err := policydoc.RenderPolicy(ctx)
	if err != nil {
		return nil, err
	}
	scenarios, err := policydoc.Scenarios(root)
	if err != nil {
		return nil, err
	}
	snaps, err := policydoc.Decide(ctx, scenarios)
	if err != nil {
		return nil, err
	}
	committed, err := readOptional(filepath.Join(root, "docs", "decisions.md")) // absent: first run
	if err != nil {
		return nil, err
	}
	changelog, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		return nil, fmt.Errorf("read CHANGELOG.md: %w", err)
	}
	var synced []string
	for _, g := range constraints.SyncedGVKs(defaults) {
		synced = append(synced, g.Group+"/"+g.Kind)
	}
	sort.Strings(synced) // order in the Rego is not a change
	out := map[string][]byte{filepath.Join("docs", "policy.md"): policy}
	// Both templates decide with the library on the same facts (the
	// external one on nodeguard's answer), so one set of snapshots serves
	// both ledgers; each has its own versions.
	for _, t := range constraints.Templates() {
		info, err := constraints.LoadInfoOf(t.Entry)
		if err != nil {
			return nil, err
		}
		if t.Entry == policies.GatekeeperEntry {
			out[filepath.Join("docs", "decisions.md")] = policydoc.RenderDecisions(info.Version, snaps)
		}
		rawLedger, err := readOptional(filepath.Join(root, t.Ledger)) // absent: no versions yet
		if err != nil {
			return nil, err
		}
		ledger, err := policydoc.ParseLedger(rawLedger)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", t.Ledger, err)
		}
		cur := policydoc.Entry{Version: info.Version, Decisions: policydoc.Digest(snaps), Sync: []string{}}
		if t.Synced {
			cur.Sync = synced
		}
		updated, err := ledger.Record(t.Entry, cur, policydoc.Changed(committed, snaps))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", info.Kind, err)
		}
		if check && len(updated) != len(ledger) {
			return nil, fmt.Errorf("%s version %s has no entry in %s: run `make generate` and commit the result", info.Kind, info.Version, t.Ledger)
		}
		if err := policydoc.CheckChangelog(changelog, info.Kind, info.Version); err != nil {
			return nil, err
		}
		if out[t.Ledger], err = updated.Render(info.Kind); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// admissionPolicyLedger records the admission policy's version against the
// digest of its generated manifests: a changed policy or binding needs a new
// version (and its CHANGELOG section), as a changed decision does.
func admissionPolicyLedger(root string, rendered map[string][]byte, check bool) (map[string][]byte, error) {
	info, err := admission.LoadPolicyInfo()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join("constraints", constraints.AdmissionPolicyDir)
	var manifests []string
	for name := range rendered {
		if filepath.Dir(name) == constraints.AdmissionPolicyDir {
			manifests = append(manifests, name)
		}
	}
	sort.Strings(manifests)
	h := sha256.New()
	for _, name := range manifests {
		h.Write([]byte(name + "\n"))
		h.Write(rendered[name])
	}
	path := filepath.Join(dir, "versions.yaml")
	raw, err := readOptional(filepath.Join(root, path))
	if err != nil {
		return nil, err
	}
	ledger, err := policydoc.ParseLedger(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	cur := policydoc.Entry{Version: info.Version, Decisions: fmt.Sprintf("sha256:%x", h.Sum(nil)), Sync: []string{}}
	updated, err := ledger.Record(admission.PolicyEntry, cur, []string{"the generated " + strings.Join(manifests, " and ")})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", info.Kind, err)
	}
	if check && len(updated) != len(ledger) {
		return nil, fmt.Errorf("%s version %s has no entry in %s: run `make generate` and commit the result", info.Kind, info.Version, path)
	}
	changelog, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		return nil, fmt.Errorf("read CHANGELOG.md: %w", err)
	}
	if err := policydoc.CheckChangelog(changelog, info.Kind, info.Version); err != nil {
		return nil, err
	}
	b, err := updated.RenderManifests(info.Kind, dir)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{path: b}, nil
}

// readOptional reads a file that may not exist yet; any other error stops
// generate, so an unreadable ledger is never replaced by a fresh one.
func readOptional(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return b, nil
}
