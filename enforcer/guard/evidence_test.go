package guard_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

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
