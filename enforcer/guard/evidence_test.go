package guard_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/record"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/internal/testcluster"
)

func dockerMachine(inv *facts.Inventory, name, cluster, pid string) *record.Record {
	o := testcluster.Object(testcluster.DockerMachineGVK, "default", name, map[string]any{"spec": map[string]any{"providerID": pid}})
	o.SetLabels(map[string]string{"cluster.x-k8s.io/cluster-name": cluster})
	return inv.Record(o, facts.InfraMachine)
}

// Evidence changes only when a (kind, namespace, cluster, scheme) appears or
// goes, and always shows an InfraMachine that still exists.
func TestEvidenceFollowsItsKeys(t *testing.T) {
	model := rule.MustEmbeddedModel()
	inv := facts.NewInventory(model)
	e := guard.NewEvidence(model)
	a := dockerMachine(inv, "a", "dev", "docker:////a")
	b := dockerMachine(inv, "b", "dev", "docker:////b")
	assert.True(t, e.Update(nil, a), "the first docker:// InfraMachine of dev")
	assert.False(t, e.Update(nil, b), "a second one changes nothing the criteria read")
	assert.Len(t, e.Objects(), 1)
	assert.False(t, e.Update(a, nil))
	shown := e.Objects()
	if assert.Len(t, shown, 1) {
		assert.Equal(t, "b", shown[0].GetName(), "the one deleted is no longer shown")
	}
	moved := dockerMachine(inv, "b", "dev", "docker:////b-moved")
	assert.False(t, e.Update(b, moved), "the only one, updated within its key")
	assert.True(t, e.Update(moved, dockerMachine(inv, "b", "prod", "docker:////b")), "relabelled for another cluster")
	assert.True(t, e.Update(nil, dockerMachine(inv, "c", "dev", "aws:///x/i-1")), "another scheme")
	assert.False(t, e.Update(nil, dockerMachine(inv, "d", "dev", "no-scheme")), "no scheme, no evidence")
	assert.Len(t, e.Objects(), 2)
}

// A cluster route reads only its own cluster's evidence, which is all the
// criteria count there: at thousands of clusters every other cluster's
// would be read for each Node and thrown away.
func TestEvidenceForAClusterIsItsOwn(t *testing.T) {
	model := rule.MustEmbeddedModel()
	inv := facts.NewInventory(model)
	e := guard.NewEvidence(model)
	e.Update(nil, dockerMachine(inv, "a", "dev", "docker:////a"))
	e.Update(nil, dockerMachine(inv, "b", "prod", "docker:////b"))
	e.Update(nil, dockerMachine(inv, "c", "prod", "aws:///x/i-1"))
	names := func(cluster string) []string {
		var out []string
		for _, o := range e.ObjectsFor(cluster) {
			out = append(out, o.GetName())
		}
		return out
	}
	assert.Equal(t, []string{"a"}, names("default/dev"))
	assert.ElementsMatch(t, []string{"b", "c"}, names("default/prod"))
	assert.Empty(t, names("other/prod"), "the namespace counts too")
	assert.ElementsMatch(t, []string{"a", "b", "c"}, names(""), "no cluster route: all of it")
}

// What ObjectsFor leaves out changes no verdict: for Nodes that are orphans
// by their scheme's evidence or kept for the lack of it, on every route, the
// criteria find the same with every cluster's evidence as with the route's
// own (the Rego decides; this checks the Go's narrowing agrees with it).
func TestEvidenceForAClusterJudgesAsAllOfIt(t *testing.T) {
	ctx := context.Background()
	eng, err := rule.NewEngine(ctx)
	require.NoError(t, err)
	model := rule.MustEmbeddedModel()
	inv := facts.NewInventory(model)
	e := guard.NewEvidence(model)
	for _, r := range []*record.Record{dockerMachine(inv, "a", "dev", "docker:////a"), dockerMachine(inv, "b", "prod", "aws:///x/i-1")} {
		e.Update(nil, r)
	}
	node := func(pid string) map[string]any {
		return map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": "n"},
			"spec":   map[string]any{"providerID": pid},
			"status": map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": "Unknown", "lastTransitionTime": "2026-11-30T11:00:00Z"}}}}
	}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	orphans := 0
	for _, route := range []string{"default/dev", "default/prod", "default/staging", "other/dev"} {
		ns, name, _ := strings.Cut(route, "/")
		params, err := rule.NewParameters(map[string]any{"clusterNamespace": ns, "clusterName": name})
		require.NoError(t, err)
		for _, pid := range []string{"docker:////gone", "aws:///x/i-9"} {
			judge := func(evidence []*unstructured.Unstructured) bool {
				v, err := rule.Run[guard.OrphanVerdict](ctx, eng, rule.OrphanEntry, guard.CriteriaInput{Node: node(pid), Inventory: facts.Layout(evidence),
					Parameters: params, Now: now, Grace: time.Minute, MatchProviderID: true}.Fields())
				require.NoError(t, err)
				return v.Orphan
			}
			all, own := judge(e.Objects()), judge(e.ObjectsFor(route))
			assert.Equal(t, all, own, "route %s, Node %s", route, pid)
			if own {
				orphans++
			}
		}
	}
	assert.Equal(t, 2, orphans, "dev's docker Node and prod's aws Node are orphans by their cluster's evidence; the rest are kept")
}
