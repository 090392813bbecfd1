# METADATA
# title: Tests of the released Nodes
# description: A Node is released exactly when the rule lets anyone delete it; a blocker is published only in teardown.
package nodeguard.released_test

import data.lib.nodeguard_test as fixtures
import data.nodeguard.released

verdict(objs) := released.verdict(fixtures.capd_node, fixtures.inventory(objs), {})

test_running_node_is_not_released_and_publishes_nothing if {
	v := verdict([fixtures.capd_machine, fixtures.capd_infra])
	not v.released
	v.blocker == ""
}

test_node_in_teardown_names_its_blocker if {
	v := verdict([fixtures.deleting(fixtures.capd_machine), fixtures.deleting(fixtures.capd_infra)])
	not v.released
	contains(v.blocker, "DockerMachine")
	contains(v.blocker, fixtures.capd_infra.metadata.name)
}

test_node_is_released_once_its_infra_machine_is_gone if {
	v := verdict([fixtures.deleting(fixtures.capd_machine)])
	v.released
	v.blocker == ""
}

test_unlinked_node_is_released if {
	v := verdict([])
	v.released
}

# An exemption says who may delete, not that the host is gone: it releases nothing.
test_exemptions_release_nothing if {
	params := {"exemptUsers": [""], "exemptGroups": ["system:masters"]}
	v := released.verdict(fixtures.capd_node, fixtures.inventory([fixtures.capd_machine, fixtures.capd_infra]), params)
	not v.released
}
