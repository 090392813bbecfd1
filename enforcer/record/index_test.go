package record_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

	"github.com/nodeguard/nodeguard/enforcer/record"
)

var (
	providerID = record.Path{"spec", "providerID"}
	pair       = []record.Path{{"metadata", "annotations", "cluster"}, {"metadata", "annotations", "machine"}}
	idList     = record.Path{"spec", "providerIDList"}
)

func poolShape(t *testing.T) *record.Shape {
	t.Helper()
	s, err := record.NewShape(record.Spec{
		Scalars: append([]record.Path{providerID}, pair...),
		Lists:   []record.Path{idList},
		Indexes: [][]record.Path{{providerID}, pair, {idList}},
	})
	require.NoError(t, err)
	return s
}

func poolRecord(s *record.Shape, i int, ids ...string) *record.Record {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "example.io/v1", "kind": "Pool",
		"metadata": map[string]any{"namespace": "ns", "name": fmt.Sprintf("p-%d", i),
			"annotations": map[string]any{"cluster": fmt.Sprintf("c-%d", i%7), "machine": fmt.Sprintf("m-%d", i)}},
		"spec": map[string]any{"providerID": fmt.Sprintf("id-%d", i)},
	}}
	if len(ids) > 0 {
		list := make([]any, len(ids))
		for i, id := range ids {
			list[i] = id
		}
		u.Object["spec"].(map[string]any)["providerIDList"] = list
	}
	return s.FromUnstructured(u)
}

func names(rs []*record.Record) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Name())
	}
	slices.Sort(out)
	return out
}

// Far more records than buckets, so buckets are shared: Find returns exactly
// the records holding the values, found through client-go's own indexes, as
// the store changes; and the indexes hold buckets, not a set per value.
func TestFindReturnsExactlyTheRecordsHoldingTheValues(t *testing.T) {
	s := poolShape(t)
	store := cache.NewIndexer(cache.MetaNamespaceKeyFunc, s.Indexers())
	const n = 20000
	for i := range n {
		require.NoError(t, store.Add(poolRecord(s, i, fmt.Sprintf("id-%d", i), fmt.Sprintf("shared-%d", i%3), "")))
	}
	byID, byPair, byList := s.IndexOf([]record.Path{providerID}), s.IndexOf(pair), s.IndexOf([]record.Path{idList})
	require.Equal(t, []int{0, 1, 2}, []int{byID, byPair, byList})

	for _, i := range []int{0, 1, 4095, 4096, 12345, n - 1} {
		assert.Equal(t, []string{fmt.Sprintf("p-%d", i)}, names(s.Find(store, byID, []string{fmt.Sprintf("id-%d", i)})), "providerID of %d", i)
		assert.Equal(t, []string{fmt.Sprintf("p-%d", i)}, names(s.Find(store, byPair, []string{fmt.Sprintf("c-%d", i%7), fmt.Sprintf("m-%d", i)})), "pair of %d", i)
		assert.Equal(t, []string{fmt.Sprintf("p-%d", i)}, names(s.Find(store, byList, []string{fmt.Sprintf("id-%d", i)})), "list entry of %d", i)
	}
	assert.Equal(t, (n+1)/3, len(s.Find(store, byList, []string{"shared-1"})), "a list entry many records hold (i %% 3 == 1)")
	assert.Empty(t, s.Find(store, byID, []string{"id-none"}))
	assert.Empty(t, s.Find(store, byPair, []string{"c-1", "m-0"}), "both values, of different records")
	assert.Empty(t, s.Find(store, byID, []string{""}), "an empty value is never found (a link never holds on it)")
	assert.Empty(t, s.Find(store, byList, []string{""}), "nor an empty list entry")
	assert.Empty(t, s.Find(store, byPair, []string{"c-0"}), "a tuple of the wrong width")
	assert.Empty(t, s.Find(store, 3, []string{"id-0"}), "no such tuple")

	assert.LessOrEqual(t, len(store.ListIndexFuncValues(record.IndexName(byID))), record.DefaultIndexBuckets, "index values are buckets, shared")

	// Changes move the record at once: client-go updates its indexes with
	// the store.
	require.NoError(t, store.Update(poolRecord(s, 7, "id-new")))
	assert.Empty(t, s.Find(store, byID, []string{"id-none"}))
	assert.Equal(t, []string{"p-7"}, names(s.Find(store, byList, []string{"id-new"})))
	assert.Empty(t, s.Find(store, byList, []string{"id-7"}), "the list entry the record no longer holds")
	assert.Equal(t, []string{"p-7"}, names(s.Find(store, byID, []string{"id-7"})))
	require.NoError(t, store.Delete(poolRecord(s, 7)))
	assert.Empty(t, s.Find(store, byID, []string{"id-7"}))
	assert.Empty(t, s.Find(store, byList, []string{"id-new"}))

	// A list naming one entry twice: found once, gone with its record.
	require.NoError(t, store.Add(poolRecord(s, n, "twice", "twice")))
	assert.Equal(t, []string{fmt.Sprintf("p-%d", n)}, names(s.Find(store, byList, []string{"twice"})))
	require.NoError(t, store.Delete(poolRecord(s, n)))
	assert.Empty(t, s.Find(store, byList, []string{"twice"}))

	// A store without the shape's indexes finds nothing, and the indexes
	// refuse what is not a record of the shape.
	assert.Empty(t, s.Find(cache.NewIndexer(cache.MetaNamespaceKeyFunc, nil), byID, []string{"id-0"}))
	_, err := s.Indexers()[record.IndexName(byID)](nodeShape(t).FromUnstructured(&unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": "n"}}}))
	assert.Error(t, err)
}

// A shape with few buckets finds the same records, its index holding no
// more values than it has buckets.
func TestFewBucketsFindTheSame(t *testing.T) {
	s, err := record.NewShape(record.Spec{Scalars: []record.Path{providerID}, Indexes: [][]record.Path{{providerID}}, IndexBuckets: 4})
	require.NoError(t, err)
	store := cache.NewIndexer(cache.MetaNamespaceKeyFunc, s.Indexers())
	for i := range 1000 {
		require.NoError(t, store.Add(poolRecord(s, i)))
	}
	assert.LessOrEqual(t, len(store.ListIndexFuncValues(record.IndexName(0))), 4)
	for _, i := range []int{0, 3, 999} {
		assert.Equal(t, []string{fmt.Sprintf("p-%d", i)}, names(s.Find(store, 0, []string{fmt.Sprintf("id-%d", i)})))
	}
}

// Bucket serves an index of the caller's own: equal keys share a bucket,
// and the buckets are few.
func TestBucketIsStableAndBounded(t *testing.T) {
	s := poolShape(t)
	seen := map[string]bool{}
	for i := range 50000 {
		key := []string{"infrastructure.cluster.x-k8s.io", "DockerMachine", "ns", fmt.Sprintf("m-%d", i)}
		b := s.Bucket(key...)
		assert.Equal(t, b, s.Bucket(key...))
		seen[b] = true
	}
	assert.LessOrEqual(t, len(seen), 1<<12)
	assert.Greater(t, len(seen), 1<<11, "keys spread over the buckets")
}

func TestIndexTuplesMustBeKeptFields(t *testing.T) {
	for name, spec := range map[string]record.Spec{
		"a list beside a string":     {Scalars: []record.Path{providerID}, Lists: []record.Path{idList}, Indexes: [][]record.Path{{providerID, idList}}},
		"an empty tuple":             {Indexes: [][]record.Path{{}}},
		"buckets not a power of two": {Scalars: []record.Path{providerID}, Indexes: [][]record.Path{{providerID}}, IndexBuckets: 100},
		"too many buckets":           {Scalars: []record.Path{providerID}, Indexes: [][]record.Path{{providerID}}, IndexBuckets: 1 << 13},
	} {
		_, err := record.NewShape(spec)
		assert.Error(t, err, name)
	}
}
