//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/cli"
	"github.com/nodeguard/nodeguard/enforcer/fleet"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/serve"
	"github.com/nodeguard/nodeguard/internal/localcluster"
	"github.com/nodeguard/nodeguard/internal/testpki"
)

var clustersGVR = schema.GroupVersionResource{Group: "cluster.x-k8s.io", Version: "v1beta2", Resource: "clusters"}

// fleetProof is the proof period of these tests: short, so "within one
// proof period" is seconds.
const fleetProof = 3 * time.Second

// A management and two workload kube-apiservers, each its own process and
// CA, Clusters and kubeconfig Secrets as CAPI writes them, and `nodeguard
// serve --fleet`: nothing is installed by hand.
func TestFleetGuardsEveryWorkloadCluster(t *testing.T) {
	mgmt, mgmtEnv := apiServerEnv(t)
	// The workload API servers authenticate to nodeguard's exposed port
	// with client certificates, as the fleet path documents.
	w1, w1Env, clientCA := authenticatingAPIServer(t)
	w2, w2Env := apiServerWith(t, current, func(env *envtest.Environment) {
		certPEM, keyPEM := clientCA.Issue(t, 2, x509.ExtKeyUsageClientAuth)
		require.NoError(t, localcluster.AuthenticateToWebhooks(env, t.TempDir(), certPEM, keyPEM))
	})
	mgmtKube, dyn := clientsFor(t, mgmt)
	kube1, _ := clientsFor(t, w1)
	kube2, _ := clientsFor(t, w2)
	ctx := context.Background()

	// The workload API servers reach nodeguard through a relay the test can
	// cut: the network path between the clusters.
	ca := testpki.New(t)
	certFile, keyFile := ca.ServerFiles(t, "nodeguard")
	servingCA := ca.CAFile(t)
	// The CA Secret's certificate, which a cert-manager CA rotation changes
	// before the serving certificate is re-issued.
	nextCA := filepath.Join(t.TempDir(), "ca-secret-tls.crt")
	copyFile(t, servingCA, nextCA)
	listen := "127.0.0.1:" + strconv.Itoa(freePort(t))
	path := startRelay(t, listen)
	clients, err := kube.FromConfig(mgmt)
	require.NoError(t, err)
	stop := serveFleet(t, clients, ca, serve.Options{Listen: listen, CertFile: certFile, KeyFile: keyFile, ClusterRoutesClientCAFile: clientCA.CAFile(t),
		Fleet: serve.FleetOptions{URL: "https://" + path.addr, CAFiles: []string{servingCA, nextCA}, CARetention: 3 * time.Second}})

	// Cluster dev's Machine lives in the management cluster, its Node in w1.
	workloadMachine(t, dyn, mgmtKube, kube1, "md-0-a")
	// Unlinked Nodes, whose dry-run deletes are allowed.
	for _, k := range []kubernetes.Interface{kube1, kube2} {
		_, err := k.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "free"}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	for _, name := range []string{"dev", "two"} {
		apply(t, dyn, clustersGVR, map[string]any{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
			"metadata": map[string]any{"namespace": "default", "name": name}, "spec": map[string]any{"paused": true}})
	}
	secretsAt := time.Now()
	workloadAdmin(t, ctx, w1Env, mgmtKube, "default", "dev")
	workloadAdmin(t, ctx, w2Env, mgmtKube, "default", "two")

	states := func(c require.TestingT) map[string]fleet.State {
		list, err := fleet.List(ctx, clients)
		require.NoError(c, err)
		out := map[string]fleet.State{}
		for _, s := range list {
			out[s.Cluster] = s
		}
		return out
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		s := states(c)
		assert.True(c, s["default/dev"].Guarded, "dev: %+v", s["default/dev"])
		assert.True(c, s["default/two"].Guarded, "two: %+v", s["default/two"])
	}, 60*time.Second, 200*time.Millisecond, "both clusters guarded and proven")
	t.Logf("both workload clusters guarded and proven %s after their kubeconfig Secrets appeared (as nodeguard clusters reads it)",
		time.Since(secretsAt).Round(100*time.Millisecond))
	s := states(t)
	for _, key := range []string{"default/dev", "default/two"} {
		assert.True(t, s[key].Wired && s[key].CACurrent, "%s: %+v", key, s[key])
		assert.WithinDuration(t, time.Now(), s[key].LastProof, time.Minute)
	}
	// The verdict is told on each Cluster, by the recorder that writes every
	// Event nodeguard makes.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		list, err := mgmtKube.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
		require.NoError(c, err)
		guarded := map[string]bool{}
		for _, e := range list.Items {
			if e.Reason == serve.EventGuarded && e.Regarding.Kind == "Cluster" && e.Type == corev1.EventTypeNormal && e.ReportingController == "nodeguard" {
				guarded[e.Regarding.Name] = e.Regarding.UID != ""
			}
		}
		assert.Equal(c, map[string]bool{"dev": true, "two": true}, guarded, "a WorkloadClusterGuarded Event on each Cluster, with its UID")
	}, 10*time.Second, 100*time.Millisecond)

	denied := func(c require.TestingT, kube kubernetes.Interface, node, want string) {
		err := kube.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		require.Error(c, err)
		assert.Contains(c, err.Error(), want)
	}
	t.Run("a linked Node's delete is denied in its workload cluster", func(t *testing.T) {
		denied(t, kube1, "md-0-a", "DockerMachine default/md-0-a")
	})

	t.Run("nodeguard works there as its own ServiceAccount, which may only dry-run deletes", func(t *testing.T) {
		for _, key := range []string{"default/dev", "default/two"} {
			assert.Equal(t, kube.Username, states(t)[key].Identity, key)
		}
		ttl := int64(600)
		tok, err := kube1.CoreV1().ServiceAccounts(kube.Namespace).CreateToken(ctx, kube.Name,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &ttl}}, metav1.CreateOptions{})
		require.NoError(t, err)
		cfg := rest.AnonymousClientConfig(w1)
		cfg.BearerToken = tok.Status.Token
		self, err := kubernetes.NewForConfig(cfg)
		require.NoError(t, err)
		_, err = self.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
		assert.True(t, apierrors.IsForbidden(err), "it reads no Secrets: %v", err)
		assert.NoError(t, self.CoreV1().Nodes().Delete(ctx, "free", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}), "a dry run is allowed")
		err = self.CoreV1().Nodes().Delete(ctx, "free", metav1.DeleteOptions{})
		require.Error(t, err, "a real delete is not: the reaper is off")
		assert.Contains(t, err.Error(), "nodeguard's own identity deletes workload Nodes only when its orphan reaper works there")

		// Its ClusterRoleBinding deleted: the next proof is refused, and
		// the identity is installed again with the kubeconfig.
		rbac := kube1.RbacV1().ClusterRoleBindings()
		require.NoError(t, rbac.Delete(ctx, kube.Name, metav1.DeleteOptions{}))
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			_, err := rbac.Get(ctx, kube.Name, metav1.GetOptions{})
			assert.NoError(c, err)
		}, 4*fleetProof, 100*time.Millisecond, "installed again within a proof period or two")
		require.EventuallyWithT(t, func(c *assert.CollectT) { assert.True(c, states(c)["default/dev"].Guarded) },
			4*fleetProof, 100*time.Millisecond)
	})

	t.Run("a deleted configuration is restored and the delete still denied", func(t *testing.T) {
		require.NoError(t, kube1.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, admission.Name, metav1.DeleteOptions{}))
		deleted := time.Now()
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			_, err := kube1.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, admission.Name, metav1.GetOptions{})
			assert.NoError(c, err)
		}, 10*time.Second, 50*time.Millisecond, "restored within 10 s")
		t.Logf("deleted configuration restored after %s", time.Since(deleted).Round(10*time.Millisecond))
		require.EventuallyWithT(t, func(c *assert.CollectT) { denied(c, kube1, "md-0-a", "DockerMachine default/md-0-a") },
			10*time.Second, 100*time.Millisecond)
	})

	t.Run("another manager's edits are taken back", func(t *testing.T) {
		api := kube2.AdmissionregistrationV1().ValidatingWebhookConfigurations()
		vwc, err := api.Get(ctx, admission.Name, metav1.GetOptions{})
		require.NoError(t, err)
		want := vwc.Webhooks[0].ClientConfig.CABundle
		// A foreign CA, and an objectSelector that would let every Node pass.
		vwc.Webhooks[0].ClientConfig.CABundle = mustRead(t, testpki.New(t).CAFile(t))
		vwc.Webhooks[0].ObjectSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"never": "matches"}}
		_, err = api.Update(ctx, vwc, metav1.UpdateOptions{FieldManager: "someone-else"})
		require.NoError(t, err)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			got, err := api.Get(ctx, admission.Name, metav1.GetOptions{})
			require.NoError(c, err)
			assert.Equal(c, want, got.Webhooks[0].ClientConfig.CABundle)
			assert.Empty(c, got.Webhooks[0].ObjectSelector.MatchLabels)
		}, 10*time.Second, 50*time.Millisecond, "the configuration is nodeguard's again")
	})

	t.Run("a misrouted review is denied", func(t *testing.T) {
		// A Node of Cluster dev (its CAPI annotations say so) in two's API
		// server: two's route must not judge it against two's Machines.
		_, err := kube2.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "md-0-a",
			Annotations: map[string]string{"cluster.x-k8s.io/cluster-name": "dev", "cluster.x-k8s.io/cluster-namespace": "default", "cluster.x-k8s.io/machine": "md-0-a"}}},
			metav1.CreateOptions{})
		require.NoError(t, err)
		denied(t, kube2, "md-0-a", "Cluster default/dev")
	})

	t.Run("the CA rotates under a stream of deletes with no wrong denial", func(t *testing.T) {
		next := testpki.New(t)
		// Two streams, back to back, one a workload cluster.
		streams := []*deleteStream{streamDeletes(ctx, kube1, "free", 0), streamDeletes(ctx, kube2, "free", 0)}
		allowed := func() int64 {
			n := int64(0)
			for _, s := range streams {
				n += s.tries.Load() - s.denials.Load()
			}
			return n
		}
		oldPEM, nextPEM := mustRead(t, servingCA), mustRead(t, next.CAFile(t))
		bundleHas := func(c *assert.CollectT, k kubernetes.Interface, caPEM []byte, want bool) {
			vwc, err := k.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, admission.Name, metav1.GetOptions{})
			require.NoError(c, err)
			assert.Equal(c, want, bytes.Contains(vwc.Webhooks[0].ClientConfig.CABundle, caPEM), "bundle trusts the CA")
		}
		// 1. cert-manager renews the CA: its Secret changes first.
		copyFile(t, next.CAFile(t), nextCA)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			bundleHas(c, kube1, nextPEM, true)
			bundleHas(c, kube2, nextPEM, true)
			bundleHas(c, kube1, oldPEM, true)
		}, 20*time.Second, 100*time.Millisecond, "both CAs trusted everywhere")
		// 2. The serving certificate is re-issued by the new CA, and the
		// serving Secret's ca.crt with it.
		cert, key := next.Issue(t, 99, x509.ExtKeyUsageServerAuth)
		require.NoError(t, os.WriteFile(keyFile, key, 0o600))
		require.NoError(t, os.WriteFile(certFile, cert, 0o600))
		copyFile(t, next.CAFile(t), servingCA)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			bundleHas(c, kube1, oldPEM, false)
			bundleHas(c, kube2, oldPEM, false)
			bundleHas(c, kube1, nextPEM, true)
		}, 20*time.Second, 100*time.Millisecond, "the old CA is dropped once nothing it signed is served (and its retention passed)")
		// The new certificate is served (certwatcher reloads it).
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			serial, err := servedSerial(listen)
			require.NoError(c, err)
			assert.Equal(c, int64(99), serial)
		}, 20*time.Second, 100*time.Millisecond)
		// The stream goes on against the new certificate alone for a while.
		onNew := allowed()
		require.EventuallyWithT(t, func(c *assert.CollectT) { assert.Greater(c, allowed(), onNew+50) }, 30*time.Second, 50*time.Millisecond)
		for i, s := range streams {
			tries, wrong, first := s.finish(t, 0)
			assert.Zero(t, wrong, "workload cluster %d: wrongly denied dry-run deletes during the rotation (first: %s)", i+1, first)
			t.Logf("CA rotation, workload cluster %d: %d dry-run deletes, %d wrongly denied", i+1, tries, wrong)
		}
	})

	t.Run("a cut network path is reported within one proof period", func(t *testing.T) {
		path.cut(true)
		cut := time.Now()
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			s := states(c)
			assert.Equal(c, fleet.ReasonReviewNotReceived, s["default/dev"].Reason)
			assert.Equal(c, fleet.ReasonReviewNotReceived, s["default/two"].Reason)
		}, fleetProof+30*time.Second, 200*time.Millisecond)
		t.Logf("cut path reported after %s (proof period %s)", time.Since(cut).Round(100*time.Millisecond), fleetProof)
		path.cut(false)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			s := states(c)
			assert.True(c, s["default/dev"].Guarded)
			assert.True(c, s["default/two"].Guarded)
		}, 60*time.Second, 200*time.Millisecond, "guarded again once the path is back")
	})

	t.Run("an unreachable workload API server is reported", func(t *testing.T) {
		apply(t, dyn, clustersGVR, map[string]any{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
			"metadata": map[string]any{"namespace": "default", "name": "gone"}, "spec": map[string]any{"paused": true}})
		// Two's kubeconfig, pointed at a port nothing listens on.
		kubeconfig := pointedAt(t, mustSecret(t, mgmtKube, "two-kubeconfig"), "https://127.0.0.1:"+strconv.Itoa(freePort(t)))
		_, err := mgmtKube.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "gone-kubeconfig"},
			Data: map[string][]byte{"value": kubeconfig}}, metav1.CreateOptions{})
		require.NoError(t, err)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.Equal(c, fleet.ReasonUnreachable, states(c)["default/gone"].Reason)
		}, 60*time.Second, 200*time.Millisecond)
	})

	t.Run("a rotated kubeconfig Secret is followed", func(t *testing.T) {
		good := mustSecret(t, mgmtKube, "two-kubeconfig")
		setKubeconfig := func(value []byte) {
			s, err := mgmtKube.CoreV1().Secrets("default").Get(ctx, "two-kubeconfig", metav1.GetOptions{})
			require.NoError(t, err)
			s.Data["value"] = value
			_, err = mgmtKube.CoreV1().Secrets("default").Update(ctx, s, metav1.UpdateOptions{})
			require.NoError(t, err)
		}
		setKubeconfig(pointedAt(t, good, "https://127.0.0.1:"+strconv.Itoa(freePort(t))))
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.Equal(c, fleet.ReasonUnreachable, states(c)["default/two"].Reason)
		}, 30*time.Second, 200*time.Millisecond, "the new kubeconfig is used")
		setKubeconfig(good)
		require.EventuallyWithT(t, func(c *assert.CollectT) { assert.True(c, states(c)["default/two"].Guarded) },
			30*time.Second, 200*time.Millisecond, "and the good one again")
	})

	t.Run("a Cluster that opts out loses its configuration", func(t *testing.T) {
		patch := `{"metadata":{"annotations":{"` + fleet.OptOutAnnotation + `":"true"}}}`
		_, err := dyn.Resource(clustersGVR).Namespace("default").Patch(ctx, "two", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		require.NoError(t, err)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			_, err := kube2.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, admission.Name, metav1.GetOptions{})
			assert.True(c, apierrors.IsNotFound(err), "removed: %v", err)
			assert.Equal(c, fleet.ReasonOptedOut, states(c)["default/two"].Reason)
		}, 30*time.Second, 200*time.Millisecond)
		require.NoError(t, dryRunDelete(ctx, kube2, "md-0-a"), "nodeguard no longer judges cluster two")
		// Cluster dev is untouched.
		denied(t, kube1, "md-0-a", "DockerMachine default/md-0-a")
	})

	t.Run("kubectl get clusterguards shows the fleet at a glance, with its conditions", func(t *testing.T) {
		// dev guarded, two opted out, gone unreachable.
		var table string
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			out, err := kubectl(t, mgmtEnv, "get", "clusterguards", "-A")
			require.NoError(c, err, out)
			rows := map[string][]string{}
			for _, line := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
				f := strings.Fields(line)
				rows[f[1]] = f
			}
			// NAMESPACE NAME MODE GUARDED REASON ACTION LAST PROOF AGE
			assert.Equal(c, []string{"default", "dev", "webhook", "True", "Guarded", "deny"}, head(rows["dev"], 6), out)
			assert.Equal(c, []string{"default", "two", "webhook", "False", "OptedOut"}, head(rows["two"], 5), out)
			assert.Equal(c, []string{"default", "gone", "webhook", "False", "Unreachable"}, head(rows["gone"], 5), out)
			table = out
		}, 30*time.Second, 200*time.Millisecond)
		t.Logf("kubectl get clusterguards -A:\n%s", table)
		want := map[string]map[string]string{
			"dev":  {fleet.ConditionGuarded: "True", fleet.ConditionReachable: "True", fleet.ConditionProven: "True"},
			"two":  {fleet.ConditionGuarded: "False", fleet.ConditionReachable: "Unknown", fleet.ConditionProven: "Unknown"},
			"gone": {fleet.ConditionGuarded: "False", fleet.ConditionReachable: "False", fleet.ConditionProven: "Unknown"},
		}
		for name, conds := range want {
			cg, err := dyn.Resource(fleet.ClusterGuards).Namespace("default").Get(ctx, name, metav1.GetOptions{})
			require.NoError(t, err)
			cluster, err := dyn.Resource(clustersGVR).Namespace("default").Get(ctx, name, metav1.GetOptions{})
			require.NoError(t, err)
			require.Len(t, cg.GetOwnerReferences(), 1, name)
			assert.Equal(t, cluster.GetUID(), cg.GetOwnerReferences()[0].UID, "%s is owned by its Cluster", name)
			list, _, _ := unstructured.NestedSlice(cg.Object, "status", "conditions")
			got := map[string]string{}
			for _, c := range list {
				m := c.(map[string]any)
				got[m["type"].(string)] = m["status"].(string)
				assert.NotEmpty(t, m["reason"], "%s %s", name, m["type"])
				assert.EqualValues(t, cg.GetGeneration(), m["observedGeneration"], "%s %s", name, m["type"])
			}
			assert.Equal(t, conds, got, name)
		}
	})

	t.Run("a Cluster renamed by delete and create takes the configuration over", func(t *testing.T) {
		require.NoError(t, dyn.Resource(clustersGVR).Namespace("default").Delete(ctx, "dev", metav1.DeleteOptions{}))
		apply(t, dyn, clustersGVR, map[string]any{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
			"metadata": map[string]any{"namespace": "default", "name": "dev2"}, "spec": map[string]any{"paused": true}})
		_, err := mgmtKube.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "dev2-kubeconfig"},
			Data: map[string][]byte{"value": mustSecret(t, mgmtKube, "dev-kubeconfig")}}, metav1.CreateOptions{})
		require.NoError(t, err)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			s := states(c)
			assert.True(c, s["default/dev2"].Guarded, "%+v", s["default/dev2"])
			assert.NotContains(c, s, "default/dev", "the deleted Cluster is forgotten")
			_, err := dyn.Resource(fleet.ClusterGuards).Namespace("default").Get(ctx, "dev", metav1.GetOptions{})
			assert.True(c, apierrors.IsNotFound(err), "the deleted Cluster's ClusterGuard goes with it: %v", err)
			vwc, err := kube1.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, admission.Name, metav1.GetOptions{})
			require.NoError(c, err)
			assert.Equal(c, "default/dev2", vwc.Annotations[admission.ClusterAnnotation])
		}, 30*time.Second, 200*time.Millisecond)
		// The Node's annotations still name Cluster dev: misrouted on dev2's route.
		denied(t, kube1, "md-0-a", "the route of Cluster default/dev2")
	})

	t.Run("cleanup removes what nodeguard wrote there, and nothing another manager keeps", func(t *testing.T) {
		stop() // the chart's hook scales nodeguard to 0 first: the fleet would restore what it removes
		// Cluster two opted out: a configuration of the same name that Helm keeps there stays.
		_, err := kube2.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: admission.Name, Labels: map[string]string{kube.ManagedByLabel: "Helm"}}}, metav1.CreateOptions{})
		require.NoError(t, err)
		// Cluster gone's API server does not answer: what it may still hold
		// is reported, and the uninstall stops there.
		var out bytes.Buffer
		kc := adminKubeconfig(t, mgmtEnv)
		code, err := cli.Cleanup(ctx, cli.CleanupOptions{Kubeconfig: kc, Namespace: "default"}, &out)
		require.NoError(t, err)
		assert.Equal(t, 1, code, out.String())
		assert.Contains(t, out.String(), "not everything could be removed:\nCluster default/gone: get validatingwebhookconfigurations nodeguard:")
		t.Logf("nodeguard cleanup --namespace default, Cluster default/gone unreachable:\n%s", out.String())
		require.NoError(t, dyn.Resource(clustersGVR).Namespace("default").Delete(ctx, "gone", metav1.DeleteOptions{}))
		out.Reset()
		code, err = cli.Cleanup(ctx, cli.CleanupOptions{Kubeconfig: kc, Namespace: "default"}, &out)
		require.NoError(t, err)
		assert.Equal(t, 0, code, out.String())
		t.Logf("again, Cluster default/gone deleted:\n%s", out.String())
		_, err = kube1.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, admission.Name, metav1.GetOptions{})
		assert.True(t, apierrors.IsNotFound(err), "the fleet's configuration is gone: %v", err)
		_, err = kube1.RbacV1().ClusterRoles().Get(ctx, kube.Name, metav1.GetOptions{})
		assert.True(t, apierrors.IsNotFound(err), "and nodeguard's identity there: %v", err)
		_, err = kube2.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, admission.Name, metav1.GetOptions{})
		assert.NoError(t, err, "Helm's stays")
		require.NoError(t, dryRunDelete(ctx, kube1, "md-0-a"), "no configuration left to deny it")
	})
}

// serveFleet runs `nodeguard serve --fleet` (serveWith) over the
// management cluster of clients, on a free port with a certificate of ca
// unless opts name a port and serving files, its status in namespace
// default, proofs every fleetProof and kubeconfig Secrets read again every
// 2 s (a rotation shows at once).
func serveFleet(t *testing.T, clients kube.Clients, ca *testpki.CA, opts serve.Options) (stop func()) {
	t.Helper()
	t.Setenv("POD_NAMESPACE", "default")
	if opts.Listen == "" {
		opts.Listen = "127.0.0.1:" + strconv.Itoa(freePort(t))
		opts.Fleet.URL, opts.Fleet.CAFiles = "https://"+opts.Listen, []string{ca.CAFile(t)}
	}
	opts.Fleet.Enabled = true
	if opts.Fleet.ProofInterval == 0 {
		opts.Fleet.ProofInterval = fleetProof
	}
	opts.Orphans.KubeconfigRecheck = 2 * time.Second
	_, stop = serveWith(t, clients, ca, opts)
	return stop
}

// servedSerial is the serial of the certificate served at addr.
func servedSerial(addr string) (int64, error) {
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // reads which certificate is served
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64(), nil
}

// relay forwards TCP from addr to nodeguard's port; cut refuses new
// connections and drops open ones: the network path between the clusters.
type relay struct {
	addr string
	mu   sync.Mutex
	down bool
	open map[net.Conn]bool
}

func startRelay(t *testing.T, target string) *relay {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	r := &relay{addr: l.Addr().String(), open: map[net.Conn]bool{}}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			down := r.down
			if !down {
				r.open[in] = true
			}
			r.mu.Unlock()
			if down {
				_ = in.Close()
				continue
			}
			go r.pipe(in, target)
		}
	}()
	return r
}

func (r *relay) pipe(in net.Conn, target string) {
	defer func() {
		r.mu.Lock()
		delete(r.open, in)
		r.mu.Unlock()
		_ = in.Close()
	}()
	out, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer out.Close()
	go func() { _, _ = io.Copy(out, in); _ = out.Close() }()
	_, _ = io.Copy(in, out)
}

func (r *relay) cut(down bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.down = down
	if down {
		for c := range r.open {
			_ = c.Close()
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	require.NoError(t, os.WriteFile(to, mustRead(t, from), 0o600))
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

// pointedAt is kubeconfig with every cluster's server set to server.
func pointedAt(t *testing.T, kubeconfig []byte, server string) []byte {
	t.Helper()
	kc, err := clientcmd.Load(kubeconfig)
	require.NoError(t, err)
	for _, c := range kc.Clusters {
		c.Server = server
	}
	out, err := clientcmd.Write(*kc)
	require.NoError(t, err)
	return out
}

func mustSecret(t *testing.T, kube kubernetes.Interface, name string) []byte {
	t.Helper()
	s, err := kube.CoreV1().Secrets("default").Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	return s.Data["value"]
}

// head is the first n fields of a table row (all of them when fewer).
func head(fields []string, n int) []string { return fields[:min(n, len(fields))] }
