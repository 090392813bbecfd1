// Package policytest runs the Rego tests of policies/, or of a copy a Go test
// edits, in-process: as `opa test policies` runs them, or projected, with
// every entry point that takes an inventory, a Node or a review fed only what
// the enforcer keeps of them (records of the link model's role shapes, its
// Node shape and the Node caches' shape, and the user's groups the guard
// keeps). A rule that reads a
// field, or a group, the policy's declarations do not name passes its tests
// on full objects and fails projected, instead of failing open in the
// enforcer. The projection follows the declarations of the files run, so an
// edited copy is checked against its own.
package policytest

import (
	"context"
	"fmt"
	"maps"
	"path"
	"sort"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/tester"
	"github.com/open-policy-agent/opa/v1/types"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/record"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/policies"
)

// Files are Rego sources by path under policies/, tests included.
type Files map[string]string

// Load returns every Rego file of policies/, tests included.
func Load() (Files, error) {
	all, err := policies.WithTests()
	if err != nil {
		return nil, err
	}
	out := Files{}
	for _, f := range all {
		out[f.Path] = f.Source
	}
	return out, nil
}

// Clone returns a copy to edit.
func (f Files) Clone() Files { return maps.Clone(f) }

// Replace replaces the one occurrence of old in file path with new; it fails
// when old is not there exactly once, so an edit cannot silently miss.
func (f Files) Replace(file, old, new string) error {
	src, ok := f[file]
	if !ok {
		return fmt.Errorf("policies/%s: no such file", file)
	}
	if n := strings.Count(src, old); n != 1 {
		return fmt.Errorf("policies/%s holds %q %d times, want once", file, old, n)
	}
	f[file] = strings.Replace(src, old, new, 1)
	return nil
}

// Bundle returns what nodeguard's OPA bundle holds of the files: the non-test
// files under its roots (lib/nodeguard and nodeguard).
func (f Files) Bundle() map[string]string {
	out := map[string]string{}
	for p, src := range f {
		if !isTest(p) && (strings.HasPrefix(p, "lib/nodeguard/") || strings.HasPrefix(p, "nodeguard/")) {
			out[p] = src
		}
	}
	return out
}

// Compile compiles the files OPA itself can run, as policies.Compile compiles
// the embedded ones: no tests, no entry point calling a Gatekeeper builtin.
func (f Files) Compile() (*ast.Compiler, error) {
	modules := map[string]string{}
	for p, src := range f {
		if !isTest(p) && !strings.HasPrefix(p, path.Dir(policies.GatekeeperExternalEntry)+"/") {
			modules[p] = src
		}
	}
	c, err := ast.CompileModulesWithOpt(modules, ast.CompileOpts{ParserOptions: ast.ParserOptions{RegoVersion: ast.RegoV1, ProcessAnnotation: true}})
	if err != nil {
		return nil, fmt.Errorf("compile the policies: %w", err)
	}
	return c, nil
}

func isTest(p string) bool { return strings.HasSuffix(p, "_test.rego") }

// Result is what a run found.
type Result struct {
	Passed int
	// Failed names every test that did not pass (data.package.test), sorted.
	Failed []string
	// Errors are the evaluation errors of failed tests, by name.
	Errors map[string]string
}

// Run runs every Rego test of files, projected or as they are.
func Run(ctx context.Context, files Files, projected bool) (Result, error) {
	files = files.Clone()
	var custom []*tester.Builtin
	if projected {
		var err error
		if custom, err = project(ctx, files); err != nil {
			return Result{}, err
		}
	}
	// Gatekeeper's own builtins, which the K8sNodeGuardExternal tests
	// replace with their answers: declared, never run here.
	gatekeeper, err := policies.GatekeeperBuiltins()
	if err != nil {
		return Result{}, err
	}
	for _, b := range gatekeeper {
		f := &rego.Function{Name: b.Name, Decl: b.Decl}
		custom = append(custom, &tester.Builtin{Decl: b, Func: rego.FunctionDyn(f, func(rego.BuiltinContext, []*ast.Term) (*ast.Term, error) {
			return nil, fmt.Errorf("%s runs only in Gatekeeper: a test must replace it", f.Name)
		})})
	}
	modules := map[string]*ast.Module{}
	for p, src := range files {
		m, err := ast.ParseModuleWithOpts(p, src, ast.ParserOptions{RegoVersion: ast.RegoV1})
		if err != nil {
			return Result{}, fmt.Errorf("parse %s: %w", p, err)
		}
		modules[p] = m
	}
	ch, err := tester.NewRunner().SetDefaultRegoVersion(ast.RegoV1).AddCustomBuiltins(custom).CapturePrintOutput(false).Run(ctx, modules)
	if err != nil {
		return Result{}, fmt.Errorf("run the Rego tests: %w", err)
	}
	out := Result{Errors: map[string]string{}}
	for r := range ch {
		if r.Pass() {
			out.Passed++
			continue
		}
		name := r.Package + "." + r.Name
		if r.Error != nil {
			out.Errors[name] = r.Error.Error()
		}
		out.Failed = append(out.Failed, name)
	}
	sort.Strings(out.Failed)
	return out, nil
}

// The entry points that take an inventory, a Node or a review; each is
// renamed and wrapped so its callers, the tests included, get the projection.
func wrapped() []struct{ file, head, wrapper string } {
	return []struct{ file, head, wrapper string }{
		{"lib/nodeguard/decide.rego", "decide(review, inventory, parameters) :=",
			"package lib.nodeguard\n\ndecide(review, inventory, parameters) := _unprojected_decide(policytest_review(review, parameters), policytest_inventory(inventory, parameters), parameters)\n"},
		{"lib/nodeguard/follow.rego", "linked_machines(node, inventory, parameters) :=",
			"package lib.nodeguard\n\nlinked_machines(node, inventory, parameters) := _unprojected_linked_machines(policytest_node(node), policytest_inventory(inventory, parameters), parameters)\n"},
		{"nodeguard/orphans/orphans.rego", "verdict(node, inventory, parameters, now, grace, match_provider_id, tombstone) :=",
			"package nodeguard.orphans\n\nverdict(node, inventory, parameters, now, grace, match_provider_id, tombstone) := _unprojected_verdict(policytest_orphan_node(node), policytest_inventory(inventory, parameters), parameters, now, grace, match_provider_id, tombstone)\n"},
		// The ghost criteria judge Nodes the scan caches; a registration,
		// the Node a review carries.
		{"nodeguard/ghosts/ghosts.rego", "verdict(node, inventory, parameters, tombstone, now) :=",
			"package nodeguard.ghosts\n\nverdict(node, inventory, parameters, tombstone, now) := _unprojected_verdict(policytest_orphan_node(node), policytest_inventory(inventory, parameters), parameters, tombstone, now)\n"},
		{"nodeguard/ghosts/ghosts.rego", "ghost(node, inventory, parameters, tombstone, now) if",
			"package nodeguard.ghosts\n\nghost(node, inventory, parameters, tombstone, now) if _unprojected_ghost(policytest_orphan_node(node), policytest_inventory(inventory, parameters), parameters, tombstone, now)\n"},
		{"nodeguard/ghosts/ghosts.rego", "registration(operation, node, old, inventory, parameters, tombstone, now) :=",
			"package nodeguard.ghosts\n\nregistration(operation, node, old, inventory, parameters, tombstone, now) := _unprojected_registration(operation, policytest_node(node), policytest_node(old), policytest_inventory(inventory, parameters), parameters, tombstone, now)\n"},
		{"nodeguard/orphans/orphans.rego", "node_passes(node, parameters, now, grace, match_provider_id) if",
			"package nodeguard.orphans\n\nnode_passes(node, parameters, now, grace, match_provider_id) if _unprojected_node_passes(policytest_orphan_node(node), parameters, now, grace, match_provider_id)\n"},
		{"nodeguard/orphans/orphans.rego", "recheck_at(node, parameters, now, grace, match_provider_id) :=",
			"package nodeguard.orphans\n\nrecheck_at(node, parameters, now, grace, match_provider_id) := _unprojected_recheck_at(policytest_orphan_node(node), parameters, now, grace, match_provider_id)\n"},
	}
}

// project wraps the entry points in files and returns the builtins that
// reduce their arguments, derived from the declarations of files.
func project(ctx context.Context, files Files) ([]*tester.Builtin, error) {
	compiled, err := files.Compile()
	if err != nil {
		return nil, err
	}
	model, err := rule.LoadModel(ctx, compiled, nil)
	if err != nil {
		return nil, err
	}
	defaults, err := policies.DefaultParameters(ctx, compiled)
	if err != nil {
		return nil, err
	}
	fields, err := rule.LoadNodeFields(ctx, compiled, nil)
	if err != nil {
		return nil, err
	}
	shape, err := model.NodeCacheShape(fields)
	if err != nil {
		return nil, err
	}
	for i, w := range wrapped() {
		src := files[w.file]
		if n := strings.Count(src, "\n"+w.head); n != 1 {
			return nil, fmt.Errorf("policies/%s declares %q %d times, want once", w.file, w.head, n)
		}
		files[w.file] = strings.Replace(src, "\n"+w.head, "\n_unprojected_"+w.head, 1)
		files[path.Join(path.Dir(w.file), "zz_policytest_"+string(rune('a'+i))+".rego")] = w.wrapper
	}
	return builtins(model, shape, defaults), nil
}

// builtins reduce Nodes, reviews and inventories exactly as the enforcer
// does: a reviewed Node as the webhook decodes it, a judged one as the orphan
// scan's Node caches keep it, a user's groups as the guard keeps them.
func builtins(model *rule.Model, shape *record.Shape, defaults map[string]any) []*tester.Builtin {
	inv := facts.NewInventory(model)
	node := func(v any) any {
		m, ok := v.(map[string]any)
		if !ok {
			return v
		}
		return model.NodeShape().FromUnstructured(&unstructured.Unstructured{Object: m}).Object()
	}
	effective := func(params any) map[string]any {
		out := maps.Clone(defaults)
		if m, ok := params.(map[string]any); ok {
			maps.Copy(out, m)
		}
		return out
	}
	return []*tester.Builtin{
		builtin("policytest_node", 1, func(args []any) any { return node(args[0]) }),
		builtin("policytest_orphan_node", 1, func(args []any) any {
			m, ok := args[0].(map[string]any)
			if !ok {
				return args[0]
			}
			return shape.FromUnstructured(&unstructured.Unstructured{Object: m}).Object()
		}),
		builtin("policytest_review", 2, func(args []any) any {
			review, ok := args[0].(map[string]any)
			if !ok {
				return args[0]
			}
			out := maps.Clone(review)
			for _, k := range []string{"oldObject", "object"} {
				if x, ok := review[k]; ok {
					out[k] = node(x)
				}
			}
			out["userInfo"] = user(review["userInfo"], model.Groups(effective(args[1])))
			return out
		}),
		builtin("policytest_inventory", 2, func(args []any) any {
			return projectInventory(inv, model, args[0], poolKinds(effective(args[1])))
		}),
	}
}

// builtin declares a function of argc arguments, each handed to f as a JSON
// value.
func builtin(name string, argc int, f func(args []any) any) *tester.Builtin {
	args := make([]types.Type, argc)
	for i := range args {
		args[i] = types.A
	}
	decl := &rego.Function{Name: name, Decl: types.NewFunction(args, types.A)}
	return &tester.Builtin{
		Decl: &ast.Builtin{Name: name, Decl: decl.Decl},
		Func: rego.FunctionDyn(decl, func(_ rego.BuiltinContext, terms []*ast.Term) (*ast.Term, error) {
			// terms may end with the result's variable: read the arguments.
			vals := make([]any, argc)
			for i, t := range terms[:argc] {
				v, err := ast.JSON(t.Value)
				if err != nil {
					return nil, err
				}
				vals[i] = v
			}
			x, err := ast.InterfaceToValue(f(vals))
			if err != nil {
				return nil, err
			}
			return ast.NewTerm(x), nil
		}),
	}
}

// user keeps of a review's userInfo what the guard passes the rule: the
// username and the groups keep holds (all for nil).
func user(v any, keep map[string]bool) any {
	u, ok := v.(map[string]any)
	if !ok || keep == nil {
		return v
	}
	out := maps.Clone(u)
	if groups, ok := u["groups"].([]any); ok {
		kept := []any{}
		for _, g := range groups {
			if s, ok := g.(string); ok && keep[s] {
				kept = append(kept, s)
			}
		}
		out["groups"] = kept
	}
	return out
}

// poolKinds are the parameters' pool kinds.
func poolKinds(params map[string]any) map[string]bool {
	out := map[string]bool{}
	list, _ := params["infraMachinePoolKinds"].([]any)
	for _, k := range list {
		if m, ok := k.(map[string]any); ok {
			kind, _ := m["kind"].(string)
			out[kind] = true
		}
	}
	return out
}

// projectInventory replaces every object of a Gatekeeper-shaped inventory
// with what the enforcer caches of it: a Machine, a pool of the parameters'
// pool kinds, or else an InfraMachine (any kind a Machine may reference).
func projectInventory(inv *facts.Inventory, model *rule.Model, v any, pools map[string]bool) any {
	top, _ := v.(map[string]any)
	namespaces, ok := top["namespace"].(map[string]any)
	if !ok {
		return v
	}
	out := map[string]any{}
	for ns, byGV := range namespaces {
		outGV := map[string]any{}
		for gv, byKind := range byGV.(map[string]any) {
			outKind := map[string]any{}
			for kind, byName := range byKind.(map[string]any) {
				outName := map[string]any{}
				for name, obj := range byName.(map[string]any) {
					o, ok := obj.(map[string]any)
					if !ok {
						outName[name] = obj
						continue
					}
					u := &unstructured.Unstructured{Object: o}
					gk := schema.FromAPIVersionAndKind(gv, kind).GroupKind()
					role := facts.InfraMachine
					for r, ref := range model.Referrers {
						if gk == ref.GroupKind() {
							role = r
						}
					}
					switch {
					case role != facts.InfraMachine:
					case pools[kind]:
						role = facts.InfraMachinePool
					}
					outName[name] = inv.Record(u, role).Unstructured().Object
				}
				outKind[kind] = outName
			}
			outGV[gv] = outKind
		}
		out[ns] = outGV
	}
	return map[string]any{"namespace": out}
}
