package nodes

import "sync"

// nodeKey names a Node of a cluster.
type nodeKey struct{ cluster, node string }

// perNode is what the reaper or the ghost tracker knows of each Node, by
// cluster, and the clusters it stopped judging: a judgment in flight when its
// cluster went brings back neither its Nodes nor its gauge. mu guards it, and
// whatever its owner keeps in step with it.
type perNode[V any] struct {
	mu    sync.Mutex
	known map[nodeKey]V
	// gone are the clusters forgetCluster dropped, until AddCluster.
	gone map[string]bool
}

func newPerNode[V any]() perNode[V] {
	return perNode[V]{known: map[nodeKey]V{}, gone: map[string]bool{}}
}

// forget drops a Node, returning what was known of it.
func (p *perNode[V]) forget(cluster, node string) (V, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := nodeKey{cluster: cluster, node: node}
	v, had := p.known[k]
	delete(p.known, k)
	return v, had
}

// AddCluster lets a cluster be judged again after ForgetCluster.
func (p *perNode[V]) AddCluster(cluster string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.gone, cluster)
}

// forgetCluster drops every Node of cluster and ignores the cluster until
// AddCluster; the caller holds mu.
func (p *perNode[V]) forgetCluster(cluster string) {
	p.gone[cluster] = true
	for k := range p.known {
		if k.cluster == cluster {
			delete(p.known, k)
		}
	}
}
