// Package fieldcoverage checks that the rule reads no object field the
// enforcer's cached projection drops: every Rego test of policies/ runs
// again with each inventory and Node reduced by the enforcer's own code
// (inventory.Record, linkmodel.StripNode) before the rule sees them. A rule
// change that reads a field the link model does not declare passes its tests
// on full objects and fails here, instead of failing open in the enforcer.
package fieldcoverage

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/tester"
	"github.com/open-policy-agent/opa/v1/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeguard/nodeguard/enforcer/inventory"
	"github.com/nodeguard/nodeguard/enforcer/linkmodel"
	"github.com/nodeguard/nodeguard/enforcer/nodecache"
	"github.com/nodeguard/nodeguard/policies"
)

// The entry points that take an inventory (and a Node); each is renamed and
// wrapped so its callers, the tests included, get the projection.
func wrapped() []struct{ file, head, wrapper string } {
	return []struct{ file, head, wrapper string }{
		{"lib/nodeguard/nodeguard.rego", "decide(review, inventory, parameters) :=",
			"package lib.nodeguard\n\ndecide(review, inventory, parameters) := _unprojected_decide(fieldcoverage_review(review), fieldcoverage_inventory(inventory, parameters), parameters)\n"},
		{"lib/nodeguard/nodeguard.rego", "linked_machines(node, inventory, parameters) :=",
			"package lib.nodeguard\n\nlinked_machines(node, inventory, parameters) := _unprojected_linked_machines(fieldcoverage_node(node), fieldcoverage_inventory(inventory, parameters), parameters)\n"},
		{"nodeguard/orphans/orphans.rego", "verdict(node, inventory, parameters, now, grace, match_provider_id) :=",
			"package nodeguard.orphans\n\nverdict(node, inventory, parameters, now, grace, match_provider_id) := _unprojected_verdict(fieldcoverage_orphan_node(node), fieldcoverage_inventory(inventory, parameters), parameters, now, grace, match_provider_id)\n"},
		{"nodeguard/orphans/orphans.rego", "node_passes(node, parameters, now, grace, match_provider_id) if",
			"package nodeguard.orphans\n\nnode_passes(node, parameters, now, grace, match_provider_id) if _unprojected_node_passes(fieldcoverage_orphan_node(node), parameters, now, grace, match_provider_id)\n"},
		{"nodeguard/orphans/orphans.rego", "recheck_at(node, parameters, now, grace, match_provider_id) :=",
			"package nodeguard.orphans\n\nrecheck_at(node, parameters, now, grace, match_provider_id) := _unprojected_recheck_at(fieldcoverage_orphan_node(node), parameters, now, grace, match_provider_id)\n"},
	}
}

func TestRuleReadsOnlyWhatTheEnforcerKeeps(t *testing.T) {
	passed, failed := runProjected(t, nil)
	assert.Empty(t, failed, "these Rego tests fail when the rule sees only what the enforcer keeps: "+
		"the rule reads a field the link model (policies/lib/nodeguard/links.rego) does not declare")
	assert.Greater(t, passed, 100, "the policies' Rego tests ran")
}

// The check fails when the rule reads an undeclared field: here a copy of the
// rule also scopes InfraMachines by spec.clusterName, which the enforcer
// keeps only of Machines.
func TestTheCheckCatchesAnUndeclaredField(t *testing.T) {
	_, failed := runProjected(t, func(files map[string]string) {
		lib := files["lib/nodeguard/nodeguard.rego"]
		files["lib/nodeguard/nodeguard.rego"] = lib + `
_labelled_for_another_cluster(obj, cluster) if {
	cluster != ""
	not object.get(obj, ["spec", "clusterName"], "") in {"", cluster}
}
`
		files["mutation_test.rego"] = `package mutation_test

import data.lib.nodeguard

test_infra_of_another_cluster_by_spec if {
	node := {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}, "spec": {"providerID": "p"}}
	infra := {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "DockerMachine",
		"metadata": {"namespace": "default", "name": "d"}, "spec": {"providerID": "p", "clusterName": "other"}}
	inv := {"namespace": {"default": {"infrastructure.cluster.x-k8s.io/v1beta2": {"DockerMachine": {"d": infra}}}}}
	review := {"operation": "DELETE", "kind": {"group": "", "version": "v1", "kind": "Node"}, "name": "n", "oldObject": node}
	nodeguard.decide(review, inv, {"clusterName": "dev", "clusterNamespace": "default"}).allowed
}
`
	})
	assert.Equal(t, []string{"data.mutation_test.test_infra_of_another_cluster_by_spec"}, failed)
}

// The same for the orphan criteria and a Node: here a copy of them also
// keeps a Node labelled as a control plane, a label the Node caches drop.
func TestTheCheckCatchesAnUndeclaredNodeField(t *testing.T) {
	_, failed := runProjected(t, func(files map[string]string) {
		src := files["nodeguard/orphans/orphans.rego"]
		files["nodeguard/orphans/orphans.rego"] = strings.Replace(src, "\t_ready_reason(node),\n\t[_machine_reason",
			"\t_ready_reason(node),\n\t_control_plane(node),\n\t[_machine_reason", 1) + `
_control_plane(node) := ["it is a control-plane Node"] if {
	"node-role.kubernetes.io/control-plane" in object.keys(object.get(node, ["metadata", "labels"], {}))
} else := []
`
		files["mutation_test.rego"] = `package mutation_test

import data.lib.nodeguard_test as fixtures
import data.nodeguard.orphans

test_control_plane_node_is_kept if {
	node := object.union(fixtures.capd_node, {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}})
	"it is a control-plane Node" in orphans.verdict(node, {}, {}, "2026-11-30T12:00:00Z", "5m", false).kept
}
`
	})
	assert.Equal(t, []string{"data.mutation_test.test_control_plane_node_is_kept"}, failed)
}

// runProjected runs every Rego test under policies/ (after mutate, when
// set) with the entry points wrapped, and returns how many passed and the
// names of those that did not.
func runProjected(t *testing.T, mutate func(files map[string]string)) (int, []string) {
	t.Helper()
	ctx := context.Background()
	compiled, err := policies.Compile()
	require.NoError(t, err)
	model, err := linkmodel.Load(ctx, compiled, nil)
	require.NoError(t, err)
	defaults, err := policies.DefaultParameters(ctx, compiled)
	require.NoError(t, err)
	fields, err := linkmodel.LoadNodeFields(ctx, compiled, nil)
	require.NoError(t, err)
	shape, err := nodecache.NewShape(model, fields)
	require.NoError(t, err)
	files := map[string]string{}
	root := filepath.Join("..", "..", "policies")
	require.NoError(t, filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".rego") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		files[filepath.ToSlash(rel)] = string(b)
		return err
	}))
	if mutate != nil {
		mutate(files)
	}
	for i, w := range wrapped() {
		src := files[w.file]
		require.Equal(t, 1, strings.Count(src, "\n"+w.head), "%s declares %q once", w.file, w.head)
		files[w.file] = strings.Replace(src, "\n"+w.head, "\n_unprojected_"+w.head, 1)
		files[filepath.ToSlash(filepath.Join(filepath.Dir(w.file), "zz_fieldcoverage_"+string(rune('a'+i))+".rego"))] = w.wrapper
	}
	modules := map[string]*ast.Module{}
	for path, src := range files {
		m, err := ast.ParseModuleWithOpts(path, src, ast.ParserOptions{RegoVersion: ast.RegoV1})
		require.NoError(t, err, path)
		modules[path] = m
	}
	custom := builtins(model, shape, defaults)
	// Gatekeeper's own builtins, which the K8sNodeGuardExternal tests
	// replace with their answers: declared, never run here.
	gatekeeper, err := policies.GatekeeperBuiltins()
	require.NoError(t, err)
	for _, b := range gatekeeper {
		f := &rego.Function{Name: b.Name, Decl: b.Decl}
		custom = append(custom, &tester.Builtin{Decl: b, Func: rego.FunctionDyn(f, func(rego.BuiltinContext, []*ast.Term) (*ast.Term, error) {
			return nil, fmt.Errorf("%s runs only in Gatekeeper: a test must replace it", f.Name)
		})})
	}
	ch, err := tester.NewRunner().SetDefaultRegoVersion(ast.RegoV1).AddCustomBuiltins(custom).CapturePrintOutput(false).Run(ctx, modules)
	require.NoError(t, err)
	passed := 0
	var failed []string
	for r := range ch {
		if r.Pass() {
			passed++
			continue
		}
		name := r.Package + "." + r.Name
		if r.Error != nil {
			t.Logf("%s: %v", name, r.Error)
		}
		failed = append(failed, name)
	}
	sort.Strings(failed)
	return passed, failed
}

// builtins reduce Nodes and inventories exactly as the enforcer does: a
// reviewed Node as the webhook decodes it, a judged one as the orphan scan's
// Node caches keep it.
func builtins(model *linkmodel.Model, shape *nodecache.Shape, defaults map[string]any) []*tester.Builtin {
	inv := inventory.New(model)
	node := func(v any) any {
		m, ok := v.(map[string]any)
		if !ok {
			return v
		}
		return model.StripNode(&unstructured.Unstructured{Object: m}).Object
	}
	fn1 := func(name string, f func(any) any) *tester.Builtin {
		decl := &rego.Function{Name: name, Decl: types.NewFunction(types.Args(types.A), types.A)}
		return &tester.Builtin{
			Decl: &ast.Builtin{Name: name, Decl: decl.Decl},
			Func: rego.Function1(decl, func(_ rego.BuiltinContext, a *ast.Term) (*ast.Term, error) {
				v, err := ast.JSON(a.Value)
				if err != nil {
					return nil, err
				}
				return termOf(f(v))
			}),
		}
	}
	project := &rego.Function{Name: "fieldcoverage_inventory", Decl: types.NewFunction(types.Args(types.A, types.A), types.A)}
	return []*tester.Builtin{
		fn1("fieldcoverage_node", node),
		fn1("fieldcoverage_orphan_node", func(v any) any {
			m, ok := v.(map[string]any)
			if !ok {
				return v
			}
			r, err := shape.Record(&unstructured.Unstructured{Object: m})
			if err != nil {
				return v
			}
			return shape.Object(r)
		}),
		fn1("fieldcoverage_review", func(v any) any {
			review, ok := v.(map[string]any)
			if !ok {
				return v
			}
			out := map[string]any{}
			for k, x := range review {
				out[k] = x
			}
			for _, k := range []string{"oldObject", "object"} {
				if x, ok := review[k]; ok {
					out[k] = node(x)
				}
			}
			return out
		}),
		{
			Decl: &ast.Builtin{Name: project.Name, Decl: project.Decl},
			Func: rego.Function2(project, func(_ rego.BuiltinContext, a, p *ast.Term) (*ast.Term, error) {
				v, err := ast.JSON(a.Value)
				if err != nil {
					return nil, err
				}
				params, _ := ast.JSON(p.Value)
				return termOf(projectInventory(inv, model, v, poolKinds(params, defaults)))
			}),
		},
	}
}

func termOf(v any) (*ast.Term, error) {
	x, err := ast.InterfaceToValue(v)
	if err != nil {
		return nil, err
	}
	return ast.NewTerm(x), nil
}

// poolKinds are the parameters' pool kinds, or the defaults' when unset.
func poolKinds(params any, defaults map[string]any) map[string]bool {
	out := map[string]bool{}
	m, _ := params.(map[string]any)
	list, ok := m["infraMachinePoolKinds"].([]any)
	if !ok {
		list, _ = defaults["infraMachinePoolKinds"].([]any)
	}
	for _, k := range list {
		if m, ok := k.(map[string]any); ok {
			out[m["kind"].(string)] = true
		}
	}
	return out
}

// projectInventory replaces every object of a Gatekeeper-shaped inventory
// with what the enforcer caches of it: a Machine, a pool of the parameters'
// pool kinds, or else an InfraMachine (any kind a Machine may reference).
func projectInventory(inv *inventory.Inventory, model *linkmodel.Model, v any, pools map[string]bool) any {
	namespaces, ok := v.(map[string]any)["namespace"].(map[string]any)
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
					role := inventory.InfraMachine
					switch {
					case gk == model.MachineKind:
						role = inventory.Machine
					case pools[kind]:
						role = inventory.InfraMachinePool
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
