package admission_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/internal/testlog"
)

// registration is an AdmissionReview of a Node CREATE (old nil) or UPDATE.
func registration(op admissionv1.Operation, node, old map[string]any) []byte {
	r := map[string]any{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": map[string]any{
		"uid": "7f0b2f6c-1111-2222-3333-444455556666", "operation": op, "name": node["metadata"].(map[string]any)["name"],
		"kind": map[string]any{"group": "", "version": "v1", "kind": "Node"}, "object": node, "oldObject": old,
		"userInfo": map[string]any{"username": "system:node:ghost"}}}
	b, _ := json.Marshal(r)
	return b
}

func kubeletNode(pid string) map[string]any {
	spec := map[string]any{}
	if pid != "" {
		spec["providerID"] = pid
	}
	return map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": "ip-10-0-1-7",
		"labels": map[string]any{"kubernetes.io/hostname": "ip-10-0-1-7"}}, "spec": spec, "status": map[string]any{"capacity": map[string]any{"cpu": "2"}}}
}

// The registration routes pass the Node, reduced to what the rule reads, and
// the route's cluster to Register, and answer with its verdict; whatever
// keeps nodeguard from judging admits the Node (joining never depends on
// nodeguard).
func TestRegistrationRoutes(t *testing.T) {
	g, _, _ := example(t)
	var got []admission.Registration
	answer := admission.RegistrationAnswer{Reason: admission.ReasonGhost, Message: "nodeguard: Node \"ip-10-0-1-7\" may not register: its host was not destroyed"}
	var fail error
	s := serve(t, admission.NewWebhook(admission.WebhookOptions{Decider: g, SelfCluster: "default/mgmt",
		Register: func(_ context.Context, r admission.Registration) (admission.RegistrationAnswer, error) {
			got = append(got, r)
			return answer, fail
		}}), admission.TLSOptions{}, nil)

	code, _, resp := s.post(t, "/register/clusters/default/dev", "application/json", registration(admissionv1.Create, kubeletNode("aws:///a/i-1"), nil))
	require.Equal(t, http.StatusOK, code)
	assert.False(t, resp.Response.Allowed)
	assert.Equal(t, int32(http.StatusForbidden), resp.Response.Result.Code)
	assert.Equal(t, answer.Message, resp.Response.Result.Message)
	require.Len(t, got, 1)
	assert.Equal(t, "default/dev", got[0].Cluster)
	assert.Equal(t, "CREATE", got[0].Operation)
	assert.Equal(t, map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": "ip-10-0-1-7"},
		"spec": map[string]any{"providerID": "aws:///a/i-1"}}, got[0].Node.Object, "reduced to what the rule reads")
	assert.Nil(t, got[0].Old)

	code, _, resp = s.post(t, "/register", "application/json", registration(admissionv1.Update, kubeletNode("aws:///a/i-1"), kubeletNode("")))
	require.Equal(t, http.StatusOK, code)
	assert.False(t, resp.Response.Allowed)
	require.Len(t, got, 2)
	assert.Equal(t, "default/mgmt", got[1].Cluster, "/register judges for --self-cluster")
	require.NotNil(t, got[1].Old)
	assert.Equal(t, "ip-10-0-1-7", got[1].Old.GetName())

	fail = errors.New("the inventory is not synced yet")
	_, _, resp = s.post(t, "/register", "application/json", registration(admissionv1.Create, kubeletNode("aws:///a/i-1"), nil))
	assert.True(t, resp.Response.Allowed, "fails open")
	require.Len(t, resp.Response.Warnings, 1)
	assert.Contains(t, resp.Response.Warnings[0], "the inventory is not synced yet")

	code, _, _ = s.post(t, "/register", "application/json", []byte(`{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}`))
	assert.Equal(t, http.StatusBadRequest, code, "the API server's failurePolicy Ignore admits it")
}

// Without a judge (ghost detection off), every registration is admitted.
func TestRegistrationsAreAdmittedWithoutAJudge(t *testing.T) {
	g, _, _ := example(t)
	s := serve(t, admission.NewWebhook(admission.WebhookOptions{Decider: g}), admission.TLSOptions{}, nil)
	code, _, resp := s.post(t, "/register", "application/json", registration(admissionv1.Create, kubeletNode("aws:///a/i-1"), nil))
	require.Equal(t, http.StatusOK, code)
	assert.True(t, resp.Response.Allowed)
	assert.Empty(t, resp.Response.Warnings)
}

// With a decision log, a registration's answer carries its decision_id and
// is logged.
func TestARegistrationIsDecisionLogged(t *testing.T) {
	g, _, _ := example(t)
	var console testlog.Buffer
	dlog, err := rule.StartDecisionLog(context.Background(), rule.DecisionLogOptions{Console: true, ConsoleOutput: &console})
	require.NoError(t, err)
	s := serve(t, admission.NewWebhook(admission.WebhookOptions{Decider: g, DecisionLog: dlog,
		Register: func(context.Context, admission.Registration) (admission.RegistrationAnswer, error) {
			return admission.RegistrationAnswer{Reason: admission.ReasonGhost, Message: "its host was not destroyed"}, nil
		}}), admission.TLSOptions{}, nil)
	_, _, resp := s.post(t, "/register/clusters/default/dev", "application/json", registration(admissionv1.Create, kubeletNode("aws:///a/i-1"), nil))
	id := resp.Response.AuditAnnotations[admission.DecisionIDAuditAnnotation]
	require.NotEmpty(t, id)
	lines := console.LinesAfter(t, dlog.Stop)
	require.Len(t, lines, 1)
	assert.Equal(t, id, lines[0]["decision_id"])
	assert.Equal(t, "nodeguard/registration", lines[0]["path"])
	assert.Equal(t, "ghost", lines[0]["result"].(map[string]any)["reason"])
	assert.Equal(t, "default/dev", lines[0]["custom"].(map[string]any)["cluster"])
}
