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
	contains(v.reason, "DockerMachine default/dev-md-0-abcde, deleted at 2026-12-03T11:50:00Z")
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
	v.kept == ["it was not created after the tombstone and has not turned Ready since"]
}

test_a_node_without_conditions_or_creation_time_is_no_ghost if {
	v := verdict(fixtures.capd_node, [], tombstone)
	not v.ghost
}

test_a_node_ready_since_before_the_tombstone_is_no_ghost if {
	# The Node whose deletion was under way, its host torn down but not yet
	# marked NotReady (the node lifecycle controller takes ~40 s): no ghost.
	node := object.union(fixtures.capd_node, {
		"metadata": {"creationTimestamp": "2026-12-01T00:00:00Z"},
		"status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-03T11:00:00Z"}]},
	})
	v := verdict(fixtures.without_annotations(node), [], tombstone)
	not v.ghost
	v.kept == ["it was not created after the tombstone and has not turned Ready since"]
}

test_a_node_ready_again_after_the_tombstone_is_a_ghost if {
	# Created long ago, NotReady while its host was "destroyed", Ready again since 11:55.
	node := object.union(reregistered, {"metadata": {"creationTimestamp": "2026-12-01T00:00:00Z"}})
	verdict(fixtures.without_annotations(node), [], tombstone).ghost
}

test_a_node_created_in_the_second_of_the_tombstone_is_no_ghost if {
	# Its Machine deleted within the second the Node was created (and turned
	# Ready): no re-registration.
	node := object.union(fixtures.capd_node, {
		"metadata": {"creationTimestamp": "2026-12-03T11:50:00Z"},
		"status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-03T11:50:00Z"}]},
	})
	v := verdict(fixtures.without_annotations(node), [], object.union(tombstone, {"deletedAt": "2026-12-03T11:50:00.700Z"}))
	not v.ghost
	v.kept == ["it was not created after the tombstone and has not turned Ready since"]
	later := json.patch(node, [{"op": "replace", "path": "/metadata/creationTimestamp", "value": "2026-12-03T11:50:01Z"}])
	verdict(fixtures.without_annotations(later), [], tombstone).ghost
}

test_an_unreadable_time_proves_nothing_alive if {
	node := object.union(fixtures.capd_node, {"metadata": {"creationTimestamp": "a minute ago"}})
	not verdict(node, [], tombstone).ghost
	ready_at := object.union(fixtures.capd_node, {"status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "just now"}]}})
	not verdict(ready_at, [], tombstone).ghost
}

# --- The shortcut the orphan criteria ask -------------------------------------------------

test_ghost_agrees_with_the_verdict if {
	cases := [
		[reregistered, [], tombstone],
		[reregistered, [], null],
		[reregistered, [fixtures.capd_machine], tombstone],
		[fixtures.without_annotations(reregistered), [fixtures.capd_infra], tombstone],
		[not_ready(fixtures.capd_node, "2026-12-01T00:00:00Z"), [], tombstone],
		[not_ready(fixtures.capd_node, "2026-12-03T11:51:00Z"), [], tombstone],
		[reregistered, [], object.union(tombstone, {"until": "2026-12-03T11:59:59Z"})],
	]
	every c in cases {
		ghosts.ghost(c[0], fixtures.inventory(c[1]), {}, c[2], now) == verdict(c[0], c[1], c[2]).ghost
	}
}

# --- Registrations ------------------------------------------------------------------------

# The kubelet's Node as it registers: no conditions yet, no CAPI annotations.
registering := fixtures.without_annotations(fixtures.capd_node)

registration(op, node, old, objs, stone) := ghosts.registration(op, node, old, fixtures.inventory(objs), {}, stone, now)

test_a_ghost_registration_is_denied if {
	r := registration("CREATE", registering, null, [], tombstone)
	not r.allowed
	r.registers
	contains(r.message, `Node "dev-md-0-abcde" may not register: providerID "docker:////dev-md-0-abcde" was carried by DockerMachine default/dev-md-0-abcde`)
	contains(r.message, "nodeguard ghosts --clear docker:////dev-md-0-abcde")
}

test_an_update_setting_a_tombstoned_provider_id_is_denied if {
	# An external cloud-controller-manager sets spec.providerID after the kubelet registered.
	old := json.remove(registering, ["spec/providerID"])
	r := registration("UPDATE", registering, old, [], tombstone)
	not r.allowed
	r.registers
}

test_other_updates_register_nothing if {
	r := registration("UPDATE", registering, registering, [], tombstone)
	r.allowed
	not r.registers
	r.message == ""
	registration("DELETE", registering, null, [], tombstone).allowed
}

test_a_registration_without_tombstone_or_with_a_link_is_allowed if {
	registration("CREATE", registering, null, [], null).allowed
	registration("CREATE", json.remove(registering, ["spec/providerID"]), null, [], tombstone).allowed

	# A new Machine whose InfraMachine carries the providerID again: a legitimate reuse.
	registration("CREATE", registering, null, [fixtures.capd_infra], tombstone).allowed
	registration("CREATE", registering, null, [], object.union(tombstone, {"until": "2026-12-03T11:59:59Z"})).allowed
}

test_the_registration_entry_point_takes_everything_from_input if {
	r := data.nodeguard.registration with input as {"operation": "CREATE", "node": registering, "tombstone": tombstone, "now": now}
	not r.allowed
	s := data.nodeguard.registration with input as {"operation": "UPDATE", "node": registering, "oldNode": registering, "tombstone": tombstone, "now": now}
	s.allowed
}

# --- The enforcer's entry point ----------------------------------------------------------

test_the_entry_point_takes_everything_from_input if {
	v := data.nodeguard.ghost with input as {"node": reregistered, "tombstone": tombstone, "now": now}
	v.ghost
	none := data.nodeguard.ghost with input as {"node": reregistered, "now": now}
	not none.ghost
}
