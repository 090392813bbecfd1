package serve_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/nodeguard/nodeguard/enforcer/serve"
)

// The switch asks the management API server, at each delete, whether
// nodeguard may delete Nodes: what the reaper's ClusterRoleBinding grants.
func TestSwitchPermitsAsksTheManagementClusterEachTime(t *testing.T) {
	kube := fake.NewClientset()
	allowed, asked := true, 0
	kube.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		asked++
		r := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview)
		assert.Equal(t, authorizationv1.ResourceAttributes{Verb: "delete", Resource: "nodes"}, *r.Spec.ResourceAttributes)
		r.Status.Allowed = allowed
		return true, r, nil
	})
	permits := serve.SwitchPermits(kube)
	require.NoError(t, permits(context.Background()))
	allowed = false
	err := permits(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "nodeguard-orphan-reaper is gone")
	assert.Equal(t, 2, asked)
}
