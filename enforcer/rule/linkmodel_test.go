package rule_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/policies"
)

// declarations are the embedded policy's link model as the policy declares
// it (JSON-shaped), the same with a sixth link a platform team might add, and
// with fewer links: the tests below derive what they expect from whichever
// they are given, so a new link in links.rego needs no change here.
func declarations(t *testing.T) map[string]map[string]any {
	t.Helper()
	compiled, err := policies.Compile()
	require.NoError(t, err)
	rs, err := rego.New(rego.Query(rule.ModelQuery), rego.Compiler(compiled)).Eval(context.Background())
	require.NoError(t, err)
	embedded, ok := rego.ResultValue[map[string]any](rs)
	require.True(t, ok, "the policy declares %s", rule.ModelQuery)
	sixth := clone(t, embedded)
	sixth["links"] = append(sixth["links"].([]any), map[string]any{
		"type": "infraHostID", "role": "InfraMachine", "match": "equal",
		"node": []any{[]any{"metadata", "labels", "example.com/host-id"}}, "fields": []any{[]any{"spec", "hostID"}},
		"when": "an InfraMachine's spec.hostID is the Node's example.com/host-id label", "blocks": "that InfraMachine", "phrase": "its spec.hostID",
	})
	sixth["node_fields"] = append(sixth["node_fields"].([]any), []any{"metadata", "labels", "example.com/host-id"})
	// Without the links comparing an InfraMachine's providerID, the orphan
	// criteria still read it (provider_id).
	fewer := clone(t, embedded)
	var kept []any
	for _, l := range fewer["links"].([]any) {
		if l.(map[string]any)["role"] != string(rule.InfraMachine) {
			kept = append(kept, l)
		}
	}
	fewer["links"] = kept
	return map[string]map[string]any{"embedded": embedded, "with a sixth link": sixth, "without InfraMachine links": fewer}
}

func clone(t *testing.T, v map[string]any) map[string]any {
	t.Helper()
	raw, err := json.Marshal(v)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(raw, &out))
	return out
}

func parse(t *testing.T, decl map[string]any) *rule.Model {
	t.Helper()
	raw, err := json.Marshal(decl)
	require.NoError(t, err)
	m, err := rule.ParseModel(raw)
	require.NoError(t, err)
	return m
}

// path reads a declared path (a JSON list of strings).
func path(v any) rule.Path {
	var out rule.Path
	for _, seg := range v.([]any) {
		out = append(out, seg.(string))
	}
	return out
}

func paths(v any) []rule.Path {
	var out []rule.Path
	for _, p := range v.([]any) {
		out = append(out, path(p))
	}
	return out
}

// The model holds every declared link as declared, and knows which name an
// object by namespace and name.
func TestModelHoldsEveryDeclaredLink(t *testing.T) {
	for name, decl := range declarations(t) {
		t.Run(name, func(t *testing.T) {
			m := parse(t, decl)
			declared := decl["links"].([]any)
			require.Len(t, m.Links, len(declared))
			for i, d := range declared {
				d := d.(map[string]any)
				l := m.Links[i]
				assert.Equal(t, d["type"], l.Type)
				assert.Equal(t, rule.Role(d["role"].(string)), l.Role, l.Type)
				assert.Equal(t, rule.Match(d["match"].(string)), l.Match, l.Type)
				assert.Equal(t, paths(d["node"]), l.Node, l.Type)
				assert.Equal(t, paths(d["fields"]), l.Fields, l.Type)
				assert.Equal(t, []string{d["when"].(string), d["blocks"].(string), d["phrase"].(string)}, []string{l.When, l.Blocks, l.Phrase}, l.Type)
				assert.NotContains(t, []string{l.When, l.Blocks, l.Phrase}, "", "%s: people read these", l.Type)

				ns := slices.IndexFunc(l.Fields, func(p rule.Path) bool { return p.String() == "metadata.namespace" })
				nm := slices.IndexFunc(l.Fields, func(p rule.Path) bool { return p.String() == "metadata.name" })
				keyed := l.Match == rule.Equal && len(l.Fields) == 2 && ns >= 0 && nm >= 0
				gotNS, gotName, ok := l.Keyed()
				assert.Equal(t, keyed, ok, "%s names an object by namespace and name", l.Type)
				if keyed {
					assert.Equal(t, []int{ns, nm}, []int{gotNS, gotName}, l.Type)
				}
			}
			kind := decl["machine_kind"].(map[string]any)
			assert.Equal(t, schema.GroupKind{Group: kind["group"].(string), Kind: kind["kind"].(string)}, m.MachineKind)
			assert.Equal(t, paths(decl["node_fields"]), m.NodePaths())
		})
	}
	assert.True(t, slices.ContainsFunc(rule.MustEmbeddedModel().Links, func(l rule.Link) bool {
		_, _, keyed := l.Keyed()
		return keyed
	}), "the embedded model names a Machine by namespace and name (the nodeAnnotation link)")
}

// What the enforcer keeps of each role follows from the declaration alone:
// every object's namespace, name, deletion_timestamp and cluster_label; a
// referrer's cluster_name, provider_id, pool_name and reference keys; an
// InfraMachine's provider_id;
// and the fields of the links of that role (a contains link's as a list).
func TestShapesKeepTheDeclaredFields(t *testing.T) {
	for name, decl := range declarations(t) {
		t.Run(name, func(t *testing.T) {
			m := parse(t, decl)
			for _, role := range rule.Roles() {
				want := map[string]bool{"metadata.namespace": true, "metadata.name": true,
					path(decl["deletion_timestamp"]).String(): true, path(decl["cluster_label"]).String(): true}
				if r, ok := decl["referrers"].(map[string]any)[string(role)].(map[string]any); ok {
					for _, k := range []string{"cluster_name", "provider_id", "pool_name"} {
						want[path(decl[k]).String()] = true
					}
					for _, k := range []string{"apiGroup", "apiVersion", "kind", "name", "namespace"} {
						want[path(r["reference"]).String()+"."+k] = true
					}
				}
				if role == rule.InfraMachine {
					want[path(decl["provider_id"]).String()] = true
				}
				for _, l := range decl["links"].([]any) {
					l := l.(map[string]any)
					if l["role"] != string(role) {
						continue
					}
					for _, f := range paths(l["fields"]) {
						if l["match"] == string(rule.Contains) {
							want[f.String()+"[]"] = true
						} else {
							want[f.String()] = true
						}
					}
				}
				got := map[string]bool{}
				for _, f := range m.Fields(role) {
					s := f.Path.String()
					if f.List {
						s += "[]"
					}
					assert.False(t, got[s], "%s: %s kept twice", role, s)
					got[s] = true
				}
				assert.Equal(t, want, got, role)
			}
		})
	}
}

func TestParseRefusesWhatTheEnforcerCannotFollow(t *testing.T) {
	valid := func() map[string]any {
		return map[string]any{
			"referrers": map[string]any{"Machine": map[string]any{"group": "cluster.x-k8s.io", "kind": "Machine",
				"reference": []any{"spec", "infrastructureRef"}, "names": "InfraMachine", "kinds": "infraMachineKinds"}},
			"deletion_timestamp": []any{"metadata", "deletionTimestamp"},
			"cluster_label":      []any{"metadata", "labels", "c"}, "cluster_name": []any{"spec", "clusterName"},
			"provider_id": []any{"spec", "providerID"}, "pool_name": []any{"metadata", "labels", "p"},
			"links": []any{map[string]any{"type": "a", "role": "InfraMachine", "node": []any{[]any{"spec", "providerID"}},
				"fields": []any{[]any{"spec", "providerID"}}, "match": "equal"}},
			"node_fields":      []any{[]any{"metadata", "name"}, []any{"spec", "providerID"}},
			"node_provider_id": []any{"spec", "providerID"},
		}
	}
	// nodeFields sets the link's Node fields, declared in node_fields too.
	nodeFields := func(m map[string]any, paths ...[]any) {
		link := m["links"].([]any)[0].(map[string]any)
		link["node"] = []any{}
		for _, p := range paths {
			link["node"] = append(link["node"].([]any), p)
			m["node_fields"] = append(m["node_fields"].([]any), p)
		}
	}
	parse := func(edit func(m map[string]any)) error {
		m := valid()
		edit(m)
		raw, err := json.Marshal(m)
		require.NoError(t, err)
		_, err = rule.ParseModel(raw)
		return err
	}
	require.NoError(t, parse(func(map[string]any) {}))
	link := func(m map[string]any) map[string]any { return m["links"].([]any)[0].(map[string]any) }
	referrer := func(m map[string]any) map[string]any {
		return m["referrers"].(map[string]any)["Machine"].(map[string]any)
	}
	for name, edit := range map[string]func(m map[string]any){
		"unknown role":        func(m map[string]any) { link(m)["role"] = "Cluster" },
		"unknown match":       func(m map[string]any) { link(m)["match"] = "prefix" },
		"fields without node": func(m map[string]any) { link(m)["node"] = []any{} },
		"contains two fields": func(m map[string]any) {
			link(m)["match"] = "contains"
			link(m)["fields"] = []any{[]any{"a"}, []any{"b"}}
		},
		"empty path segment":    func(m map[string]any) { link(m)["fields"] = []any{[]any{"spec", ""}} },
		"repeated type":         func(m map[string]any) { m["links"] = append(m["links"].([]any), link(m)) },
		"no machine referrer":   func(m map[string]any) { delete(m, "referrers") },
		"no reference":          func(m map[string]any) { delete(referrer(m), "reference") },
		"referrer names itself": func(m map[string]any) { referrer(m)["names"] = "Machine" },
		"referrer names a referrer": func(m map[string]any) {
			m["referrers"].(map[string]any)["MachinePool"] = map[string]any{"group": "g", "kind": "MachinePool",
				"reference": []any{"spec", "r"}, "names": "Machine"}
		},
		"unknown referrer role": func(m map[string]any) {
			m["referrers"].(map[string]any)["Cluster"] = map[string]any{"group": "g", "kind": "Cluster",
				"reference": []any{"spec", "r"}, "names": "InfraMachine"}
		},
		"no pool_name": func(m map[string]any) { delete(m, "pool_name") },
		"node field in string": func(m map[string]any) {
			nodeFields(m, []any{"spec", "providerID"}, []any{"spec", "providerID", "x"})
			link(m)["fields"] = []any{[]any{"a"}, []any{"b"}}
		},
		"undecodable key":           func(m map[string]any) { nodeFields(m, []any{"metadata", "labels", "a,b"}) },
		"node field not declared":   func(m map[string]any) { link(m)["node"] = []any{[]any{"metadata", "labels", "a"}} },
		"node_fields without name":  func(m map[string]any) { m["node_fields"] = []any{[]any{"spec", "providerID"}} },
		"no node_provider_id":       func(m map[string]any) { delete(m, "node_provider_id") },
		"node_provider_id not read": func(m map[string]any) { m["node_provider_id"] = []any{"spec", "externalID"} },
		"empty node_fields segment": func(m map[string]any) { m["node_fields"] = append(m["node_fields"].([]any), []any{"spec", ""}) },
	} {
		assert.Error(t, parse(edit), name)
	}
}

// The Node reaches the rule as what the rule reads of it, whichever way it
// came: decoded from a review or stripped from an object.
func TestNodeKeepsWhatTheRuleReads(t *testing.T) {
	m := rule.MustEmbeddedModel()
	raw := []byte(`{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1","labels":{"a":"b"},
		"annotations":{"cluster.x-k8s.io/machine":"m1","cluster.x-k8s.io/cluster-namespace":"ns","other":"x"},
		"managedFields":[{"manager":"kubelet"}]},
		"spec":{"providerID":"docker:////n1","taints":[{},{},{}]},"status":{"images":[{"names":["a"]}]}}`)
	want := map[string]any{"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": "n1", "annotations": map[string]any{
			"cluster.x-k8s.io/machine": "m1", "cluster.x-k8s.io/cluster-namespace": "ns"}},
		"spec": map[string]any{"providerID": "docker:////n1"}}
	got, err := m.NodeShape().FromJSON(raw)
	require.NoError(t, err)
	assert.Equal(t, want, got.Object())
	full := &unstructured.Unstructured{}
	require.NoError(t, full.UnmarshalJSON(raw))
	assert.Equal(t, want, m.NodeShape().FromUnstructured(full).Object())

	// Names match as the API server matches them: "providerid" is not
	// spec.providerID.
	got, err = m.NodeShape().FromJSON([]byte(`{"apiVersion":"v1","kind":"Node","metadata":{"name":"n2"},"spec":{"providerid":"x"}}`))
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": "n2"}}, got.Object())

	_, err = m.NodeShape().FromJSON([]byte(`{"spec":"not an object"}`))
	assert.Error(t, err)
	_, err = m.NodeShape().FromJSON([]byte(`{"spec":{"providerID":7}}`))
	assert.Error(t, err, "a declared field that is not a string")
}

// The groups the enforcer keeps of a user are those the declared group
// parameters list, whichever they are.
func TestGroupsAreWhatTheGroupParametersList(t *testing.T) {
	decl := declarations(t)["embedded"]
	m := parse(t, decl)
	assert.Equal(t, decl["group_parameters"], toAny(m.GroupParameters))
	assert.Contains(t, m.GroupParameters, "exemptGroups")
	params := map[string]any{"exemptGroups": []any{"ops", 7}, "breakGlassGroups": []any{"oncall"}, "exemptUsers": []any{"alice"}}
	assert.Equal(t, map[string]bool{"ops": true}, m.Groups(params))

	decl = clone(t, decl)
	decl["group_parameters"] = []any{"breakGlassGroups", "exemptGroups"}
	m = parse(t, decl)
	assert.Equal(t, map[string]bool{"ops": true, "oncall": true}, m.Groups(params))
	assert.Equal(t, map[string]bool{}, m.Groups(map[string]any{}), "unset: no group is read")
	assert.Nil(t, m.Groups(map[string]any{"exemptGroups": "ops"}), "not a list: every group is kept")
}

func toAny(s []string) []any {
	out := []any{}
	for _, x := range s {
		out = append(out, x)
	}
	return out
}

// The links that name a host are those on the Node's providerID alone: what
// a tombstone remembers when the object carrying it goes.
func TestProviderIDLinksAreTheLinksOnTheNodesProviderID(t *testing.T) {
	m := rule.MustEmbeddedModel()
	types := func(role rule.Role) []string {
		var out []string
		for _, l := range m.ProviderIDLinks(role) {
			out = append(out, l.Type)
		}
		return out
	}
	assert.Equal(t, rule.Path{"spec", "providerID"}, m.NodeProviderID)
	assert.Equal(t, []string{"machineProviderID"}, types(rule.Machine))
	assert.Equal(t, []string{"infraProviderID"}, types(rule.InfraMachine))
	assert.Equal(t, []string{"poolProviderIDList"}, types(rule.InfraMachinePool))
	assert.Equal(t, []string{"machinePoolProviderIDList"}, types(rule.MachinePool))
}
