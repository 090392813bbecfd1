// Package nodecache keeps the Nodes of one cluster as the orphan criteria
// read them: each Node reduced, by an informer transform, to a record of the
// link model's NodeCacheShape (the link model's Node fields and the
// criteria's own, data.nodeguard.nodes.node_fields, plus its uid and
// resourceVersion for delete preconditions), in a few hundred bytes; and
// indexes (the shape's, in the informer's store) from what a Machine,
// InfraMachine or pool could link by to the Nodes it could link, so a change
// to such an object re-judges only those Nodes.
package facts
