# METADATA
# title: Tests of the ghost criteria
# description: Each criterion, its negation, and the legitimate reuses of a providerID, on the CAPD fixtures.
package nodeguard.ghosts_test

import data.lib.nodeguard_test as fixtures
import data.nodeguard.ghosts

now := "2026-12-03T12:00:00Z"

# The Machine and its DockerMachine went at 11:50, in CAPI's order.
tombstone := {
	"providerID": "docker:////dev-md-0-abcde",
	"object": "DockerMachine default/dev-md-0-abcde",
	"node": "dev-md-0-abcde",
	"deletedAt": "2026-12-03T11:50:00Z",
	"until": "2026-12-04T11:50:00Z",
}

ready(node) := object.union(node, {"status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-03T11:55:00Z"}]}})

not_ready(node, created) := object.union(node, {
	"metadata": {"creationTimestamp": created},
	"status": {"conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": created}]},
})

# The kubelet re-registered the Node a minute after CAPI deleted it.
reregistered := ready(fixtures.capd_node)

verdict(node, objs, stone) := ghosts.verdict(node, fixtures.inventory(objs), {}, stone, now)

# --- All criteria hold --------------------------------------------------------------

test_a_node_alive_with_a_tombstoned_provider_id_and_no_link_is_a_ghost if {
	v := verdict(reregistered, [], tombstone)
	v.ghost
	v.kept == []
	v.providerID == "docker:////dev-md-0-abcde"
	v.tombstone == tombstone
	contains(v.reason, "DockerMachine default/dev-md-0-abcde, gone since 2026-12-03T11:50:00Z")
	contains(v.reason, "its host was not destroyed")
}

test_a_registration_not_yet_ready_is_a_ghost if {
	v := verdict(not_ready(fixtures.capd_node, "2026-12-03T11:51:00Z"), [], tombstone)
	v.ghost
}

test_a_new_name_with_the_old_provider_id_is_a_ghost if {
	# Only the providerID counts: the kubelet may register under another name.
	node := json.patch(reregistered, [{"op": "replace", "path": "/metadata/name", "value": "ip-10-0-1-17"}])
	v := verdict(fixtures.without_annotations(node), [], tombstone)
	v.ghost
	v.node == "ip-10-0-1-17"
}

# --- 1. Its providerID was tombstoned --------------------------------------------------

test_no_tombstone_is_no_ghost if {
	v := verdict(reregistered, [], null)
	not v.ghost
	v.kept == ["no tombstone holds its providerID"]
	v.reason == ""
}

test_no_provider_id_is_no_ghost if {
	v := verdict(json.remove(reregistered, ["spec/providerID"]), [], tombstone)
	not v.ghost
	"it has no spec.providerID" in v.kept
}

test_the_same_name_with_another_provider_id_is_no_ghost if {
	# A new instance reusing the name (IP-based names): the name is evidence only.
	node := json.patch(reregistered, [{"op": "replace", "path": "/spec/providerID", "value": "docker:////dev-md-0-fghij"}])
	v := verdict(node, [], tombstone)
	not v.ghost
	v.kept == [`the tombstone is of providerID "docker:////dev-md-0-abcde", not the Node's`]
}

test_an_ended_tombstone_is_no_ghost if {
	v := verdict(reregistered, [], object.union(tombstone, {"until": "2026-12-03T11:59:59Z"}))
	not v.ghost
	v.kept == ["the tombstone of DockerMachine default/dev-md-0-abcde ended at 2026-12-03T11:59:59Z"]
}

test_an_unreadable_window_keeps_the_node if {
	v := verdict(reregistered, [], object.union(tombstone, {"until": "tomorrow"}))
	not v.ghost
}

# --- 2. Nothing links it ---------------------------------------------------------------

test_a_machine_linking_it_again_is_a_legitimate_reuse if {
	v := verdict(reregistered, [fixtures.capd_machine], tombstone)
	not v.ghost
	"Machine default/dev-md-0-abcde links it" in v.kept
}

test_an_infra_machine_carrying_it_again_is_a_legitimate_reuse if {
	v := verdict(fixtures.without_annotations(reregistered), [fixtures.capd_infra], tombstone)
	not v.ghost
	v.kept == ["the rule would not allow deleting it (blocked): something links it"]
}

test_a_pool_listing_it_again_is_a_legitimate_reuse if {
	node := json.patch(fixtures.pool_node, [{"op": "add", "path": "/status", "value": {"conditions": [{"type": "Ready", "status": "True"}]}}])
	v := verdict(node, [fixtures.capd_pool], object.union(tombstone, {"providerID": node.spec.providerID}))
	not v.ghost
	contains(concat(" ", v.kept), "something links it")
}

# --- 3. It is alive --------------------------------------------------------------------

test_a_node_left_behind_not_ready_since_before_the_tombstone_is_no_ghost if {
	# The Node CAPI failed to delete, its host gone: an orphan, not a ghost.
	v := verdict(not_ready(fixtures.capd_node, "2026-12-01T00:00:00Z"), [], tombstone)
	not v.ghost
	v.kept == ["it is not Ready and was not created after the tombstone"]
}

test_a_node_without_conditions_or_creation_time_is_no_ghost if {
	v := verdict(fixtures.capd_node, [], tombstone)
	not v.ghost
}

# --- The enforcer's entry point ----------------------------------------------------------

test_the_entry_point_takes_everything_from_input if {
	v := data.nodeguard.ghost with input as {"node": reregistered, "tombstone": tombstone, "now": now}
	v.ghost
	none := data.nodeguard.ghost with input as {"node": reregistered, "now": now}
	not none.ghost
}
