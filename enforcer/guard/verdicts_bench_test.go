package guard_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/internal/testcluster"
)

// BenchmarkScan measures one scan pass over n Nodes, each with its Machine
// and DockerMachine (every Node kept), from the caches: the cost the orphan
// scan in `nodeguard serve` pays every --orphan-scan-interval.
func BenchmarkScan(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			ctx := context.Background()
			var objs, nodes []*unstructured.Unstructured
			for i := 0; i < n; i++ {
				name := fmt.Sprintf("dev-md-0-%05d", i)
				pid := "docker:////" + name
				nodes = append(nodes, &unstructured.Unstructured{Object: map[string]any{
					"apiVersion": "v1", "kind": "Node",
					"metadata": map[string]any{"name": name, "uid": name, "resourceVersion": "1", "annotations": map[string]any{
						"cluster.x-k8s.io/cluster-name": "dev", "cluster.x-k8s.io/cluster-namespace": "default", "cluster.x-k8s.io/machine": name}},
					"spec":   map[string]any{"providerID": pid},
					"status": map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-30T11:00:00Z"}}},
				}})
				objs = append(objs, &unstructured.Unstructured{Object: map[string]any{
					"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
					"metadata": map[string]any{"namespace": "default", "name": name, "labels": map[string]any{"cluster.x-k8s.io/cluster-name": "dev"}},
					"spec": map[string]any{"clusterName": "dev", "providerID": pid,
						"infrastructureRef": map[string]any{"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": name}},
					"status": map[string]any{"nodeRef": map[string]any{"name": name}},
				}}, &unstructured.Unstructured{Object: map[string]any{
					"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "DockerMachine",
					"metadata": map[string]any{"namespace": "default", "name": name, "labels": map[string]any{"cluster.x-k8s.io/cluster-name": "dev"}},
					"spec":     map[string]any{"providerID": pid},
				}})
			}
			inv, err := facts.FromObjects(rule.MustEmbeddedModel(), objs, []schema.GroupKind{{Group: "infrastructure.cluster.x-k8s.io", Kind: "DockerMachine"}}, nil)
			require.NoError(b, err)
			g, err := guard.New(ctx, inv, guard.Options{Engine: testcluster.Engine(b)})
			require.NoError(b, err)
			f, err := guard.NewFinder(guard.FinderOptions{Guard: g, Inventory: inv})
			require.NoError(b, err)
			now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				vs, err := f.Scan(ctx, nodes, "", now)
				if err != nil || len(vs) != n || vs[0].Orphan {
					b.Fatalf("scan: %v, %d verdicts", err, len(vs))
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*n), "µs/node")
		})
	}
}
