// Package bench measures decision latency and cache memory of the enforcer
// next to Gatekeeper's engine on the same data. Run with `make bench`.
package bench

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/internal/gatekeeper"
	"github.com/nodeguard/nodeguard/internal/testcluster"
)

var (
	sizesFlag = flag.String("sizes", "100,1000,10000,50000", "Machine counts (each with as many DockerMachines)")
	dumpInput = flag.String("dump-input", "", "write the Rego input of the benchmarked decision to this file, for opa eval --profile")
)

var (
	machineGVK = schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "Machine"}
	dockerGVK  = schema.GroupVersionKind{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Kind: "DockerMachine"}
	user       = authenticationv1.UserInfo{Username: "kubernetes-admin", Groups: []string{"system:masters"}}
)

func sizes(b *testing.B) []int {
	var out []int
	for _, s := range strings.Split(*sizesFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		require.NoError(b, err)
		out = append(out, n)
	}
	return out
}

// objects returns n realistic CAPD Machines and their DockerMachines, spread
// over 10 namespaces, and the Node of Machine 0.
func objects(n int) (node *unstructured.Unstructured, objs []*unstructured.Unstructured) {
	for i := range n {
		ns := fmt.Sprintf("team-%d", i%10)
		name := fmt.Sprintf("md-0-%06d", i)
		pid := "docker:////" + name
		m := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
			"metadata": map[string]any{
				"namespace": ns, "name": name, "uid": fmt.Sprintf("00000000-0000-0000-0000-%012d", i),
				"resourceVersion": "12345", "generation": int64(1), "creationTimestamp": "2026-11-29T10:00:00Z",
				"labels": map[string]any{"cluster.x-k8s.io/cluster-name": ns, "cluster.x-k8s.io/deployment-name": "md-0",
					"cluster.x-k8s.io/set-name": "md-0-x7k2p"},
				"ownerReferences": []any{map[string]any{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet",
					"name": "md-0-x7k2p", "uid": "0b7cc6a2-5b1e-4a5a-8d0f-43a1b2c3d4e5", "controller": true}},
			},
			"spec": map[string]any{
				"clusterName": ns, "version": "v1.34.1", "providerID": pid,
				"bootstrap":         map[string]any{"configRef": map[string]any{"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfig", "name": name}},
				"infrastructureRef": map[string]any{"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": name},
			},
			"status": map[string]any{"phase": "Running", "nodeRef": map[string]any{"name": name},
				"addresses": []any{map[string]any{"type": "InternalIP", "address": "172.18.0.5"}}},
		}}
		d := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "DockerMachine",
			"metadata": map[string]any{
				"namespace": ns, "name": name, "uid": fmt.Sprintf("10000000-0000-0000-0000-%012d", i),
				"resourceVersion": "12346", "labels": map[string]any{"cluster.x-k8s.io/cluster-name": ns},
				"finalizers": []any{"dockermachine.infrastructure.cluster.x-k8s.io"},
			},
			"spec":   map[string]any{"providerID": pid, "customImage": "kindest/node:v1.34.1", "bootstrapped": true},
			"status": map[string]any{"ready": true},
		}}
		objs = append(objs, m, d)
	}
	name := "md-0-000000"
	node = &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": name, "annotations": map[string]any{
			"cluster.x-k8s.io/cluster-namespace": "team-0", "cluster.x-k8s.io/machine": name}},
		"spec": map[string]any{"providerID": "docker:////" + name},
	}}
	return node, objs
}

// enforcerInventory fills informer-shaped stores through the same transform.
func enforcerInventory(b testing.TB, objs []*unstructured.Unstructured) *facts.Inventory {
	inv := facts.NewInventory(rule.MustEmbeddedModel())
	machines, infras := inv.NewStore(facts.Machine), inv.NewStore(facts.InfraMachine)
	inv.AddKind(machineGVK, facts.Machine, machines)
	inv.AddKind(dockerGVK, facts.InfraMachine, infras)
	for _, o := range objs {
		// The informer decodes a fresh object and transforms it; a deep copy
		// stands for the decoded object, so strings the record shares count.
		store, role := infras, facts.InfraMachine
		if o.GetKind() == "Machine" {
			store, role = machines, facts.Machine
		}
		stripped, err := inv.Transform(role)(o.DeepCopy())
		require.NoError(b, err)
		require.NoError(b, store.Add(stripped))
	}
	return inv
}

func gatekeeperEngine(b *testing.B, objs []*unstructured.Unstructured) *gatekeeper.Engine {
	tmpl, err := os.ReadFile("../../constraints/template.yaml")
	require.NoError(b, err)
	cons, err := os.ReadFile("../../constraints/constraint.yaml")
	require.NoError(b, err)
	engine, err := gatekeeper.NewEngine(context.Background(), tmpl, cons)
	require.NoError(b, err)
	for _, o := range objs {
		require.NoError(b, engine.AddObject(context.Background(), o))
	}
	return engine
}

// loop runs op b.N times and reports the 50th and 99th percentile.
func loop(b *testing.B, op func() bool) {
	durations := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if op() {
			b.Fatal("the delete must be denied: the DockerMachine exists")
		}
		durations = append(durations, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(durations)
	b.ReportMetric(float64(durations[len(durations)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(durations[len(durations)*99/100].Microseconds()), "p99-µs")
}

func BenchmarkDecision(b *testing.B) {
	ctx := context.Background()
	for _, n := range sizes(b) {
		node, objs := objects(n)
		b.Run(fmt.Sprintf("enforcer/machines=%d", n), func(b *testing.B) {
			g, err := guard.New(ctx, enforcerInventory(b, objs), guard.Options{Engine: testcluster.Engine(b)})
			require.NoError(b, err)
			req := guard.Request{Node: node, UserInfo: user}
			loop(b, func() bool {
				d, err := g.Decide(ctx, req)
				require.NoError(b, err)
				return d.Allowed
			})
		})
		b.Run(fmt.Sprintf("gatekeeper/machines=%d", n), func(b *testing.B) {
			engine := gatekeeperEngine(b, objs)
			loop(b, func() bool {
				v, err := engine.ReviewDelete(ctx, node, user)
				require.NoError(b, err)
				return len(v) == 0
			})
		})
	}
}

// TestDumpDecisionInput writes the input the enforcer hands the rule for the
// benchmarked decision, so OPA's profiler can count what the rule evaluates:
// go tool opa eval -d policies/lib/nodeguard -d policies/nodeguard/decision.rego --ignore '*_test.rego'
// -i FILE --profile --format json data.nodeguard.decision
func TestDumpDecisionInput(t *testing.T) {
	if *dumpInput == "" {
		t.Skip("no -dump-input FILE given; this only writes the benchmarked decision's input for opa eval --profile")
	}
	node, objs := objects(100)
	inv := enforcerInventory(t, objs)
	g, err := guard.New(context.Background(), inv, guard.Options{Engine: testcluster.Engine(t)})
	require.NoError(t, err)
	candidates, _ := inv.Candidates(node)
	raw, err := json.MarshalIndent(map[string]any{
		"review":     guard.Request{Node: node, UserInfo: user}.Review(),
		"inventory":  facts.Layout(candidates),
		"parameters": g.Parameters(),
	}, "", "  ")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(*dumpInput, raw, 0o600))
}

// BenchmarkCPUBaseline times a fixed CPU-only loop (no allocation, no I/O)
// with the same percentile harness, to show the tail the machine itself adds:
// a p99 target below this benchmark's p99 cannot be met by any code of the
// same p50 on that machine.
func BenchmarkCPUBaseline(b *testing.B) {
	var sink uint64
	loop(b, func() bool {
		x := uint64(1)
		for range 40_000 {
			x = x*6364136223846793005 + 1442695040888963407
		}
		sink += x
		return false
	})
	runtime.KeepAlive(sink)
}

// BenchmarkCacheMemory reports live heap bytes per cached object (Machines and
// DockerMachines both count), measured after a GC, for each side.
func BenchmarkCacheMemory(b *testing.B) {
	for _, n := range sizes(b) {
		_, objs := objects(n)
		b.Run(fmt.Sprintf("enforcer/machines=%d", n), func(b *testing.B) {
			perObject(b, len(objs), func() any { return enforcerInventory(b, objs) })
		})
		b.Run(fmt.Sprintf("gatekeeper/machines=%d", n), func(b *testing.B) {
			perObject(b, len(objs), func() any { return gatekeeperEngine(b, objs) })
		})
	}
}

// perObject reports the live heap that build's result holds, per object; one
// method for both sides, so a fix to the measurement reaches both.
func perObject(b *testing.B, objects int, build func() any) {
	for range b.N {
		before := heap()
		held := build()
		b.ReportMetric(float64(heap()-before)/float64(objects), "B/object")
		runtime.KeepAlive(held)
	}
}

// heap is the live heap after a full collection, as the runtime's metrics
// report it (objects reachable at the end of the last mark phase).
func heap() int64 {
	runtime.GC()
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(sample)
	return int64(sample[0].Value.Uint64())
}
