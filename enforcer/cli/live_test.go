package cli

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/internal/testcluster"
)

func TestLiveCheckAgainstAnAPIServer(t *testing.T) {
	ctx := context.Background()
	client, mapper := testcluster.CAPD(t, "../../examples/capd-v1beta2")
	opts := CheckOptions{Node: "dev-md-0-x7k2p-abcde", Output: "text"}

	c := kube.Clients{Dynamic: client, Mapper: mapper}
	nodes := func(context.Context) (dynamic.ResourceInterface, error) { return client.Resource(nodeGVR), nil }
	d, err := judgeWith(ctx, c, nodes, opts, nil, testcluster.Engine(t))
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	require.Len(t, d.Blockers, 1)
	assert.Equal(t, "DockerMachine", d.Blockers[0].Kind)

	// CAPI deletes the DockerMachine: the Node may go.
	gvr := schema.GroupVersionResource{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Resource: "dockermachines"}
	require.NoError(t, client.Resource(gvr).Namespace("default").Delete(ctx, "dev-md-0-x7k2p-abcde", metav1.DeleteOptions{}))
	d, err = judgeWith(ctx, c, nodes, opts, nil, testcluster.Engine(t))
	require.NoError(t, err)
	assert.True(t, d.Allowed, "%v", d.Messages)

	_, err = judgeWith(ctx, c, nodes, CheckOptions{Node: "missing"}, nil, testcluster.Engine(t))
	assert.ErrorContains(t, err, `get node "missing"`)
}

func TestLiveCheckWithABadKubeconfig(t *testing.T) {
	_, err := judgeLive(context.Background(), CheckOptions{Node: "n", Kubeconfig: "/nonexistent/kubeconfig"}, nil, nil)
	assert.ErrorContains(t, err, "load kubeconfig")
}
