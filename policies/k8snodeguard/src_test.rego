# METADATA
# title: Tests of the Gatekeeper entry point
# description: violation reads data.inventory and input.parameters as Gatekeeper provides them.
package k8snodeguard_test

import data.k8snodeguard
import data.lib.nodeguard_test as fixtures

gk_input(review, parameters) := {"review": review, "parameters": parameters}

test_one_violation_per_blocker if {
	pool := json.patch(fixtures.capd_pool, [{"op": "add", "path": "/spec/providerIDList/-", "value": "docker:////dev-md-0-abcde"}])
	violations := k8snodeguard.violation with input as gk_input(fixtures.delete_review(fixtures.capd_node), {})
		with data.inventory as fixtures.inventory([fixtures.capd_machine, fixtures.capd_infra, pool])
	count(violations) == 2
	kinds := {v.details.blocker.kind | some v in violations}
	kinds == {"DockerMachine", "DockerMachinePool"}
	some v in violations
	contains(v.msg, `Node "dev-md-0-abcde" cannot be deleted`)
}

test_unverified_kind_is_a_violation_with_details if {
	machine := fixtures.capd_machine
	violations := k8snodeguard.violation with input as gk_input(fixtures.delete_review(fixtures.capd_node), {"infraMachineKinds": []})
		with data.inventory as fixtures.inventory([machine])
	count(violations) == 1
	some v in violations
	v.details.unverified.kind == "DockerMachine"
}

test_missing_old_object_is_a_violation if {
	review := json.remove(fixtures.delete_review(fixtures.capd_node), ["oldObject"])
	violations := k8snodeguard.violation with input as gk_input(review, {}) with data.inventory as {}
	count(violations) == 1
	some v in violations
	v.details == {}
}

test_no_violation_once_infra_is_gone if {
	violations := k8snodeguard.violation with input as gk_input(fixtures.delete_review(fixtures.capd_node), {})
		with data.inventory as fixtures.inventory([fixtures.capd_machine])
	count(violations) == 0
}

test_audit_yields_no_violation if {
	review := {"kind": {"group": "", "version": "v1", "kind": "Node"}, "object": fixtures.capd_node}
	violations := k8snodeguard.violation with input as gk_input(review, {})
		with data.inventory as fixtures.inventory([fixtures.capd_machine, fixtures.capd_infra])
	count(violations) == 0
}

test_exempt_user_yields_no_violation if {
	violations := k8snodeguard.violation with input as gk_input(fixtures.delete_review(fixtures.capd_node), {"exemptUsers": ["alice"]})
		with data.inventory as fixtures.inventory([fixtures.capd_machine, fixtures.capd_infra])
	count(violations) == 0
}

test_constraint_without_parameters_uses_defaults if {
	violations := k8snodeguard.violation with input as {"review": fixtures.delete_review(fixtures.capd_node)}
		with data.inventory as fixtures.inventory([fixtures.capd_machine, fixtures.capd_infra])
	count(violations) == 1
}
