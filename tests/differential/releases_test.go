package differential

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// The released Nodes published for mode admission-policy (each Node judged
// only when it or an object that could link to it changes, a release kept
// until a verdict revokes it) must be exactly what the rule releases when
// every Node is judged on the same caches, after every change of a random
// history, in both routes: what the workload API server decides from is
// then the rule's verdict, never a stale one. A wrong allow is a published
// release the full pass does not make.
func TestPublishedReleasesAgreeWithAFullPass(t *testing.T) {
	ctx := context.Background()
	eval, err := rule.NewEngine(ctx)
	require.NoError(t, err)
	shape, err := facts.NodeShapeOf(eval)
	require.NoError(t, err)
	var checks, released, blocked, nodes int
	for i := range *orphanScenarios {
		rng := rand.New(rand.NewPCG(*seed, uint64(i)+1))
		h := newHistory(t, eval, shape, i%2 == 1, rng, true)
		for step := 0; step <= *orphanSteps; step++ {
			if step > 0 {
				h.change()
			}
			h.scanner.RunDue(ctx, h.clock.Now())
			h.releases.Flush(ctx)
			for _, route := range routes {
				want := h.fullRelease(route)
				got := h.published[route]
				require.NotNil(t, got, "history %d: route %q never published", i, route)
				if diff := diffData(want, got); diff != "" {
					t.Fatalf("history %d (seed %d, matchProviderID %v), step %d, route %q: published releases differ from a full pass:\n%s\nchanges:\n%s\nnodes:\n%s",
						i, *seed, h.matchProviderID, step, route, diff, strings.Join(h.log, "\n"), h.dumpNodes())
				}
				for k := range want {
					if strings.HasPrefix(k, admission.BlockerPrefix) {
						blocked++
					} else {
						released++
					}
				}
				nodes += len(h.nodeNames())
				checks++
			}
		}
	}
	fmt.Printf("release differential: %d histories x %d changes, %d checks agree (%d releases, %d blockers published of %d Nodes), seed %d\n",
		*orphanScenarios, *orphanSteps, checks, released, blocked, nodes, *seed)
	// A generator that never releases, never keeps or never names a blocker proves nothing.
	require.Greater(t, released, nodes/10)
	require.Less(t, released, nodes*9/10)
	require.Greater(t, blocked, checks/20)
}

// fullRelease is what publishing every Node's verdict, judged now from the
// same caches, would write.
func (h *history) fullRelease(route string) map[string]string {
	var nodes []*unstructured.Unstructured
	for _, n := range h.nodeNames() {
		r, _ := h.nodes[route].Get(n)
		nodes = append(nodes, r.Unstructured())
	}
	rs, err := h.finder.Releases(context.Background(), nodes, route, false)
	require.NoError(h.t, err)
	vs := make([]admission.ReleaseVerdict, 0, len(rs))
	for i, r := range rs {
		vs = append(vs, admission.ReleaseVerdict{Node: nodes[i].GetName(), UID: string(r.UID), Released: r.Released, Blocker: r.Blocker})
	}
	cm, omitted, err := admission.PolicyParams(vs, admission.MaxParamsBytes)
	require.NoError(h.t, err)
	require.Zero(h.t, omitted)
	return cm.Data
}

// diffData lists the keys on which two ConfigMaps' data differ.
func diffData(want, got map[string]string) string {
	var b strings.Builder
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			fmt.Fprintf(&b, "  %s: full pass %q, published %q (present %v)\n", k, w, g, ok)
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			fmt.Fprintf(&b, "  %s: published %q, not by a full pass\n", k, g)
		}
	}
	return b.String()
}
