# METADATA
# title: Node deletion guard
# description: |
#   Denies deleting a Node while an InfraMachine linked to it (AWSMachine,
#   DockerMachine, ...) still exists, so a StatefulSet Pod's identity is not
#   freed while its host may still run. Gatekeeper entry point: reads the
#   synced cluster state from data.inventory.
# custom:
#   template: k8snodeguard
#   kind: K8sNodeGuard
#   version: 0.1.3
package k8snodeguard

import data.lib.nodeguard

# METADATA
# title: Violation
# description: One violation per reason the delete is denied, each naming a blocker or an unverified kind.
# entrypoint: true
violation contains {"msg": msg, "details": details} if {
	decision := nodeguard.decide(input.review, data.inventory, object.get(input, "parameters", {}))
	not decision.allowed
	some i, msg in decision.messages
	details := _details(decision, i)
}

# Messages list blockers first, then unverified kinds, in the same order.
_details(decision, i) := {"blocker": decision.blockers[i]} if {
	i < count(decision.blockers)
} else := {"unverified": decision.unverified[i - count(decision.blockers)]} if {
	i - count(decision.blockers) < count(decision.unverified)
} else := {}
