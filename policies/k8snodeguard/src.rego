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
#   version: 1.1.2
package k8snodeguard

import data.lib.nodeguard

# METADATA
# title: Violation
# description: One violation per reason the delete is denied, each naming a blocker or an unverified kind.
# entrypoint: true
violation contains v if {
	some v in nodeguard.violations(nodeguard.decide(input.review, data.inventory, object.get(input, "parameters", {})))
}
