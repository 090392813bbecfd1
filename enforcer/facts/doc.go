// Package facts keeps what the rule reads, in step with the API server: the
// inventory of Machines, InfraMachines and pools (records indexed by the link
// model), the informers that fill it, each cluster's Node cache, fresh reads
// past the caches, objects read from files, the tombstones of destroyed
// hosts, and the Constraint whose parameters and action nodeguard follows.
//
// It must not judge: verdicts are the guard's, through the rule. It writes
// to a cluster only the tombstones' own ConfigMap.
package facts
