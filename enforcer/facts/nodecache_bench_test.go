package facts_test

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/internal/testnodes"
)

// BenchmarkMemoryPerNode measures the heap a Node cache holds per Node
// (reduced record, store entry, link index entries) for realistic Nodes,
// after a GC, with the full Nodes long gone.
func BenchmarkMemoryPerNode(b *testing.B) {
	s := shape(b)
	const n = 50_000
	for range b.N {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		nodes := facts.NewNodes(s, nil, nil)
		for i := range n {
			r, err := s.Reduce(testnodes.Real(i))
			require.NoError(b, err)
			require.NoError(b, nodes.Add(r))
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/node")
		runtime.KeepAlive(nodes)
	}
}

// BenchmarkRecord measures reducing one realistic Node (the transform each
// watch event pays after decoding).
func BenchmarkRecord(b *testing.B) {
	s := shape(b)
	n := testnodes.Real(1)
	b.ReportAllocs()
	for range b.N {
		if _, err := s.Reduce(n); err != nil {
			b.Fatal(err)
		}
	}
}
