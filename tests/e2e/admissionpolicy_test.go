//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/nodeguard/nodeguard/enforcer/admissionpolicy"
	"github.com/nodeguard/nodeguard/enforcer/owned"
	"github.com/nodeguard/nodeguard/internal/constraints"
)

// put applies obj as nodeguard does (server-side apply, its field manager).
func put(t *testing.T, dyn dynamic.Interface, gvr schema.GroupVersionResource, obj runtime.Object) {
	t.Helper()
	o, err := owned.From(gvr, obj)
	require.NoError(t, err)
	_, err = owned.Apply(context.Background(), dyn, o)
	require.NoError(t, err)
}

// warnings collects the admission warnings of each request.
type warnings struct {
	mu   sync.Mutex
	seen []string
}

func (w *warnings) HandleWarningHeaderWithContext(_ context.Context, _ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = append(w.seen, text)
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.seen
	w.seen = nil
	return out
}

// The generated ValidatingAdmissionPolicy of mode admission-policy, as
// committed in constraints/admission-policy/, on a real kube-apiserver: it
// decides Node deletes from the released Nodes alone, with no webhook.
func TestAdmissionPolicyDecidesFromTheReleasedNodes(t *testing.T) {
	cfg := apiServer(t)
	ctx := context.Background()
	kube, dyn := clientsFor(t, cfg)

	var policy admissionregistrationv1.ValidatingAdmissionPolicy
	var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
	for name, into := range map[string]any{"policy.yaml": &policy, "binding.yaml": &binding} {
		raw, err := os.ReadFile(filepath.Join("..", "..", "constraints", constraints.AdmissionPolicyDir, name))
		require.NoError(t, err)
		require.NoError(t, yaml.Unmarshal(raw, into))
	}
	put(t, dyn, admissionpolicy.PolicyGVR, &policy)
	put(t, dyn, admissionpolicy.BindingGVR, &binding)
	_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: admissionpolicy.ParamsNamespace}}, metav1.CreateOptions{})
	require.NoError(t, err)
	node := func(name string) *corev1.Node {
		n, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		require.NoError(t, err)
		return n
	}
	running, teardown, gone := node("running"), node("teardown"), node("gone")
	publish := func(verdicts ...admissionpolicy.Verdict) {
		cm, omitted, err := admissionpolicy.Params(verdicts, admissionpolicy.MaxParamsBytes)
		require.NoError(t, err)
		require.Zero(t, omitted)
		put(t, dyn, admissionpolicy.ParamsGVR, cm)
	}
	denied := func(t require.TestingT, err error, want string) {
		require.Error(t, err)
		assert.True(t, apierrors.IsForbidden(err), "403 Forbidden, as nodeguard's webhook answers: %v", err)
		assert.Contains(t, err.Error(), want)
	}

	t.Run("without the released Nodes every delete is denied", func(t *testing.T) {
		// The policy takes a moment to load: until it denies, it is not there.
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			err := dryRunDelete(ctx, kube, running.Name)
			require.Error(c, err)
			// The API server's own words and status (422 Invalid: the
			// validation's reason applies only to its expression's denials).
			assert.True(c, apierrors.IsInvalid(err), "%s: %v", apierrors.ReasonForError(err), err)
			assert.Contains(c, err.Error(), "no params found for policy binding")
		}, 30*time.Second, 100*time.Millisecond, "parameterNotFoundAction: Deny")
	})

	publish(admissionpolicy.Verdict{Node: running.Name},
		admissionpolicy.Verdict{Node: teardown.Name, Blocker: "Node \"teardown\" cannot be deleted: DockerMachine default/teardown is being deleted but still exists."},
		admissionpolicy.Verdict{Node: gone.Name, UID: string(gone.UID), Released: true})

	t.Run("a blocked Node is denied, a released one allowed", func(t *testing.T) {
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.NoError(c, dryRunDelete(ctx, kube, gone.Name))
		}, 30*time.Second, 100*time.Millisecond, "the released Nodes are read")
		denied(t, dryRunDelete(ctx, kube, running.Name), "nodeguard has not released it")
		denied(t, dryRunDelete(ctx, kube, teardown.Name), "DockerMachine default/teardown is being deleted but still exists")
		require.NoError(t, kube.CoreV1().Nodes().Delete(ctx, gone.Name, metav1.DeleteOptions{}))
	})

	t.Run("a Node re-created under a released name is not released", func(t *testing.T) {
		again := node(gone.Name)
		require.NotEqual(t, gone.UID, again.UID)
		denied(t, dryRunDelete(ctx, kube, again.Name), "re-created under its name")
	})

	t.Run("exempt users and groups are not judged", func(t *testing.T) {
		p, b, err := admissionpolicy.Build(mustInfo(t), admissionpolicy.Options{ExemptUsers: []string{"alice"}, ExemptGroups: []string{"nodeguard:break-glass"}})
		require.NoError(t, err)
		put(t, dyn, admissionpolicy.PolicyGVR, p)
		put(t, dyn, admissionpolicy.BindingGVR, b)
		as := func(user string, groups ...string) kubernetes.Interface {
			c := rest.CopyConfig(cfg)
			c.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: append(groups, "system:masters")}
			k, err := kubernetes.NewForConfig(c)
			require.NoError(t, err)
			return k
		}
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.NoError(c, dryRunDelete(ctx, as("alice"), running.Name))
			assert.NoError(c, dryRunDelete(ctx, as("bob", "nodeguard:break-glass"), running.Name))
		}, 30*time.Second, 100*time.Millisecond)
		denied(t, dryRunDelete(ctx, as("bob"), running.Name), "nodeguard has not released it")
	})

	t.Run("warn allows with the denial as a warning", func(t *testing.T) {
		p, b, err := admissionpolicy.Build(mustInfo(t), admissionpolicy.Options{Action: admissionpolicy.Warn})
		require.NoError(t, err)
		put(t, dyn, admissionpolicy.PolicyGVR, p)
		put(t, dyn, admissionpolicy.BindingGVR, b)
		seen := &warnings{}
		c := rest.CopyConfig(cfg)
		c.WarningHandlerWithContext = seen
		warned, err := kubernetes.NewForConfig(c)
		require.NoError(t, err)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.NoError(c, dryRunDelete(ctx, warned, running.Name))
		}, 30*time.Second, 100*time.Millisecond)
		assert.Contains(t, strings.Join(seen.take(), "\n"), "nodeguard has not released it")
	})
}

func mustInfo(t *testing.T) admissionpolicy.Info {
	t.Helper()
	info, err := admissionpolicy.LoadInfo()
	require.NoError(t, err, fmt.Sprintf("METADATA of policies/%s", admissionpolicy.Entry))
	return info
}
