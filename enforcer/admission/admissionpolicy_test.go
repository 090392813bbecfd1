package admission_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/cel-go/cel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

func info(t *testing.T) admission.PolicyInfo {
	t.Helper()
	i, err := admission.LoadPolicyInfo()
	require.NoError(t, err)
	return i
}

func build(t *testing.T, opts admission.PolicyOptions) admission.Policies {
	t.Helper()
	p, err := admission.BuildPolicies(info(t), opts)
	require.NoError(t, err)
	return p
}

func TestInfoComesFromTheRego(t *testing.T) {
	i := info(t)
	assert.Equal(t, "nodeguard-node-delete", i.Name)
	assert.Equal(t, "nodeguard-node-verdicts", i.Guard)
	assert.Equal(t, []string{"nodeguard.io/released", "nodeguard.io/blocker"}, i.Annotations())
	assert.Equal(t, "ValidatingAdmissionPolicy", i.Kind)
	assert.Regexp(t, `^\d+\.\d+\.\d+$`, i.Version)
	assert.Equal(t, "nodeguard-node-delete.static.k8s.io", i.Static().Name)
}

// Neither policy has params: they cost the same at any number of Nodes and
// may be loaded from kube-apiserver's static manifests.
func TestPoliciesHaveNoParams(t *testing.T) {
	p := build(t, admission.PolicyOptions{})
	for _, pol := range []*admissionregistrationv1.ValidatingAdmissionPolicy{p.Delete, p.Guard} {
		assert.Nil(t, pol.Spec.ParamKind, pol.Name)
	}
	for _, b := range []*admissionregistrationv1.ValidatingAdmissionPolicyBinding{p.DeleteBinding, p.GuardBinding} {
		assert.Nil(t, b.Spec.ParamRef, b.Name)
	}
	assert.Equal(t, []any{p.Guard, p.GuardBinding, p.Delete, p.DeleteBinding}, p.Objects(), "the guard first")
}

func TestExemptionsAreRenderedAsLiterals(t *testing.T) {
	p := build(t, admission.PolicyOptions{ExemptUsers: []string{"zed", `a"b\c`}, ExemptGroups: []string{"nodeguard:break-glass"}})
	require.Len(t, p.Delete.Spec.MatchConditions, 1)
	expr := p.Delete.Spec.MatchConditions[0].Expression
	// Sorted and escaped: a quote or backslash in a name cannot end the literal.
	assert.Contains(t, expr, `request.userInfo.username in ["a\"b\\c", "zed"]`)
	assert.Contains(t, expr, `g in ["nodeguard:break-glass"]`)
}

func TestActionsAreTheDeleteBindingsValidationActions(t *testing.T) {
	for action, want := range map[rule.Action]admissionregistrationv1.ValidationAction{
		"": admissionregistrationv1.Deny, rule.ActionDeny: admissionregistrationv1.Deny,
		rule.ActionWarn: admissionregistrationv1.Warn, rule.ActionDryRun: admissionregistrationv1.Audit,
	} {
		p := build(t, admission.PolicyOptions{Action: action})
		assert.Equal(t, []admissionregistrationv1.ValidationAction{want}, p.DeleteBinding.Spec.ValidationActions, "action %q", action)
		// A forged verdict is denied whatever the delete binding does.
		assert.Equal(t, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}, p.GuardBinding.Spec.ValidationActions)
	}
	_, err := admission.BuildPolicies(info(t), admission.PolicyOptions{Action: "enforce"})
	assert.ErrorContains(t, err, `action "enforce"`)
}

// eval runs a policy's CEL expression over the variables a request gives
// it (Kubernetes adds its own libraries; these expressions need none).
func eval(t *testing.T, expr string, vars map[string]any) any {
	t.Helper()
	env, err := cel.NewEnv(cel.Variable("object", cel.DynType), cel.Variable("oldObject", cel.DynType), cel.Variable("request", cel.DynType))
	require.NoError(t, err)
	ast, iss := env.Compile(expr)
	require.NoError(t, iss.Err(), expr)
	prg, err := env.Program(ast)
	require.NoError(t, err)
	for _, k := range []string{"object", "oldObject"} {
		if _, ok := vars[k]; !ok {
			vars[k] = nil
		}
	}
	out, _, err := prg.Eval(vars)
	require.NoError(t, err, expr)
	return out.Value()
}

func node(uid string, annotations map[string]any) map[string]any {
	m := map[string]any{"name": "n", "uid": uid}
	if annotations != nil {
		m["annotations"] = annotations
	}
	return map[string]any{"metadata": m}
}

func TestDeletePolicyComparesTheReleaseWithTheUID(t *testing.T) {
	i := info(t)
	p := build(t, admission.PolicyOptions{})
	v := p.Delete.Spec.Validations[0]
	for _, c := range []struct {
		old  map[string]any
		want bool
	}{
		{node("u1", map[string]any{i.Released: "u1"}), true},
		{node("u2", map[string]any{i.Released: "u1"}), false}, // re-created under the name
		{node("u1", nil), false},
		{node("u1", map[string]any{"other": "x"}), false},
	} {
		assert.Equal(t, c.want, eval(t, v.Expression, map[string]any{"oldObject": c.old}), "%v", c.old)
	}
	msg := eval(t, v.MessageExpression, map[string]any{"oldObject": node("u1", map[string]any{i.Blocker: "DockerMachine default/a is being deleted but still exists."})})
	assert.Equal(t, "nodeguard: DockerMachine default/a is being deleted but still exists.", msg)
	msg = eval(t, v.MessageExpression, map[string]any{"oldObject": node("u1", nil)})
	assert.Contains(t, msg, `Node "n" cannot be deleted: nodeguard has not released it`)
}

func TestGuardMatchesOnlyRequestsThatTouchTheVerdicts(t *testing.T) {
	i := info(t)
	p := build(t, admission.PolicyOptions{})
	conds := map[string]string{}
	for _, c := range p.Guard.Spec.MatchConditions {
		conds[c.Name] = c.Expression
	}
	kubelet := map[string]any{"userInfo": map[string]any{"username": "system:node:n", "groups": []any{"system:nodes"}}}
	for _, c := range []struct {
		op       string
		old, obj map[string]any
		touches  bool
	}{
		{"CREATE", nil, node("u", nil), false},
		{"CREATE", nil, node("u", map[string]any{i.Released: "u"}), true},
		{"CREATE", nil, node("u", map[string]any{i.Blocker: "x"}), true},
		{"UPDATE", node("u", nil), node("u", map[string]any{"x": "y"}), false},                                    // a status update
		{"UPDATE", node("u", map[string]any{i.Released: "u"}), node("u", map[string]any{i.Released: "u"}), false}, // kept as is
		{"UPDATE", node("u", nil), node("u", map[string]any{i.Released: "u"}), true},                              // set
		{"UPDATE", node("u", map[string]any{i.Released: "u"}), node("u", map[string]any{i.Released: "v"}), true},
		{"UPDATE", node("u", map[string]any{i.Released: "u"}), node("u", nil), true}, // removed
		{"UPDATE", node("u", map[string]any{i.Blocker: "x"}), node("u", map[string]any{}), true},
	} {
		req := map[string]any{"operation": c.op, "userInfo": kubelet["userInfo"]}
		vars := map[string]any{"request": req, "object": c.obj}
		if c.old != nil {
			vars["oldObject"] = c.old
		}
		assert.Equal(t, c.touches, eval(t, conds["touches-verdicts"], vars), "%s %v -> %v", c.op, c.old, c.obj)
		assert.Equal(t, true, eval(t, conds["not-nodeguard"], vars))
	}
	self := map[string]any{"request": map[string]any{"userInfo": map[string]any{"username": "system:serviceaccount:nodeguard-system:nodeguard"}}}
	assert.Equal(t, false, eval(t, conds["not-nodeguard"], self), "nodeguard's identity writes them")
	assert.Equal(t, "false", p.Guard.Spec.Validations[0].Expression, "whatever else matches is denied")
	assert.ElementsMatch(t, []string{"nodes", "nodes/status"}, p.Guard.Spec.MatchConstraints.ResourceRules[0].Resources)
}

func TestVerdictPatchSetsAndRemoves(t *testing.T) {
	i := info(t)
	for _, c := range []struct {
		v    admission.ReleaseVerdict
		want string
	}{
		{admission.Verdict("u1", true, "ignored"), `{"metadata":{"annotations":{"nodeguard.io/blocker":null,"nodeguard.io/released":"u1"}}}`},
		{admission.Verdict("u1", false, "held"), `{"metadata":{"annotations":{"nodeguard.io/blocker":"held","nodeguard.io/released":null}}}`},
		{admission.Verdict("u1", false, ""), `{"metadata":{"annotations":{"nodeguard.io/blocker":null,"nodeguard.io/released":null}}}`},
	} {
		patch, err := admission.VerdictPatch(i, c.v)
		require.NoError(t, err)
		assert.JSONEq(t, c.want, string(patch))
		var back struct {
			Metadata struct{ Annotations map[string]string } `json:"metadata"`
		}
		require.NoError(t, json.Unmarshal(patch, &back))
		assert.Equal(t, c.v, admission.VerdictOf(i, back.Metadata.Annotations), "read back")
	}
	// A blocker is cut to a readable length.
	long := admission.Verdict("u", false, strings.Repeat("x", 5000))
	assert.Len(t, long.Blocker, 1024)
	assert.True(t, strings.HasSuffix(long.Blocker, "..."))
}

func TestRulesNameWhatTheyMay(t *testing.T) {
	for _, r := range admission.PolicyRules(info(t)) {
		if len(r.ResourceNames) == 0 {
			assert.Subset(t, []string{"create", "patch"}, r.Verbs, "only create (policies) and patch (Nodes) are unnamed: %v", r)
			assert.NotContains(t, r.Resources, "configmaps", "no ConfigMap but the legacy one, by name")
		}
	}
}
