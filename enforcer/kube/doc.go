// Package kube reaches and writes clusters: the clients of one API server,
// the writer of the objects nodeguard owns (server-side apply), nodeguard's
// identity in each workload cluster, the one access layer to workload
// clusters (ClusterSet: connection, health, Events), the single-object
// watch, the work loop and leader election.
//
// It must not know the rule: what to write and when is its callers'.
package kube
