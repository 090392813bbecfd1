//go:build e2e

package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeguard/nodeguard/enforcer/denialevents"
	"github.com/nodeguard/nodeguard/enforcer/enforcement"
	"github.com/nodeguard/nodeguard/enforcer/serve"
)

// `serve --enforcement-action warn` on a real API server: `kubectl delete
// node` of a blocked Node succeeds, kubectl prints the denial as a warning,
// and a NodeDeleteWouldBeDenied Event is left on the Node.
func TestEnforcementActionWarnAdmitsWithTheDenialAsAWarning(t *testing.T) {
	cfg, env := apiServerEnv(t)
	nodeguardWith(t, cfg, serve.Options{EnforcementAction: enforcement.Warn})
	kube, dyn := clientsFor(t, cfg)
	ctx := context.Background()
	capdMachine(t, dyn, "md-0-warn", false)
	capdMachine(t, dyn, "md-0-warn-dry", false)
	// Until nodeguard is ready its denial (not-ready) is admitted with a
	// warning too: wait for the rule's.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		out, err := kubectl(t, env, "delete", "node", "md-0-warn-dry", "--dry-run=server")
		require.NoError(c, err, out)
		assert.Contains(c, out, "Warning: nodeguard (enforcement action warn, blocked): this delete would be denied:")
	}, 30*time.Second, 200*time.Millisecond)
	out, err := kubectl(t, env, "delete", "node", "md-0-warn")
	require.NoError(t, err, "warn admits: %s", out)
	assert.Contains(t, out, "DockerMachine default/md-0-warn")
	t.Logf("kubectl delete node md-0-warn under warn:\n%s", out)
	_, err = kube.CoreV1().Nodes().Get(ctx, "md-0-warn", metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "the Node is deleted: %v", err)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		list, err := kube.EventsV1().Events("").List(ctx, metav1.ListOptions{})
		require.NoError(c, err)
		found := false
		for _, e := range list.Items {
			if e.Reason == denialevents.ReasonWouldBeDenied && e.Regarding.Name == "md-0-warn" {
				found = true
				assert.Contains(c, e.Note, "admitted under enforcement action warn, would be denied (blocked)")
			}
		}
		assert.True(c, found, "a NodeDeleteWouldBeDenied Event on the Node")
	}, 15*time.Second, 200*time.Millisecond)
}
