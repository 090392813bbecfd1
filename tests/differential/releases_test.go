package differential

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// The verdicts written on the Nodes for mode admission-policy (each Node
// judged only when it or an object that could link to it changes, written
// only where it differs from what the Node carries) must come to be exactly
// what the rule gives when every Node is judged on the same caches, after
// every change of a random history, in both routes: what the workload API
// server decides from is then the rule's verdict, never a stale one. A wrong
// allow is a release on a Node the full pass does not release.
func TestVerdictsOnTheNodesAgreeWithAFullPass(t *testing.T) {
	ctx := context.Background()
	eval, err := rule.NewEngine(ctx)
	require.NoError(t, err)
	info, err := admission.LoadPolicyInfo()
	require.NoError(t, err)
	shape, err := facts.NodeShapeOf(eval, info.VerdictPaths()...)
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
			for _, route := range routes {
				want := h.fullRelease(route)
				var diff string
				// The writes are the publisher's workers': they settle.
				deadline := time.Now().Add(5 * time.Second)
				for diff = diffVerdicts(want, h.carries(route)); diff != "" && time.Now().Before(deadline); diff = diffVerdicts(want, h.carries(route)) {
					time.Sleep(time.Millisecond)
				}
				if diff != "" {
					t.Fatalf("history %d (seed %d, matchProviderID %v), step %d, route %q: the verdicts on the Nodes differ from a full pass:\n%s\nchanges:\n%s\nnodes:\n%s",
						i, *seed, h.matchProviderID, step, route, diff, strings.Join(h.log, "\n"), h.dumpNodes())
				}
				for _, v := range want {
					if v.UID != "" {
						released++
					} else {
						blocked++
					}
				}
				nodes += len(h.nodeNames())
				checks++
			}
			// The Node caches see what was written, as their watches would.
			for _, n := range h.nodeNames() {
				r, _ := h.nodes[routes[0]].Get(n)
				h.putNodeObject(r.Unstructured())
			}
		}
	}
	fmt.Printf("release differential: %d histories x %d changes, %d checks agree (%d releases, %d blockers on %d Nodes), seed %d\n",
		*orphanScenarios, *orphanSteps, checks, released, blocked, nodes, *seed)
	// A generator that never releases, never keeps or never names a blocker proves nothing.
	require.Greater(t, released, nodes/10)
	require.Less(t, released, nodes*9/10)
	require.Greater(t, blocked, checks/20)
}

// fullRelease is the verdict on each Node judged now from the same caches
// (Nodes that carry nothing left out).
func (h *history) fullRelease(route string) map[string]admission.ReleaseVerdict {
	var nodes []*unstructured.Unstructured
	for _, n := range h.nodeNames() {
		r, _ := h.nodes[route].Get(n)
		nodes = append(nodes, r.Unstructured())
	}
	rs, err := h.finder.Releases(context.Background(), nodes, route, false)
	require.NoError(h.t, err)
	out := map[string]admission.ReleaseVerdict{}
	for i, r := range rs {
		if v := admission.Verdict(string(r.UID), r.Released, r.Blocker); v != (admission.ReleaseVerdict{}) {
			out[nodes[i].GetName()] = v
		}
	}
	return out
}

// carries is what the route's Nodes carry (Nodes that carry nothing left
// out).
func (h *history) carries(route string) map[string]admission.ReleaseVerdict {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string]admission.ReleaseVerdict{}
	for n, v := range h.written[route] {
		if v != (admission.ReleaseVerdict{}) {
			out[n] = v
		}
	}
	return out
}

// putNodeObject stores node again in every route's cache, carrying what
// was written on it.
func (h *history) putNodeObject(node *unstructured.Unstructured) {
	for route, c := range h.nodes {
		r, err := h.shape.Reduce(h.carrying(route, node))
		require.NoError(h.t, err)
		require.NoError(h.t, c.Add(r))
	}
}

// diffVerdicts lists the Nodes on which two sets of verdicts differ.
func diffVerdicts(want, got map[string]admission.ReleaseVerdict) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if g, ok := got[k]; !ok || g != want[k] {
			fmt.Fprintf(&b, "  %s: full pass %+v, on the Node %+v\n", k, want[k], g)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[k]; !ok {
			fmt.Fprintf(&b, "  %s: on the Node %+v, not by a full pass\n", k, got[k])
		}
	}
	return b.String()
}
