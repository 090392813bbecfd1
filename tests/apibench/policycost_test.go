//go:build e2e

package apibench

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/internal/constraints"
)

var (
	policyRounds   = flag.Int("policy-rounds", 10, "BenchmarkAdmissionPolicyAdded: rounds, each with the policy bound and unbound")
	policyRequests = flag.Int("policy-requests", 300, "BenchmarkAdmissionPolicyAdded: dry-run deletes per round, mode and Node")
	policyFloor    = flag.Bool("policy-floor", false, "BenchmarkAdmissionPolicyAdded: measure, instead of nodeguard's policy, the least a policy on Node deletes costs: "+
		"no params, no match condition, one expression reading the old Node's name")
)

// BenchmarkAdmissionPolicyAdded is what mode admission-policy's policy adds
// to a Node DELETE, measured against the same API server with the policy
// unbound, the two interleaved: -policy-rounds rounds, each binding and
// unbinding it (in alternating order), each mode measured on the blocked
// and the released Node alternately, request by request. A drift of the
// machine over the run then falls on both modes alike.
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
	populate(b, cfg, 100)
	startAdmissionPolicy(b, env, kube)
	policy, binding, err := constraints.AdmissionPolicyManifests(filepath.Join("..", "..", "constraints"))
	require.NoError(b, err)
	if *policyFloor {
		// The API server's own share: what any policy on Node deletes pays.
		forbidden := metav1.StatusReasonForbidden
		policy.Spec.ParamKind, policy.Spec.MatchConditions, policy.Spec.Variables = nil, nil, nil
		policy.Spec.Validations = []admissionregistrationv1.Validation{{Expression: fmt.Sprintf("oldObject.metadata.name != %q", blockedNode), Reason: &forbidden}}
		binding.Spec.ParamRef = nil
		applyOwned(b, dyn, admission.PolicyGVR, policy)
	}
	bind := func(on bool) {
		if on {
			applyOwned(b, dyn, admission.BindingGVR, binding)
		} else {
			err := dyn.Resource(admission.BindingGVR).Delete(ctx, binding.Name, metav1.DeleteOptions{})
			require.True(b, err == nil || apierrors.IsNotFound(err), "%v", err)
		}
		// Bound when the blocked Node is denied, unbound when it is not, ten
		// answers in a row: the API server's policy cache can answer from the
		// old binding for a moment after one request saw the new one.
		agreed := 0
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			err := kube.CoreV1().Nodes().Delete(ctx, blockedNode, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
			if apierrors.IsForbidden(err) != on {
				agreed = 0
				return false, nil
			}
			agreed++
			return agreed >= 10, nil
		})
		require.NoError(b, err, "the policy never became bound=%v", on)
	}
	type key struct {
		bound   bool
		verdict string
	}
	lat := map[key][]time.Duration{}
	var added []time.Duration // per round: policy p50 - bare p50, the released Node
	for round := range *policyRounds {
		p50 := map[bool]time.Duration{}
		for j := range 2 {
			bound := (round+j)%2 == 1
			bind(bound)
			var released []time.Duration
			for range *policyRequests {
				for _, verdict := range []string{"blocked", "allowed"} {
					node := map[string]string{"blocked": blockedNode, "allowed": allowedNode}[verdict]
					start := time.Now()
					err := kube.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
					d := time.Since(start)
					if denied := bound && verdict == "blocked"; denied != apierrors.IsForbidden(err) || !denied && err != nil {
						b.Fatalf("dry-run delete of Node %s, policy bound %v: %v", node, bound, err)
					}
					lat[key{bound, verdict}] = append(lat[key{bound, verdict}], d)
					if verdict == "allowed" {
						released = append(released, d)
					}
				}
			}
			p50[bound] = percentile(released, 50)
		}
		added = append(added, p50[true]-p50[false])
	}
	slices.Sort(added)
	b.Run(fmt.Sprintf("rounds=%d/requests=%d", *policyRounds, *policyRequests), func(b *testing.B) {
		for _, verdict := range []string{"blocked", "allowed"} {
			b.ReportMetric(ms(percentile(lat[key{false, verdict}], 50)), verdict+"-bare-p50-ms")
			b.ReportMetric(ms(percentile(lat[key{true, verdict}], 50)), verdict+"-policy-p50-ms")
			b.ReportMetric(ms(percentile(lat[key{true, verdict}], 50)-percentile(lat[key{false, verdict}], 50)), verdict+"-added-p50-ms")
		}
	})
	for _, verdict := range []string{"blocked", "allowed"} {
		bare, policy := lat[key{false, verdict}], lat[key{true, verdict}]
		fmt.Printf("admission policy (floor %v), %s Node, %d rounds x %d requests a mode: bare p50 %.3f ms p99 %.3f ms; policy p50 %.3f ms p99 %.3f ms; added p50 %+.3f ms\n",
			*policyFloor, verdict, *policyRounds, *policyRequests, ms(percentile(bare, 50)), ms(percentile(bare, 99)),
			ms(percentile(policy, 50)), ms(percentile(policy, 99)), ms(percentile(policy, 50)-percentile(bare, 50)))
	}
	fmt.Printf("admission policy, released Node: added p50 per round from %+.3f to %+.3f ms, median %+.3f ms\n",
		ms(added[0]), ms(added[len(added)-1]), ms(added[len(added)/2]))
}
