// Package fieldcoverage checks that the rule reads no object field, Node
// field or user group the enforcer drops: every Rego test of policies/ runs
// again with each inventory, Node and review reduced by the enforcer's own
// code (records of the link model's role shapes, its Node shape and the Node
// caches' shape; the groups the guard keeps) before the rule sees them
// (internal/policytest). A
// rule change that reads what the declarations do not name passes its tests
// on full objects and fails here, instead of failing open in the enforcer.
package fieldcoverage

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/internal/policytest"
)

func TestRuleReadsOnlyWhatTheEnforcerKeeps(t *testing.T) {
	r := runProjected(t, nil)
	assert.Empty(t, r.Failed, "these Rego tests fail when the rule sees only what the enforcer keeps: "+
		"the rule reads a field the link model (policies/lib/nodeguard/links.rego) does not declare: %v", r.Errors)
	assert.Greater(t, r.Passed, 100, "the policies' Rego tests ran")
}

// The check fails when the rule reads an undeclared field: here a copy of the
// rule also scopes InfraMachines by spec.clusterName, which the enforcer
// keeps only of Machines.
func TestTheCheckCatchesAnUndeclaredField(t *testing.T) {
	r := runProjected(t, func(files policytest.Files) {
		files["lib/nodeguard/follow.rego"] += `
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
	assert.Equal(t, []string{"data.mutation_test.test_infra_of_another_cluster_by_spec"}, r.Failed)
}

// The same for the orphan criteria and a Node: here a copy of them also
// keeps a Node labelled as a control plane, a label the Node caches drop.
func TestTheCheckCatchesAnUndeclaredNodeField(t *testing.T) {
	r := runProjected(t, func(files policytest.Files) {
		require.NoError(t, files.Replace("nodeguard/orphans/orphans.rego", "\t_ready_reason(node),\n\t[_machine_reason",
			"\t_ready_reason(node),\n\t_control_plane(node),\n\t[_machine_reason"))
		files["nodeguard/orphans/orphans.rego"] += `
_control_plane(node) := ["it is a control-plane Node"] if {
	"node-role.kubernetes.io/control-plane" in object.keys(object.get(node, ["metadata", "labels"], {}))
} else := []
`
		files["mutation_test.rego"] = `package mutation_test

import data.lib.nodeguard_test as fixtures
import data.nodeguard.orphans

test_control_plane_node_is_kept if {
	node := object.union(fixtures.capd_node, {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}})
	"it is a control-plane Node" in orphans.verdict(node, {}, {}, "2026-11-30T12:00:00Z", "5m", false, null).kept
}
`
	})
	assert.Equal(t, []string{"data.mutation_test.test_control_plane_node_is_kept"}, r.Failed)
}

// And for a user's groups: a copy of the rule that also exempts the groups of
// a new parameter, declared without user_groups, sees none of them in the
// enforcer (the guard passes the rule only the groups group parameters list).
// Declared with it, the check passes.
func TestTheCheckCatchesAGroupParameterNotDeclaredAsOne(t *testing.T) {
	mutate := func(marker string) func(files policytest.Files) {
		return func(files policytest.Files) {
			require.NoError(t, files.Replace("lib/nodeguard/parameters.rego", "\n\t\"exemptUsers\": {",
				"\n\t\"breakGlassGroups\": {\"schema\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}, \"default\": [],"+marker+
					" \"description\": \"Groups exempt in an emergency.\"},\n\t\"exemptUsers\": {"))
			require.NoError(t, files.Replace("lib/nodeguard/decide.rego", "group in params.exemptGroups}", "_exempt_group(group, params)}"))
			files["lib/nodeguard/decide.rego"] += `
_exempt_group(group, params) if group in params.exemptGroups

_exempt_group(group, params) if group in params.breakGlassGroups
`
			files["mutation_test.rego"] = `package mutation_test

import data.lib.nodeguard
import data.lib.nodeguard_test as fixtures

test_break_glass_group_is_exempt if {
	review := object.union(fixtures.delete_review(fixtures.capd_node), {"userInfo": {"username": "bob", "groups": ["oncall"]}})
	d := nodeguard.decide(review, fixtures.inventory([fixtures.capd_machine, fixtures.capd_infra]), {"breakGlassGroups": ["oncall"]})
	d.reason == "exempt"
}
`
		}
	}
	assert.Equal(t, []string{"data.mutation_test.test_break_glass_group_is_exempt"}, runProjected(t, mutate("")).Failed)
	r := runProjected(t, mutate(` "user_groups": true,`))
	assert.Empty(t, r.Failed, r.Errors)
}

// runProjected runs every Rego test of policies/ (after mutate, when set)
// projected.
func runProjected(t *testing.T, mutate func(files policytest.Files)) policytest.Result {
	t.Helper()
	files, err := policytest.Load()
	require.NoError(t, err)
	if mutate != nil {
		mutate(files)
	}
	r, err := policytest.Run(context.Background(), files, true)
	require.NoError(t, err)
	return r
}
