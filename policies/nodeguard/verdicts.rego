# The enforcer's entry points besides the decision (decision.rego): the verdicts it
# reaches about each Node of a cluster (orphan, screen, release, ghost,
# registration), each taking everything from input.
package nodeguard

import data.nodeguard.ghosts
import data.nodeguard.orphans
import data.nodeguard.released

# METADATA
# title: Orphan verdict
# description: |
#   The verdict of nodeguard.orphans for input.node, taking everything from
#   input so one prepared query (data.nodeguard.orphan) judges every Node:
#   input.node, input.inventory (Gatekeeper's layout), input.parameters,
#   input.now (RFC 3339), input.grace (a Go duration, default 5m),
#   input.matchProviderID (default false) and input.tombstone (the
#   enforcer's tombstone of the Node's providerID, or none: a ghost is never
#   an orphan).
# entrypoint: true
orphan := orphans.verdict(
	input.node,
	object.get(input, "inventory", {}),
	object.get(input, "parameters", {}),
	input.now,
	object.get(input, "grace", orphans.default_grace),
	object.get(input, "matchProviderID", false) == true,
	object.get(input, "tombstone", null),
)

# METADATA
# title: Orphan screen
# description: |
#   The criteria that read only input.node (with input.parameters, input.now,
#   input.grace and input.matchProviderID, as for orphan): passes, whether
#   none of them keeps the Node (orphans.node_passes), and recheckAt, when
#   that may change with the clock alone (orphans.recheck_at). The enforcer
#   evaluates orphan only for Nodes that pass.
# entrypoint: true
orphan_screen := {
	"passes": orphans.node_passes(input.node, params, input.now, grace, match),
	"recheckAt": orphans.recheck_at(input.node, params, input.now, grace, match),
} if {
	params := object.get(input, "parameters", {})
	grace := object.get(input, "grace", orphans.default_grace)
	match := object.get(input, "matchProviderID", false) == true
}

# METADATA
# title: Release verdict
# description: |
#   The verdict of nodeguard.released for input.node (with input.inventory and
#   input.parameters, as for orphan): released, whether the rule lets anyone
#   delete it, and blocker, the text published for a Node in teardown. The
#   enforcer publishes it into workload clusters in mode admission-policy.
# entrypoint: true
release := released.verdict(input.node, object.get(input, "inventory", {}), object.get(input, "parameters", {}))

# METADATA
# title: Ghost verdict
# description: |
#   The verdict of nodeguard.ghosts for input.node (with input.inventory and
#   input.parameters, as for orphan), input.tombstone (the enforcer's
#   tombstone of the Node's providerID, or none) and input.now (RFC 3339).
# entrypoint: true
ghost := ghosts.verdict(
	input.node,
	object.get(input, "inventory", {}),
	object.get(input, "parameters", {}),
	object.get(input, "tombstone", null),
	input.now,
)

# METADATA
# title: Registration verdict
# description: |
#   The verdict of nodeguard.ghosts.registration for a Node CREATE or UPDATE:
#   input.operation, input.node (the object), input.oldNode (before an
#   UPDATE), input.inventory, input.parameters, input.tombstone and input.now,
#   as for ghost. The enforcer's registration route answers with it.
# entrypoint: true
registration := ghosts.registration(
	input.operation,
	input.node,
	object.get(input, "oldNode", null),
	object.get(input, "inventory", {}),
	object.get(input, "parameters", {}),
	object.get(input, "tombstone", null),
	input.now,
)
