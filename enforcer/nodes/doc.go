// Package nodes acts on Nodes from the guard's verdicts: the scanner that
// judges a cluster's Nodes again when a fact changes, the reaper that deletes
// orphans, the tracker of ghost Nodes, and the publisher of released Nodes
// for mode admission-policy.
//
// It must not decide: every act follows a verdict of the guard's.
package nodes
