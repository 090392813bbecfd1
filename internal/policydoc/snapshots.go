// Package policydoc renders what a reviewer reads instead of running the
// policy: docs/policy.md (the rule, links, parameters, semantics, from the
// Rego's annotations and defaults), docs/decisions.md (the decision of every
// named scenario) and versions.yaml (one entry per template
// version, so a changed decision without a version bump fails CI).
package policydoc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// Scenario is one named delete to judge.
type Scenario struct {
	Name       string
	Review     map[string]any
	Objects    []*unstructured.Unstructured
	Parameters map[string]any
}

// Snapshot is a scenario's decision, as the table shows it.
type Snapshot struct {
	Name     string
	Decision string // "allowed", "denied" or "not judged"
	Reason   string
	Blockers []string
	Warnings int
}

type suite struct {
	Tests []struct {
		Name       string `json:"name"`
		Constraint string `json:"constraint"`
		Cases      []struct {
			Name      string   `json:"name"`
			Object    string   `json:"object"`
			Inventory []string `json:"inventory"`
		} `json:"cases"`
	} `json:"tests"`
}

// Scenarios reads the gator suite's cases (constraints/suite.yaml) and one
// Node delete per Node of each examples/ directory, under root.
func Scenarios(root string) ([]Scenario, error) {
	raw, err := os.ReadFile(filepath.Join(root, "constraints", "suite.yaml"))
	if err != nil {
		return nil, fmt.Errorf("read suite: %w", err)
	}
	var s suite
	if err := yaml.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("parse constraints/suite.yaml: %w", err)
	}
	var out []Scenario
	for _, t := range s.Tests {
		params, err := facts.ConstraintParameters(filepath.Join(root, "constraints", t.Constraint))
		if err != nil {
			return nil, err
		}
		for _, c := range t.Cases {
			// gator's object is an AdmissionReview (no metadata.name) or an object.
			raw, err := os.ReadFile(filepath.Join(root, "constraints", c.Object))
			if err != nil {
				return nil, fmt.Errorf("case %s: %w", c.Name, err)
			}
			obj := &unstructured.Unstructured{}
			if err := yaml.Unmarshal(raw, &obj.Object); err != nil {
				return nil, fmt.Errorf("case %s: parse %s: %w", c.Name, c.Object, err)
			}
			var inv []*unstructured.Unstructured
			for _, f := range c.Inventory {
				o, err := facts.LoadManifests(filepath.Join(root, "constraints", f))
				if err != nil {
					return nil, err
				}
				inv = append(inv, o...)
			}
			out = append(out, Scenario{Name: "suite/" + t.Name + "/" + c.Name, Review: reviewOf(obj), Objects: inv, Parameters: params})
		}
	}
	dirs, err := filepath.Glob(filepath.Join(root, "examples", "*"))
	if err != nil {
		return nil, fmt.Errorf("list examples: %w", err)
	}
	sort.Strings(dirs)
	for _, dir := range dirs {
		objs, err := facts.LoadManifests(dir)
		if err != nil {
			return nil, err
		}
		for _, o := range objs {
			if o.GetAPIVersion() != "v1" || o.GetKind() != "Node" {
				continue
			}
			review := map[string]any{"operation": "DELETE", "kind": map[string]any{"group": "", "version": "v1", "kind": "Node"},
				"name": o.GetName(), "oldObject": o.Object, "userInfo": map[string]any{"username": "kubernetes-admin"}}
			out = append(out, Scenario{Name: "examples/" + filepath.Base(dir) + "/" + o.GetName(), Review: review, Objects: objs})
		}
	}
	return out, nil
}

// reviewOf turns a gator case object into the rule's review: an
// AdmissionReview's request, or (a plain object) an audit review.
func reviewOf(o *unstructured.Unstructured) map[string]any {
	if o.GetKind() == "AdmissionReview" {
		req, _, _ := unstructured.NestedMap(o.Object, "request")
		return req
	}
	gvk := o.GroupVersionKind()
	return map[string]any{"kind": map[string]any{"group": gvk.Group, "version": gvk.Version, "kind": gvk.Kind},
		"name": o.GetName(), "object": o.Object}
}

// Decide judges every scenario with the rule over the full objects, laid out
// as Gatekeeper's inventory.
func Decide(ctx context.Context, scenarios []Scenario) ([]Snapshot, error) {
	eval, err := rule.NewEngine(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Snapshot, 0, len(scenarios))
	for _, s := range scenarios {
		params, err := rule.NewParameters(s.Parameters)
		if err != nil {
			return nil, fmt.Errorf("scenario %s: %w", s.Name, err)
		}
		d, err := rule.Evaluate(ctx, eval, rule.Input{Review: s.Review, Inventory: facts.Layout(s.Objects), Parameters: params})
		if err != nil {
			return nil, fmt.Errorf("scenario %s: %w", s.Name, err)
		}
		snap := Snapshot{Name: s.Name, Decision: "denied", Reason: d.Reason, Warnings: len(d.Warnings)}
		if d.Allowed {
			snap.Decision = "allowed"
		}
		if d.Reason == rule.ReasonNotJudged {
			snap.Decision, snap.Reason = "not judged", "-"
		}
		for _, b := range d.Blockers {
			snap.Blockers = append(snap.Blockers, fmt.Sprintf("%s %s/%s%s via %s", b.Kind, b.Namespace, b.Name, deleting(b.Deleting), linkTypes(b.Links)))
		}
		for _, u := range d.Unverified {
			snap.Blockers = append(snap.Blockers, fmt.Sprintf("unverified %s %s/%s via %s", u.Kind, u.Namespace, u.Name, linkTypes(u.Links)))
		}
		out = append(out, snap)
	}
	return out, nil
}

func deleting(d bool) string {
	if d {
		return " (deleting)"
	}
	return ""
}

func linkTypes(links []rule.BlockerLink) string {
	seen := map[string]bool{}
	var out []string
	for _, l := range links {
		if !seen[l.Type] {
			seen[l.Type] = true
			out = append(out, l.Type)
		}
	}
	sort.Strings(out)
	return strings.Join(out, "+")
}

// row is a snapshot's table row; the digest and the diff are over rows.
func (s Snapshot) row() string {
	blockers := "-"
	if len(s.Blockers) > 0 {
		blockers = strings.Join(s.Blockers, "; ")
	}
	warn := ""
	if s.Warnings > 0 {
		warn = fmt.Sprintf(" (%d warning)", s.Warnings)
	}
	return fmt.Sprintf("| `%s` | %s%s | %s | %s |", s.Name, s.Decision, warn, s.Reason, blockers)
}

// Digest identifies a set of decisions.
func Digest(snaps []Snapshot) string {
	h := sha256.New()
	for _, s := range snaps {
		fmt.Fprintln(h, s.row())
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// RenderDecisions is docs/decisions.md.
func RenderDecisions(version string, snaps []Snapshot) []byte {
	var b strings.Builder
	b.WriteString("<!-- Generated by `make generate` from policies/, constraints/suite.yaml and examples/. Do not edit. -->\n")
	b.WriteString("# Decision snapshots\n\n")
	fmt.Fprintf(&b, "Template version **%s**, decisions `%s`.\n\n", version, Digest(snaps))
	b.WriteString("Every named scenario (the gator suite's cases and the Nodes of `examples/`) and what the rule decides.\n")
	b.WriteString("A change to the rule that changes a row shows up here, in the same pull request; it needs a\n")
	b.WriteString("version bump (see CONTRIBUTING.md), or `make generate` refuses and CI fails naming the rows.\n\n")
	b.WriteString("| scenario | decision | reason | blockers (kind namespace/name via links) |\n|---|---|---|---|\n")
	for _, s := range snaps {
		b.WriteString(s.row() + "\n")
	}
	return []byte(b.String())
}

// Changed names the scenarios whose rows differ between two renderings of
// docs/decisions.md (added and removed scenarios included).
func Changed(committed []byte, snaps []Snapshot) []string {
	old := map[string]string{}
	for _, line := range strings.Split(string(committed), "\n") {
		if name, ok := rowName(line); ok {
			old[name] = line
		}
	}
	var out []string
	for _, s := range snaps {
		if old[s.Name] != s.row() {
			out = append(out, s.Name)
		}
		delete(old, s.Name)
	}
	for name := range old {
		out = append(out, name+" (removed)")
	}
	sort.Strings(out)
	return out
}

func rowName(line string) (string, bool) {
	rest, ok := strings.CutPrefix(line, "| `")
	if !ok {
		return "", false
	}
	name, _, ok := strings.Cut(rest, "`")
	return name, ok
}
