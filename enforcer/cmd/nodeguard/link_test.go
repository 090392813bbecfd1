package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/internal/policydoc"
	"github.com/nodeguard/nodeguard/internal/policytest"
	"github.com/nodeguard/nodeguard/internal/testbundle"
)

// hostIDLink is a sixth link, as a platform team would add it: a Node label
// naming the host, equal to an InfraMachine's spec.hostID.
const hostIDLink = `	{
		"type": "infraHostID",
		"role": "InfraMachine",
		"node": [["metadata", "labels", "example.com/host-id"]],
		"fields": [["spec", "hostID"]],
		"match": "equal",
		"when": "an InfraMachine's spec.hostID is the Node's example.com/host-id label",
		"blocks": "that InfraMachine",
		"phrase": "its spec.hostID",
	},
]
`

const hostNode = `apiVersion: v1
kind: Node
metadata:
  name: bare-1
  labels:
    example.com/host-id: rack4-slot7
spec:
  providerID: docker:////bare-1
`

// The DockerMachine shares nothing with the Node but the host ID: no Machine,
// a different providerID.
const hostMachine = `apiVersion: infrastructure.cluster.x-k8s.io/v1beta2
kind: DockerMachine
metadata:
  name: host-7
  namespace: default
spec:
  providerID: docker:////host-7
  hostID: rack4-slot7
`

// hostIDTests are the Rego tests the recipe asks for, in the fixtures' terms:
// the link blocks, and it does not when the field differs or is empty.
const hostIDTests = `
host_node := {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "bare-1", "labels": {"example.com/host-id": "rack4-slot7"}}}

host_machine := {
	"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "DockerMachine",
	"metadata": {"namespace": "default", "name": "host-7"}, "spec": {"hostID": "rack4-slot7"},
}

test_link_infra_host_id if {
	d := decide(host_node, [host_machine])
	d.reason == "blocked"
	link_types(d.blockers[0]) == {"infraHostID"}
}

test_link_infra_host_id_needs_the_same_id if {
	decide(host_node, [json.patch(host_machine, [{"op": "replace", "path": "/spec/hostID", "value": "rack4-slot8"}])]).allowed
	unset := json.patch(host_node, [{"op": "replace", "path": "/metadata/labels/example.com~1host-id", "value": ""}])
	decide(unset, [json.patch(host_machine, [{"op": "replace", "path": "/spec/hostID", "value": ""}])]).allowed
}
`

// CONTRIBUTING's "Adding a link", followed in a copy of policies/ and nothing
// else: an entry in links (links.rego) and its Rego tests. The copy's Rego
// tests pass as they are and on what the enforcer keeps (tests/fieldcoverage),
// docs/policy.md's link table shows it, and the offline check, the guard with
// fresh reads and the webhook follow it: the enforcer derives its cache,
// indexes, candidates and Node reduction from the declaration of the policy
// it runs.
func TestEnforcerFollowsALinkDeclaredOnlyInPolicies(t *testing.T) {
	ctx := context.Background()
	policy, err := policytest.Load()
	require.NoError(t, err)
	require.NoError(t, policy.Replace("lib/nodeguard/links.rego", "\n]\n", "\n"+hostIDLink), "links is one list ending with a line holding ]")
	policy["lib/nodeguard/decide_test.rego"] += hostIDTests
	recipePasses(ctx, t, policy, "| `infraHostID` | `metadata.labels.example.com/host-id` | InfraMachine: `spec.hostID` |")

	key := testbundle.NewKey(t)
	dir := t.TempDir()
	bundle := testbundle.WriteFile(t, dir, "host-id.tar.gz", testbundle.Signed(t, policy.Bundle(), "host-id", key.Private))
	files := t.TempDir()
	testbundle.WriteFile(t, files, "node.yaml", []byte(hostNode))
	testbundle.WriteFile(t, files, "machine.yaml", []byte(hostMachine))

	t.Run("nodeguard check -f", func(t *testing.T) {
		code, out, errOut := nodeguard(t, "check", "--node", "bare-1", "-f", files)
		assert.Equal(t, 0, code, "the embedded policy has no such link: %s %s", out, errOut)
		code, out, errOut = nodeguard(t, "check", "--node", "bare-1", "-f", files,
			"--bundle", bundle, "--bundle-verification-key", key.PublicKeyFile)
		assert.Equal(t, 2, code, errOut)
		assert.Contains(t, out, "DockerMachine default/host-7")
		assert.Contains(t, out, "its spec.hostID")
	})

	eval, err := rule.LoadBundle(ctx, rule.BundleOptions{Path: bundle, VerificationKeyFile: key.PublicKeyFile})
	require.NoError(t, err)
	inv := facts.NewInventory(eval.Model())
	gvk := schema.GroupVersionKind{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Kind: "DockerMachine"}
	store := inv.NewStore(facts.InfraMachine)
	inv.AddKind(gvk, facts.InfraMachine, store)
	machine := &unstructured.Unstructured{}
	require.NoError(t, runtime.DecodeInto(unstructured.UnstructuredJSONScheme, yamlToJSON(t, hostMachine), machine))
	require.NoError(t, store.Add(inv.Record(machine, facts.InfraMachine)))
	fresh := &freshReads{objs: map[string]*unstructured.Unstructured{"default/host-7": machine}}
	g, err := guard.New(ctx, inv, guard.Options{Engine: eval, Fresh: fresh})
	require.NoError(t, err)
	node := &unstructured.Unstructured{}
	require.NoError(t, runtime.DecodeInto(unstructured.UnstructuredJSONScheme, yamlToJSON(t, hostNode), node))

	t.Run("guard with fresh reads", func(t *testing.T) {
		d, err := g.Decide(ctx, guard.Request{Node: node})
		require.NoError(t, err)
		assert.False(t, d.Allowed, "the cached and re-read DockerMachine blocks through the new link")
		require.Len(t, d.Blockers, 1)
		assert.Equal(t, "infraHostID", d.Blockers[0].Links[0].Type)
		assert.Equal(t, []string{"default/host-7"}, fresh.got, "the candidate the new index picked was re-read")

		// The API server says it is gone: the fresh read, not the cache, decides.
		gone := &freshReads{objs: map[string]*unstructured.Unstructured{}}
		g2, err := guard.New(ctx, inv, guard.Options{Engine: eval, Fresh: gone})
		require.NoError(t, err)
		d, err = g2.Decide(ctx, guard.Request{Node: node})
		require.NoError(t, err)
		assert.True(t, d.Allowed, d.Messages)
	})

	t.Run("webhook keeps the new Node field", func(t *testing.T) {
		answer := admit(t, g, authenticationv1.UserInfo{Username: "someone"}, yamlToJSON(t, hostNode))
		assert.False(t, answer.Allowed)
		assert.Contains(t, answer.Result.Message, "its spec.hostID")
	})
}

// admit is the webhook's answer, with g deciding, to user's DELETE of node
// (its JSON).
func admit(t *testing.T, g *guard.Guard, user authenticationv1.UserInfo, node []byte) *admissionv1.AdmissionResponse {
	t.Helper()
	var meta struct {
		Metadata struct{ Name string } `json:"metadata"`
	}
	require.NoError(t, json.Unmarshal(node, &meta))
	review := admissionv1.AdmissionReview{Request: &admissionv1.AdmissionRequest{
		UID: "u1", Name: meta.Metadata.Name, Operation: admissionv1.Delete, Kind: metaGVK("", "v1", "Node"),
		UserInfo: user, OldObject: runtime.RawExtension{Raw: node},
	}}
	review.APIVersion, review.Kind = "admission.k8s.io/v1", "AdmissionReview"
	body, err := json.Marshal(review)
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, admission.WebhookRouteSelf, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	admission.NewWebhook(admission.WebhookOptions{Decider: g}).ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var answer admissionv1.AdmissionReview
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &answer))
	return answer.Response
}

// freshReads is an API server for fresh reads: objs by namespace/name.
type freshReads struct {
	objs map[string]*unstructured.Unstructured
	got  []string
}

func (f *freshReads) Get(_ context.Context, _ schema.GroupVersionKind, namespace, name string) (*unstructured.Unstructured, error) {
	f.got = append(f.got, namespace+"/"+name)
	if o, ok := f.objs[namespace+"/"+name]; ok {
		return o.DeepCopy(), nil
	}
	return nil, nil
}

func yamlToJSON(t *testing.T, y string) []byte {
	t.Helper()
	b, err := sigsyaml.YAMLToJSON([]byte(y))
	require.NoError(t, err)
	return b
}

func metaGVK(group, version, kind string) metav1.GroupVersionKind {
	return metav1.GroupVersionKind{Group: group, Version: version, Kind: kind}
}

// recipePasses checks what `make test` and `make generate` check of a policy
// copy: its Rego tests pass, as they are and projected on what the enforcer
// keeps, and docs/policy.md, rendered from it, holds doc.
func recipePasses(ctx context.Context, t *testing.T, files policytest.Files, doc ...string) {
	t.Helper()
	for _, projected := range []bool{false, true} {
		r, err := policytest.Run(ctx, files, projected)
		require.NoError(t, err)
		assert.Empty(t, r.Failed, "projected %t: %v", projected, r.Errors)
		assert.Greater(t, r.Passed, 100, "the copy's Rego tests ran")
	}
	compiled, err := files.Compile()
	require.NoError(t, err)
	page, err := policydoc.RenderPolicyOf(ctx, compiled)
	require.NoError(t, err)
	for _, want := range doc {
		assert.Contains(t, string(page), want)
	}
}
