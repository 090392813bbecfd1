package policydoc

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/mod/semver"
	"sigs.k8s.io/yaml"
)

// Entry is what one template version decides and needs synced.
type Entry struct {
	Version   string   `json:"version"`
	Decisions string   `json:"decisions"`
	Sync      []string `json:"sync"`
}

// Ledger is versions.yaml, oldest first. An entry is written once,
// when its version first appears, and never rewritten.
type Ledger []Entry

// ledgerFile is versions.yaml: an object, not a bare list, so tools that
// read every YAML file under constraints/ as objects (gator verify
// ./constraints/...) can read it.
type ledgerFile struct {
	Versions Ledger `json:"versions"`
}

// ParseLedger reads versions.yaml (empty: no versions yet).
func ParseLedger(raw []byte) (Ledger, error) {
	var f ledgerFile
	if err := yaml.UnmarshalStrict(raw, &f); err != nil {
		return nil, fmt.Errorf("parse versions.yaml: %w", err)
	}
	return f.Versions, nil
}

func (l Ledger) marshal() ([]byte, error) { return yaml.Marshal(ledgerFile{Versions: l}) }

// Render writes the ledger back; kind names the template it is for.
func (l Ledger) Render(kind string) ([]byte, error) {
	out, err := l.marshal()
	if err != nil {
		return nil, fmt.Errorf("render the %s ledger: %w", kind, err)
	}
	return append([]byte("# One entry per "+kind+" template version: the digest of its decision snapshots\n"+
		"# (docs/decisions.md) and the kinds it needs synced. Written by `make generate`, which\n"+
		"# refuses to change an existing entry: a changed decision needs a new version.\n"), out...), nil
}

// RenderManifests writes back a ledger whose entries digest generated
// manifests rather than decision snapshots (the admission policy's).
func (l Ledger) RenderManifests(kind, dir string) ([]byte, error) {
	out, err := l.marshal()
	if err != nil {
		return nil, fmt.Errorf("render the %s ledger: %w", kind, err)
	}
	return append([]byte("# One entry per "+kind+" version: the digest of the manifests generated from it\n"+
		"# ("+dir+"/, as `decisions`). Written by `make generate`, which refuses to change an\n"+
		"# existing entry: a changed manifest needs a new version.\n"), out...), nil
}

// Record checks cur against the ledger and returns the ledger with cur in
// it. The rules (CONTRIBUTING.md): the same version must decide the same;
// a new version must be higher; changed decisions need at least a minor bump;
// a kind added to the sync data needs a major bump. changed names the
// scenarios whose decisions differ from the committed snapshots.
// entry is the template's entry point under policies/, for the messages.
func (l Ledger) Record(entry string, cur Entry, changed []string) (Ledger, error) {
	if !semver.IsValid("v" + cur.Version) {
		return nil, fmt.Errorf("template version %q is not semver (policies/%s METADATA custom.version)", cur.Version, entry)
	}
	for _, e := range l {
		if e.Version != cur.Version {
			continue
		}
		if e.Decisions != cur.Decisions {
			return nil, fmt.Errorf("decisions changed for %s, but version %s already decided otherwise "+
				"(its ledger): raise custom.version in policies/%s (a changed decision "+
				"is at least a minor bump), add it to CHANGELOG.md, then run `make generate`", list(changed), cur.Version, entry)
		}
		if !slices.Equal(e.Sync, cur.Sync) {
			return nil, fmt.Errorf("the synced kinds changed, but version %s already synced %v: raise custom.version "+
				"(adding a kind to sync is a major bump), add it to CHANGELOG.md, then run `make generate`", cur.Version, e.Sync)
		}
		return l, nil
	}
	if len(l) > 0 {
		last := l[len(l)-1]
		lv, cv := "v"+last.Version, "v"+cur.Version
		if semver.Compare(cv, lv) <= 0 {
			return nil, fmt.Errorf("version %s is not above the last recorded version %s", cur.Version, last.Version)
		}
		for _, k := range cur.Sync {
			if !slices.Contains(last.Sync, k) && semver.Major(cv) == semver.Major(lv) {
				return nil, fmt.Errorf("version %s syncs %s, which %s did not: requiring more synced data is a major bump", cur.Version, k, last.Version)
			}
		}
		if cur.Decisions != last.Decisions && semver.MajorMinor(cv) == semver.MajorMinor(lv) {
			return nil, fmt.Errorf("decisions changed for %s since %s: a patch bump (%s) is not enough, raise at least the minor version",
				list(changed), last.Version, cur.Version)
		}
	}
	return append(slices.Clone(l), cur), nil
}

func list(names []string) string {
	if len(names) == 0 {
		return "some scenarios"
	}
	return strings.Join(names, ", ")
}

// CheckChangelog fails unless CHANGELOG.md has a heading for the template
// kind's version: `## KIND VERSION` (or `## KIND [VERSION] - date`).
func CheckChangelog(changelog []byte, kind, version string) error {
	for _, line := range strings.Split(string(changelog), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == "##" && f[1] == kind && (f[2] == version || f[2] == "["+version+"]") {
			return nil
		}
	}
	return errors.New("CHANGELOG.md has no `## " + kind + " " + version + "` section for the template's version")
}
