package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/internal/constraints"
	"github.com/nodeguard/nodeguard/internal/policytest"
	"github.com/nodeguard/nodeguard/internal/testbundle"
	"github.com/nodeguard/nodeguard/policies"
)

// Two parameters a platform team might add, declared in declared_parameters:
// contact, named at the end of every denial, and breakGlassGroups, groups
// exempt like exemptGroups; the rule reads its value against the user's
// groups, so it is declared user_groups.
const (
	contactParameter = `	"contact": {
		"schema": {"type": "string"},
		"default": "",
		"description": "Who to ask about a denied delete; named at the end of every denial.",
	},
`
	breakGlassParameter = `	"breakGlassGroups": {
		"schema": {"type": "array", "items": {"type": "string"}},
		"default": [],
		"user_groups": true,
		"description": "Groups of the break-glass procedure, exempt like exemptGroups.",
	},
`
)

// The rule's use of them (decide.rego): each edit replaces one line.
func useParameters(t *testing.T, files policytest.Files) {
	t.Helper()
	for old, new := range map[string]string{
		`"messages": [f.message | some f in findings], "findings": findings,
}

_denied_because`: `"messages": [_ask(f, params).message | some f in findings], "findings": [_ask(f, params) | some f in findings],
}

_denied_because`,
		`groups := {group | some group in object.get(user, "groups", []); group in params.exemptGroups}`: `groups := {group | some group in object.get(user, "groups", []); _exempt_group(group, params)}`,
	} {
		require.NoError(t, files.Replace("lib/nodeguard/decide.rego", old, new))
	}
	files["lib/nodeguard/decide.rego"] += `
_ask(finding, params) := object.union(finding, {"message": sprintf("%s Ask %s.", [finding.message, params.contact])}) if {
	params.contact != ""
} else := finding

_exempt_group(group, params) if group in params.exemptGroups

_exempt_group(group, params) if group in params.breakGlassGroups
`
	files["lib/nodeguard/decide_test.rego"] += `
test_contact_ends_every_denial if {
	d := decide_with(capd_node, [capd_machine, capd_infra], {"contact": "#platform"})
	endswith(d.messages[0], "Ask #platform.")
	not contains(decide(capd_node, [capd_machine, capd_infra]).messages[0], "Ask")
}

test_break_glass_group_is_exempt if {
	review := object.union(delete_review(capd_node), {"userInfo": {"username": "bob", "groups": ["oncall"]}})
	d := nodeguard.decide(review, inventory([capd_machine, capd_infra]), {"breakGlassGroups": ["oncall"]})
	d.reason == "exempt"
	contains(d.warnings[0], ` + "`" + `group "oncall" is exempt` + "`" + `)
	not nodeguard.decide(review, inventory([capd_machine, capd_infra]), {}).allowed
}
`
}

// CONTRIBUTING's "Adding a parameter", followed in a copy of policies/ and
// nothing else: two parameters in declared_parameters, their use in the rule
// and their Rego tests. The copy's Rego tests pass as they are and on what the
// enforcer keeps; the template's schema and docs/policy.md's table show them;
// the offline check, the guard and the webhook read their defaults and a
// Constraint's values, and the webhook keeps the user's groups the new group
// parameter lists, with no Go change. Declared without user_groups, the group
// parameter fails the projected Rego tests, and the webhook would not see it.
func TestEnforcerFollowsAParameterDeclaredOnlyInPolicies(t *testing.T) {
	ctx := context.Background()
	copyOf := func(marker bool) policytest.Files {
		files, err := policytest.Load()
		require.NoError(t, err)
		breakGlass := breakGlassParameter
		if !marker {
			breakGlass = strings.Replace(breakGlass, "\t\t\"user_groups\": true,\n", "", 1)
		}
		require.NoError(t, files.Replace("lib/nodeguard/parameters.rego", "\n\t\"exemptUsers\": {", "\n"+contactParameter+breakGlass+"\t\"exemptUsers\": {"))
		useParameters(t, files)
		return files
	}
	policy := copyOf(true)
	recipePasses(ctx, t, policy,
		"| `contact` | string | `\"\"` | Who to ask about a denied delete; named at the end of every denial. |",
		"| `breakGlassGroups` | list of string | `[]` | Groups of the break-glass procedure, exempt like exemptGroups. (Group names:")

	t.Run("template schema", func(t *testing.T) {
		compiled, err := policy.Compile()
		require.NoError(t, err)
		declared, err := policies.DeclaredParameters(ctx, compiled)
		require.NoError(t, err)
		schema, err := constraints.ParameterSchema(declared)
		require.NoError(t, err)
		_, err = constraints.Structural(schema)
		require.NoError(t, err)
		assert.Equal(t, "string", schema.Properties["contact"].Type)
		assert.Equal(t, "string", schema.Properties["breakGlassGroups"].Items.Schema.Type)
		assert.NotContains(t, fmt.Sprint(schema.Properties["breakGlassGroups"]), "user_groups", "a marker for nodeguard, not Gatekeeper's schema")
	})

	key := testbundle.NewKey(t)
	bundle := func(files policytest.Files, name string) string {
		return testbundle.WriteFile(t, t.TempDir(), name+".tar.gz", testbundle.Signed(t, files.Bundle(), name, key.Private))
	}
	withMarker := bundle(policy, "parameters")
	constraint := testbundle.WriteFile(t, t.TempDir(), "constraint.yaml", []byte(`apiVersion: constraints.gatekeeper.sh/v1beta1
kind: K8sNodeGuard
metadata:
  name: node-deletion-guard
spec:
  parameters:
    contact: "#platform"
    breakGlassGroups: ["oncall"]
`))
	objs := []string{"-f", "../../../constraints/tests/capd-objects.yaml", "-f", "../../../constraints/tests/node-capd.yaml"}

	t.Run("nodeguard check", func(t *testing.T) {
		args := append([]string{"check", "--node", "dev-md-0-abcde", "--bundle", withMarker, "--bundle-verification-key", key.PublicKeyFile}, objs...)
		code, out, errOut := nodeguard(t, args...)
		assert.Equal(t, 2, code, errOut)
		assert.NotContains(t, out, "Ask", "the default: no contact")
		code, out, errOut = nodeguard(t, append(args, "--constraint", constraint)...)
		assert.Equal(t, 2, code, errOut)
		assert.Contains(t, out, "Ask #platform.")
		code, out, errOut = nodeguard(t, append(args, "--constraint", constraint, "--user", "bob", "--group", "oncall")...)
		assert.Equal(t, 0, code, errOut)
		assert.Contains(t, out, "ALLOWED only because of an exemption")
		assert.Contains(t, out, `group "oncall" is exempt`)
	})

	// What the webhook answers bob, in a hundred other groups and oncall,
	// with the policy of bundle and the Constraint's parameters.
	webhookAnswer := func(t *testing.T, bundle string) *admissionv1.AdmissionResponse {
		t.Helper()
		eval, err := rule.LoadBundle(ctx, rule.BundleOptions{Path: bundle, VerificationKeyFile: key.PublicKeyFile})
		require.NoError(t, err)
		params, err := facts.ConstraintParameters(constraint)
		require.NoError(t, err)
		cluster, err := facts.LoadManifests(objs[1], objs[3])
		require.NoError(t, err)
		infra, pools, err := eval.Kinds(params)
		require.NoError(t, err)
		inv, err := facts.FromObjects(eval.Model(), cluster, infra, pools)
		require.NoError(t, err)
		g, err := guard.New(ctx, inv, guard.Options{Engine: eval, Parameters: params})
		require.NoError(t, err)
		var node []byte
		for _, o := range cluster {
			if o.GetKind() == "Node" {
				node, err = o.MarshalJSON()
				require.NoError(t, err)
			}
		}
		groups := []string{"system:authenticated"}
		for i := range 100 {
			groups = append(groups, fmt.Sprintf("team-%d", i))
		}
		answer := admit(t, g, authenticationv1.UserInfo{Username: "bob", Groups: append(groups, "oncall")}, node)
		assert.False(t, g.KeepGroup("team-7"), "the guard keeps only the groups a group parameter lists")
		return answer
	}

	t.Run("webhook keeps the groups the new parameter lists", func(t *testing.T) {
		answer := webhookAnswer(t, withMarker)
		assert.True(t, answer.Allowed, answer.Result)
		require.Len(t, answer.Warnings, 1)
		assert.Contains(t, answer.Warnings[0], `group "oncall" is exempt`)
	})

	t.Run("without user_groups", func(t *testing.T) {
		unmarked := copyOf(false)
		r, err := policytest.Run(ctx, unmarked, true)
		require.NoError(t, err)
		assert.Equal(t, []string{"data.lib.nodeguard_test.test_break_glass_group_is_exempt"}, r.Failed,
			"make test catches the missing marker: the enforcer would not see the group")
		answer := webhookAnswer(t, bundle(unmarked, "unmarked"))
		assert.False(t, answer.Allowed, "oncall never reaches the rule")
		assert.Contains(t, answer.Result.Message, "Ask #platform.")
	})
}
