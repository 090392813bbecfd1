# METADATA
# title: Node deletion guard, with facts from nodeguard
# description: |
#   Denies deleting a Node while an InfraMachine linked to it (AWSMachine,
#   DockerMachine, ...) still exists, so a StatefulSet Pod's identity is not
#   freed while its host may still run. Gatekeeper entry point that asks
#   nodeguard serve, as Gatekeeper's external data provider, for the objects
#   linked to the Node, read fresh from the API server (objects being deleted
#   included), instead of Gatekeeper's synced data.inventory; the same library
#   decides. Every failure to get them is a violation (fail closed).
# custom:
#   template: k8snodeguardexternal
#   kind: K8sNodeGuardExternal
#   version: 0.3.2
package k8snodeguardexternal

import data.lib.nodeguard

# METADATA
# title: Violation
# description: |
#   One violation per reason the delete is denied, each naming a blocker, an
#   unverified kind or why nodeguard gave no facts.
# entrypoint: true
violation contains v if {
	some v in nodeguard.violations(nodeguard.decide_with_provider(input.review, _answer, object.get(input, "parameters", {})))
}

# Only a judged Node DELETE asks nodeguard (an audit or another operation
# never does); a review without a Node is decided without facts.
default _answer := {}

_answer := nodeguard.provider_facts(response, key) if {
	nodeguard.judged(input.review)
	key := nodeguard.provider_key(input.review)
	response := external_data({"provider": nodeguard.provider_name, "keys": [key]})
}
