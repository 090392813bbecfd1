package facts_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clienttesting "k8s.io/client-go/testing"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/internal/testcluster"
)

// labelled sets the Cluster's name and the watch filter on u.
func labelled(u *unstructured.Unstructured, cluster, shard string) *unstructured.Unstructured {
	u.SetLabels(map[string]string{"cluster.x-k8s.io/cluster-name": cluster, "cluster.x-k8s.io/watch-filter": shard})
	return u
}

// A shard holds a Cluster only once every object carrying its name carries
// the shard's label and is cached; an object that left the caches
// unprovoked by a deletion makes it not held at once, until proven again.
func TestShardHoldsAClusterOnlyWhole(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	objs := dockerM1()
	objs[0] = labelled(objs[0].(*unstructured.Unstructured), "c1", "a")
	objs[1] = labelled(objs[1].(*unstructured.Unstructured), "c1", "a")
	// m2 of the same Cluster is still the other shard's.
	m2 := labelled(informerMachine("m2", "infrastructure.cluster.x-k8s.io", "DockerMachine"), "c1", "b")
	client, mapper := setup(t, append(objs, m2)...)
	inv := facts.NewInventory(rule.MustEmbeddedModel())
	s := facts.NewSyncer(inv, facts.SyncerOptions{Client: client, Mapper: mapper, Contract: true, WatchFilter: "a"})
	var mu sync.Mutex
	var moved []facts.Change
	require.NoError(t, s.Subscribe(func(c facts.Change) {
		if c.New == nil {
			mu.Lock()
			moved = append(moved, c)
			mu.Unlock()
		}
	}))
	shard := facts.NewShard(facts.ShardOptions{Value: "a", Client: client, Syncer: s})
	require.NoError(t, s.Start(ctx))
	require.Eventually(t, func() bool { return s.Ready() == nil }, 5*time.Second, 10*time.Millisecond)
	members := map[string]bool{"default/c1": true}
	var mm sync.Mutex
	go shard.Run(ctx, func(key string) bool { mm.Lock(); defer mm.Unlock(); return members[key] })

	assert.ErrorContains(t, shard.Holds(""), "names no Cluster")
	assert.ErrorContains(t, shard.Holds("default/other"), "not one of this nodeguard's Clusters")
	shard.ClusterChanged("default/c1")
	require.Eventually(t, func() bool {
		err := shard.Holds("default/c1")
		return err != nil && strings.Contains(err.Error(), "moving between nodeguard shards") && strings.Contains(err.Error(), "Machine default/m2")
	}, 5*time.Second, 10*time.Millisecond, "m2 is labelled for shard b")

	// m2 relabelled for this shard: held once it is cached (the next look,
	// within the moving retry).
	machines := client.Resource(testcluster.MachineGVK.GroupVersion().WithResource("machines")).Namespace("default")
	labelled(m2, "c1", "a")
	_, err := machines.Update(ctx, m2, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return shard.Holds("default/c1") == nil }, 10*time.Second, 20*time.Millisecond)

	// An object that leaves without a deletionTimestamp was moved away:
	// the Cluster is not held from that event on, and proven again at once
	// (not at the 10-minute recheck).
	proofs := func() int {
		n := 0
		for _, a := range client.Actions() {
			if l, ok := a.(clienttesting.ListAction); ok && l.GetListRestrictions().Labels.String() == "cluster.x-k8s.io/cluster-name=c1" {
				n++
			}
		}
		return n
	}
	before := proofs()
	require.NoError(t, machines.Delete(ctx, "m2", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(moved) == 1 }, 5*time.Second, 10*time.Millisecond)
	mu.Lock()
	assert.True(t, moved[0].Moved, "a delete with no deletionTimestamp in a filtered cache is a move")
	mu.Unlock()
	require.Eventually(t, func() bool { return proofs() > before && shard.Holds("default/c1") == nil }, 10*time.Second, 20*time.Millisecond,
		"proven again: m2 is gone for good")

	// A Cluster no longer the install's is forgotten.
	mm.Lock()
	delete(members, "default/c1")
	mm.Unlock()
	shard.ClusterChanged("default/c1")
	require.Eventually(t, func() bool { return shard.Holds("default/c1") != nil }, 5*time.Second, 10*time.Millisecond)
}
