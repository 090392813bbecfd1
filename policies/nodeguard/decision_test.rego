# METADATA
# title: Tests of the enforcer entry point
# description: decision takes review, inventory and parameters from input.
package nodeguard_test

import data.lib.nodeguard_test as fixtures
import data.nodeguard

test_decision_denies_with_blockers if {
	d := nodeguard.decision with input as {
		"review": fixtures.delete_review(fixtures.capa_node),
		"inventory": fixtures.inventory([fixtures.capa_machine, fixtures.capa_infra]),
		"parameters": {},
	}
	d.allowed == false
	d.reason == "blocked"
	d.blockers[0].kind == "AWSMachine"
	d.blockers[0].version == "v1beta2"
	count(d.messages) == 1
	d.warnings == []
}

test_decision_allows_without_inventory if {
	d := nodeguard.decision with input as {"review": fixtures.delete_review(fixtures.capa_node)}
	d.allowed == true
	d.reason == "no-link"
	d.blockers == []
}

test_decision_warns_for_exempt_group if {
	d := nodeguard.decision with input as {
		"review": fixtures.delete_review(fixtures.capa_node),
		"inventory": fixtures.inventory([fixtures.capa_machine, fixtures.capa_infra]),
		"parameters": {"exemptGroups": ["system:authenticated"]},
	}
	d.allowed == true
	d.reason == "exempt"
	count(d.warnings) == 1
}

test_decision_says_when_the_rule_does_not_judge if {
	update := object.union(fixtures.delete_review(fixtures.capa_node), {"operation": "UPDATE"})
	d := nodeguard.decision with input as {"review": update}
	d.allowed == true
	d.reason == "not-judged"
}

test_decision_judges_a_node_delete_without_old_object if {
	review := object.remove(fixtures.delete_review(fixtures.capa_node), {"oldObject", "object"})
	d := nodeguard.decision with input as {"review": review}
	d.allowed == false
	d.reason == "unjudgeable"
	contains(d.messages[0], "carries no oldObject")
}

test_release_entry_point_reads_everything_from_input if {
	r := nodeguard.release with input as {
		"node": fixtures.capd_node,
		"inventory": fixtures.inventory([fixtures.capd_machine, fixtures.capd_infra]),
	}
	not r.released
	released := nodeguard.release with input as {"node": fixtures.capd_node}
	released.released
}
