//go:build e2e

package apibench

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/internal/constraints"
	"github.com/nodeguard/nodeguard/internal/legacypolicy"
)

var (
	policyRounds   = flag.Int("policy-rounds", 10, "BenchmarkAdmissionPolicyAdded: rounds, each with every design bound in turn")
	policyRequests = flag.Int("policy-requests", 300, "BenchmarkAdmissionPolicyAdded: dry-run deletes per round, design and Node")
)

// BenchmarkAdmissionPolicyAdded is what mode admission-policy's delete
// policy adds to a Node DELETE, today's (the verdict on the Node) beside
// nodeguard 0.3's (a ConfigMap of released Nodes as its params), measured
// against the same API server with no policy bound, the three interleaved:
// -policy-rounds rounds, each binding one design at a time (in rotating
// order), each design measured on the blocked and the released Node
// alternately, request by request. -released-nodes N puts N other Nodes
// carrying a verdict in the cluster and N other released Nodes in 0.3's
// ConfigMap. A drift of the machine over the run then falls on all alike.
func BenchmarkAdmissionPolicyAdded(b *testing.B) {
	if *binDir == "" {
		b.Skip("no kube-apiserver/etcd: run `make bench-apiserver` (it builds them with tests/e2e/tools/build.sh)")
	}
	ctx := context.Background()
	env, cfg := apiServer(b)
	kube, err := kubernetes.NewForConfig(cfg)
	require.NoError(b, err)
	dyn, err := dynamic.NewForConfig(cfg)
	require.NoError(b, err)
	v, err := kube.Discovery().ServerVersion()
	require.NoError(b, err)
	fmt.Printf("admission policy: kube-apiserver %s\n", v.GitVersion)
	populate(b, cfg, 100)
	unbind, freeUID := startAdmissionPolicy(b, env, kube)
	unbind()
	info, err := admission.LoadPolicyInfo()
	require.NoError(b, err)
	policies, err := constraints.AdmissionPolicyManifests(filepath.Join("..", "..", "constraints"))
	require.NoError(b, err)
	released := map[string]string{allowedNode: freeUID}
	for i := range *releasedNodes {
		released[fmt.Sprintf("gone-%06d", i)] = fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
	}
	_, err = kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: admission.LegacyParamsNamespace}}, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		require.NoError(b, err)
	}
	oldPolicy, oldBinding, oldReleased := legacypolicy.Objects(released)
	applyOwned(b, dyn, admission.ParamsGVR, oldReleased)
	applyOwned(b, dyn, admission.PolicyGVR, oldPolicy)
	designs := []string{"none", "configmap", "annotation"}
	bindings := map[string]*admissionregistrationv1.ValidatingAdmissionPolicyBinding{"configmap": oldBinding, "annotation": policies.DeleteBinding}
	names := map[string]string{"configmap": admission.LegacyPolicyName, "annotation": info.Name}
	bind := func(design string) {
		for d, binding := range bindings {
			if d == design {
				applyOwned(b, dyn, admission.BindingGVR, binding)
				continue
			}
			err := dyn.Resource(admission.BindingGVR).Delete(ctx, binding.Name, metav1.DeleteOptions{})
			require.True(b, err == nil || apierrors.IsNotFound(err), "%v", err)
		}
		// Bound when the blocked Node is denied by its policy alone,
		// unbound when it is not.
		agree(ctx, b, "design "+design+" the only one bound", func(ctx context.Context) bool {
			err := kube.CoreV1().Nodes().Delete(ctx, blockedNode, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
			if design == "none" {
				return err == nil
			}
			other := names["configmap"]
			if design == "configmap" {
				other = names["annotation"]
			}
			return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "'"+names[design]+"'") && !strings.Contains(err.Error(), "'"+other+"'")
		})
	}
	type key struct{ design, verdict string }
	lat := map[key][]time.Duration{}
	added := map[string][]time.Duration{} // per round: the design's p50 - bare p50, the released Node
	for round := range *policyRounds {
		p50 := map[string]time.Duration{}
		for j := range designs {
			design := designs[(round+j)%len(designs)]
			bind(design)
			var allowed []time.Duration
			for range *policyRequests {
				for _, verdict := range []string{"blocked", "allowed"} {
					node := map[string]string{"blocked": blockedNode, "allowed": allowedNode}[verdict]
					start := time.Now()
					err := kube.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
					d := time.Since(start)
					if denied := design != "none" && verdict == "blocked"; denied != apierrors.IsForbidden(err) || !denied && err != nil {
						b.Fatalf("dry-run delete of Node %s, design %s: %v", node, design, err)
					}
					lat[key{design, verdict}] = append(lat[key{design, verdict}], d)
					if verdict == "allowed" {
						allowed = append(allowed, d)
					}
				}
			}
			p50[design] = percentile(allowed, 50)
		}
		for _, d := range designs[1:] {
			added[d] = append(added[d], p50[d]-p50["none"])
		}
	}
	b.Run(fmt.Sprintf("released=%d/rounds=%d/requests=%d", *releasedNodes, *policyRounds, *policyRequests), func(b *testing.B) {
		for _, design := range designs[1:] {
			for _, verdict := range []string{"blocked", "allowed"} {
				b.ReportMetric(ms(percentile(lat[key{design, verdict}], 50)-percentile(lat[key{"none", verdict}], 50)), design+"-"+verdict+"-added-p50-ms")
			}
		}
	})
	for _, verdict := range []string{"blocked", "allowed"} {
		bare := lat[key{"none", verdict}]
		fmt.Printf("admission policy, %d other Nodes released, %s Node, %d rounds x %d requests a design: bare p50 %.3f ms p99 %.3f ms", *releasedNodes, verdict,
			*policyRounds, *policyRequests, ms(percentile(bare, 50)), ms(percentile(bare, 99)))
		for _, design := range designs[1:] {
			l := lat[key{design, verdict}]
			fmt.Printf("; %s p50 %.3f ms p99 %.3f ms, added p50 %+.3f ms", design, ms(percentile(l, 50)), ms(percentile(l, 99)), ms(percentile(l, 50)-percentile(bare, 50)))
		}
		fmt.Println()
	}
	for _, design := range designs[1:] {
		a := added[design]
		slices.Sort(a)
		fmt.Printf("admission policy, %s design, released Node: added p50 per round from %+.3f to %+.3f ms, median %+.3f ms\n",
			design, ms(a[0]), ms(a[len(a)-1]), ms(a[len(a)/2]))
	}
}

// BenchmarkGuardPolicyOnStatus is what the guard policy (only nodeguard may
// write its verdicts on a Node) adds to a kubelet's status PATCH, which does
// not touch them and so stops at its match conditions: the same API server
// with the guard bound and unbound, interleaved over -policy-rounds rounds of
// -policy-requests PATCHes each, as system:node:<name> of group system:nodes.
func BenchmarkGuardPolicyOnStatus(b *testing.B) {
	if *binDir == "" {
		b.Skip("no kube-apiserver/etcd: run `make bench-apiserver` (it builds them with tests/e2e/tools/build.sh)")
	}
	ctx := context.Background()
	env, cfg := apiServer(b)
	kube, err := kubernetes.NewForConfig(cfg)
	require.NoError(b, err)
	dyn, err := dynamic.NewForConfig(cfg)
	require.NoError(b, err)
	populate(b, cfg, 10)
	startAdmissionPolicy(b, env, kube)
	info, err := admission.LoadPolicyInfo()
	require.NoError(b, err)
	policies, err := constraints.AdmissionPolicyManifests(filepath.Join("..", "..", "constraints"))
	require.NoError(b, err)
	as := rest.CopyConfig(cfg)
	as.Impersonate = rest.ImpersonationConfig{UserName: "system:node:" + allowedNode, Groups: []string{"system:nodes", "system:masters"}}
	kubelet, err := kubernetes.NewForConfig(as)
	require.NoError(b, err)
	forge := []byte(`{"metadata":{"annotations":{"` + info.Released + `":"forged"}}}`)
	bind := func(on bool) {
		if on {
			applyOwned(b, dyn, admission.BindingGVR, policies.GuardBinding)
		} else {
			err := dyn.Resource(admission.BindingGVR).Delete(ctx, policies.GuardBinding.Name, metav1.DeleteOptions{})
			require.True(b, err == nil || apierrors.IsNotFound(err), "%v", err)
		}
		agree(ctx, b, fmt.Sprintf("the guard bound=%v", on), func(ctx context.Context) bool {
			_, err := kubelet.CoreV1().Nodes().Patch(ctx, allowedNode, types.MergePatchType, forge, metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}, "status")
			return apierrors.IsForbidden(err) == on
		})
	}
	lat := map[bool][]time.Duration{}
	var added []time.Duration
	for round := range *policyRounds {
		p50 := map[bool]time.Duration{}
		for j := range 2 {
			bound := (round+j)%2 == 1
			bind(bound)
			var these []time.Duration
			for i := range *policyRequests {
				// A heartbeat: the Ready condition's time, as a kubelet writes it.
				patch := fmt.Sprintf(`{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","lastHeartbeatTime":"%s"}]}}`,
					time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC).Add(time.Duration(round*10000+j*5000+i)*time.Second).Format(time.RFC3339))
				start := time.Now()
				_, err := kubelet.CoreV1().Nodes().Patch(ctx, allowedNode, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status")
				d := time.Since(start)
				require.NoError(b, err)
				these = append(these, d)
			}
			lat[bound] = append(lat[bound], these...)
			p50[bound] = percentile(these, 50)
		}
		added = append(added, p50[true]-p50[false])
	}
	slices.Sort(added)
	b.Run(fmt.Sprintf("rounds=%d/requests=%d", *policyRounds, *policyRequests), func(b *testing.B) {
		b.ReportMetric(ms(percentile(lat[true], 50)-percentile(lat[false], 50)), "added-p50-ms")
	})
	fmt.Printf("guard policy on a kubelet's status PATCH, %d rounds x %d requests a mode: unbound p50 %.3f ms p99 %.3f ms; bound p50 %.3f ms p99 %.3f ms; added p50 %+.3f ms, per round from %+.3f to %+.3f, median %+.3f\n",
		*policyRounds, *policyRequests, ms(percentile(lat[false], 50)), ms(percentile(lat[false], 99)), ms(percentile(lat[true], 50)), ms(percentile(lat[true], 99)),
		ms(percentile(lat[true], 50)-percentile(lat[false], 50)), ms(added[0]), ms(added[len(added)-1]), ms(added[len(added)/2]))
}

// agree waits until probe holds ten times in a row, every 50 ms: the API
// server's policy cache can answer from the old bindings for a moment
// after one request saw the new ones.
func agree(ctx context.Context, b *testing.B, what string, probe func(context.Context) bool) {
	agreed := 0
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if !probe(ctx) {
			agreed = 0
			return false, nil
		}
		agreed++
		return agreed >= 10, nil
	})
	require.NoError(b, err, "never: %s", what)
}
