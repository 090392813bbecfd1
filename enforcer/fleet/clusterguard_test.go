package fleet

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A ClusterGuard reads back as the State it was written from, for every
// reason, and its conditions say which step held.
func TestClusterGuardHoldsTheState(t *testing.T) {
	proof := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	since := proof.Add(-time.Hour)
	owner := metav1.OwnerReference{APIVersion: "cluster.x-k8s.io/v1beta2", Kind: "Cluster", Name: "dev", UID: "u-1"}
	states := []State{{Cluster: "ns/dev", Mode: ModeWebhook, Guarded: true, Wired: true, CACurrent: true, Action: "deny",
		Identity: "system:serviceaccount:kube-system:nodeguard", LastProof: proof, Since: since}}
	for _, r := range Reasons() {
		states = append(states, State{Cluster: "ns/dev", Mode: ModeWebhook, Reason: r, Message: "because " + r, Since: since})
	}
	for _, st := range states {
		obj, conds := clusterGuard(st, "ns", "dev", owner, 1, nil)
		assert.Equal(t, st, stateOf(obj), "reason %q", st.Reason)
		assert.Equal(t, "u-1", string(obj.GetOwnerReferences()[0].UID))
		byType := map[string]metav1.Condition{}
		for _, c := range conds {
			byType[c.Type] = c
		}
		require.Len(t, byType, 3, "Guarded, Reachable and Proven")
		guarded, reachable, proven := byType[ConditionGuarded], byType[ConditionReachable], byType[ConditionProven]
		assert.Equal(t, st.Guarded, guarded.Status == metav1.ConditionTrue)
		switch st.Reason {
		case "":
			assert.Equal(t, metav1.ConditionTrue, reachable.Status)
			assert.Equal(t, metav1.ConditionTrue, proven.Status)
		case ReasonNoKubeconfig, ReasonUnreachable:
			assert.Equal(t, metav1.ConditionFalse, reachable.Status, st.Reason)
			assert.Equal(t, metav1.ConditionUnknown, proven.Status, st.Reason)
		case ReasonReviewNotReceived, ReasonNotInstalled, ReasonStaleCABundle, ReasonNoNodes, ReasonModeUnsupported:
			assert.Equal(t, metav1.ConditionTrue, reachable.Status, st.Reason)
			assert.Equal(t, metav1.ConditionFalse, proven.Status, st.Reason)
		case ReasonDryRun:
			assert.Equal(t, metav1.ConditionTrue, proven.Status, "judged, not denied")
		default:
			assert.True(t, Excluded(st.Reason), st.Reason)
			assert.Equal(t, metav1.ConditionUnknown, reachable.Status, st.Reason)
		}
	}
}

// A condition keeps the time it last changed status; one that changes
// takes the State's.
func TestClusterGuardKeepsTransitionTimes(t *testing.T) {
	first, later := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC), time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	owner := metav1.OwnerReference{Kind: "Cluster", Name: "dev", UID: "u-1"}
	_, before := clusterGuard(State{Cluster: "ns/dev", Reason: ReasonReviewNotReceived, Since: first}, "ns", "dev", owner, 1, nil)
	_, after := clusterGuard(State{Cluster: "ns/dev", Guarded: true, Since: later}, "ns", "dev", owner, 1, before)
	for _, c := range after {
		want := later
		if c.Type == ConditionReachable {
			want = first // reachable throughout
		}
		assert.Equal(t, want, c.LastTransitionTime.UTC(), c.Type)
	}
}

func TestCamelReason(t *testing.T) {
	assert.Equal(t, "NoKubeconfig", CamelReason(ReasonNoKubeconfig))
	assert.Equal(t, "StaleCaBundle", CamelReason(ReasonStaleCABundle))
	for _, r := range Reasons() {
		assert.Equal(t, r, reasonOf(CamelReason(r)))
	}
}
