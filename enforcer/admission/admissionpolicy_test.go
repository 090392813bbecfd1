package admission_test

import (
	"fmt"
	"strings"
	"testing"

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

func TestInfoComesFromTheRego(t *testing.T) {
	i := info(t)
	assert.Equal(t, "nodeguard", i.Name)
	assert.Equal(t, "ValidatingAdmissionPolicy", i.Kind)
	assert.Regexp(t, `^\d+\.\d+\.\d+$`, i.Version)
}

func TestExemptionsAreRenderedAsLiterals(t *testing.T) {
	p, _, err := admission.BuildPolicy(info(t), admission.PolicyOptions{
		ExemptUsers: []string{"zed", `a"b\c`}, ExemptGroups: []string{"nodeguard:break-glass"}})
	require.NoError(t, err)
	require.Len(t, p.Spec.MatchConditions, 1)
	expr := p.Spec.MatchConditions[0].Expression
	// Sorted and escaped: a quote or backslash in a name cannot end the literal.
	assert.Contains(t, expr, `request.userInfo.username in ["a\"b\\c", "zed"]`)
	assert.Contains(t, expr, `g in ["nodeguard:break-glass"]`)
}

func TestActionsAreTheBindingsValidationActions(t *testing.T) {
	for action, want := range map[rule.Action]admissionregistrationv1.ValidationAction{
		"": admissionregistrationv1.Deny, rule.ActionDeny: admissionregistrationv1.Deny,
		rule.ActionWarn: admissionregistrationv1.Warn, rule.ActionDryRun: admissionregistrationv1.Audit,
	} {
		_, b, err := admission.BuildPolicy(info(t), admission.PolicyOptions{Action: action})
		require.NoError(t, err)
		assert.Equal(t, []admissionregistrationv1.ValidationAction{want}, b.Spec.ValidationActions, "action %q", action)
		assert.Equal(t, admissionregistrationv1.DenyAction, *b.Spec.ParamRef.ParameterNotFoundAction)
	}
	_, _, err := admission.BuildPolicy(info(t), admission.PolicyOptions{Action: "enforce"})
	assert.ErrorContains(t, err, `action "enforce"`)
}

func TestParamsHoldReleasesWithUIDsAndTeardownBlockers(t *testing.T) {
	cm, omitted, err := admission.PolicyParams([]admission.ReleaseVerdict{
		{Node: "b", UID: "uid-b", Released: true},
		{Node: "a", Blocker: "DockerMachine default/a is being deleted but still exists."},
		{Node: "c"}, // blocked, nothing to say: not listed
	}, admission.MaxParamsBytes)
	require.NoError(t, err)
	assert.Zero(t, omitted)
	assert.Equal(t, map[string]string{"b": "uid-b", "blocker_a": "DockerMachine default/a is being deleted but still exists."}, cm.Data)
	assert.Equal(t, admission.ParamsNamespace+"/"+admission.ParamsName, cm.Namespace+"/"+cm.Name)

	_, _, err = admission.PolicyParams([]admission.ReleaseVerdict{{Node: "b", Released: true}}, admission.MaxParamsBytes)
	assert.ErrorContains(t, err, "no UID")
}

// Beyond the bound, blockers go first, then releases: a Node left out stays
// denied, never the other way round.
func TestParamsBeyondTheBoundLeaveNodesDenied(t *testing.T) {
	var vs []admission.ReleaseVerdict
	for i := range 10 {
		vs = append(vs, admission.ReleaseVerdict{Node: fmt.Sprintf("node-%d", i), UID: "0123456789", Released: true},
			admission.ReleaseVerdict{Node: fmt.Sprintf("held-%d", i), Blocker: strings.Repeat("x", 5000)})
	}
	// Room for 5 releases (16 bytes each) and no blocker.
	cm, omitted, err := admission.PolicyParams(vs, 5*16)
	require.NoError(t, err)
	assert.Equal(t, 15, omitted)
	assert.Len(t, cm.Data, 5)
	for k, v := range cm.Data {
		assert.True(t, strings.HasPrefix(k, "node-"), k)
		assert.Equal(t, "0123456789", v)
	}
	// A blocker is cut to a readable length.
	cm, _, err = admission.PolicyParams(vs, admission.MaxParamsBytes)
	require.NoError(t, err)
	assert.Len(t, cm.Data["blocker_held-0"], 1024)
	assert.True(t, strings.HasSuffix(cm.Data["blocker_held-0"], "..."))
}

func TestRulesNameWhatTheyMay(t *testing.T) {
	for _, r := range admission.PolicyRules(info(t)) {
		if len(r.ResourceNames) == 0 {
			assert.Subset(t, []string{"create", "get"}, r.Verbs, "only create (and get of ConfigMaps, for paramKind) is unnamed: %v", r)
		}
	}
}
