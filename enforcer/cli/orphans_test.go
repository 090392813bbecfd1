package cli

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/internal/testcluster"
)

func TestLiveListAndDelete(t *testing.T) {
	ctx := context.Background()
	client, mapper := testcluster.CAPD(t, "../nodes/testdata")
	c := kube.Clients{Dynamic: client, Mapper: mapper}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	eval, err := rule.NewEngine(ctx)
	require.NoError(t, err)

	r, err := runLiveWith(ctx, c, OrphansOptions{Output: "json"}, nil, eval, now)
	require.NoError(t, err)
	require.Len(t, r.Orphans, 1)
	assert.Equal(t, "dev-md-0-left", r.Orphans[0].Node)
	assert.Len(t, r.Kept, 6)
	assert.Empty(t, r.Deleted)

	r, err = runLiveWith(ctx, c, OrphansOptions{Output: "json", Delete: true}, nil, eval, now)
	require.NoError(t, err)
	assert.Equal(t, []string{"dev-md-0-left"}, r.Deleted)
	list, err := client.Resource(guard.NodeGVR).List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	assert.Len(t, list.Items, 7, "only the orphan was deleted")
	for _, n := range list.Items {
		assert.NotEqual(t, "dev-md-0-left", n.GetName())
	}
}
