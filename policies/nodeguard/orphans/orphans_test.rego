# METADATA
# title: Tests of the orphan criteria
# description: Each criterion, and its negation, on the CAPD and CAPA fixtures of the rule's tests.
package nodeguard.orphans_test

import data.lib.nodeguard_test as fixtures
import data.nodeguard.orphans

now := "2026-11-30T12:00:00Z"

# Ten minutes before now: past the default grace of 5m.
long_ago := "2026-11-30T11:50:00Z"

not_ready(node, since) := object.union(node, {"status": {"conditions": [
	{"type": "MemoryPressure", "status": "Unknown", "lastTransitionTime": "2026-11-01T00:00:00Z"},
	{"type": "Ready", "status": "Unknown", "lastTransitionTime": since},
]}})

left_behind := not_ready(fixtures.capd_node, long_ago)

# Every case holds a DockerMachine of another host (sibling, below): the
# cluster's synced InfraMachines use docker:// providerIDs, so the absence of
# one carrying the Node's proves something.
verdict(node, objs) := orphans.verdict(node, fixtures.inventory(array.concat(objs, [sibling])), {}, now, "5m", false, null)

evidence := fixtures.inventory([sibling])

# --- All criteria hold ----------------------------------------------------------

test_left_behind_node_is_an_orphan if {
	v := verdict(left_behind, [])
	v.orphan
	v.managed
	v.kept == []
	v.cluster == "default/dev"
	v.machine == "default/dev-md-0-abcde"
	v.notReadySince == long_ago
	contains(v.reason, "Machine default/dev-md-0-abcde is gone")
}

test_other_machines_and_infra_do_not_keep_it if {
	other_machine := json.patch(fixtures.capa_machine, [{"op": "replace", "path": "/metadata/namespace", "value": "default"}])
	v := verdict(left_behind, [other_machine, fixtures.capa_infra])
	v.orphan
}

# --- 1. Managed by Cluster API -------------------------------------------------------

test_node_without_capi_annotations_is_kept if {
	v := verdict(fixtures.without_annotations(left_behind), [])
	not v.orphan
	not v.managed
	v.cluster == ""
	v.machine == ""
	v.reason == ""
	contains(v.kept[0], "not managed by Cluster API")
}

test_node_with_machine_annotation_only_is_kept if {
	node := json.remove(left_behind, ["metadata/annotations/cluster.x-k8s.io~1cluster-namespace"])
	not verdict(node, []).orphan
}

test_node_of_another_cluster_is_kept_when_scoped if {
	v := orphans.verdict(left_behind, evidence, {"clusterName": "other", "clusterNamespace": "default"}, now, "5m", false, null)
	not v.orphan
	v.kept[0] == "it belongs to Cluster default/dev, not to the Cluster judged"
	not orphans.verdict(left_behind, evidence, {"clusterNamespace": "elsewhere"}, now, "5m", false, null).orphan
	orphans.verdict(left_behind, evidence, {"clusterName": "dev", "clusterNamespace": "default"}, now, "5m", false, null).orphan
}

# --- 2. Its Machine is gone ----------------------------------------------------------

test_named_machine_exists_keeps_it if {
	machine := json.remove(fixtures.capd_machine, ["status", "spec/providerID"])
	v := verdict(left_behind, [machine])
	not v.orphan
	v.kept == ["Machine default/dev-md-0-abcde exists (linked by nodeAnnotation)"]
}

test_named_machine_being_deleted_keeps_it if {
	v := verdict(left_behind, [fixtures.deleting(fixtures.capd_machine)])
	not v.orphan
	v.kept == ["Machine default/dev-md-0-abcde is being deleted but still exists (linked by machineNodeRef, machineProviderID, nodeAnnotation)"]
}

test_replacement_machine_by_node_ref_keeps_it if {
	machine := json.patch(fixtures.capd_machine, [
		{"op": "replace", "path": "/metadata/name", "value": "dev-md-0-new"},
		{"op": "remove", "path": "/spec/providerID"},
	])
	v := verdict(left_behind, [machine])
	not v.orphan
	v.kept == ["Machine default/dev-md-0-new exists (linked by machineNodeRef)"]
}

test_machine_by_provider_id_keeps_it if {
	machine := json.patch(fixtures.capd_machine, [
		{"op": "replace", "path": "/metadata/name", "value": "dev-md-0-new"},
		{"op": "remove", "path": "/status"},
	])
	v := verdict(left_behind, [machine])
	not v.orphan
	v.kept == ["Machine default/dev-md-0-new exists (linked by machineProviderID)"]
}

test_machine_of_another_cluster_does_not_keep_it_when_scoped if {
	machine := json.patch(fixtures.capd_machine, [
		{"op": "replace", "path": "/spec/clusterName", "value": "other"},
		{"op": "replace", "path": "/metadata/labels/cluster.x-k8s.io~1cluster-name", "value": "other"},
	])
	orphans.verdict(left_behind, fixtures.inventory([machine, sibling]), {"clusterName": "dev"}, now, "5m", false, null).orphan
	not orphans.verdict(left_behind, fixtures.inventory([machine, sibling]), {}, now, "5m", false, null).orphan
}

# --- 3. The rule allows deleting it ----------------------------------------------------

test_linked_infra_machine_keeps_it if {
	v := verdict(left_behind, [fixtures.capd_infra])
	not v.orphan
	v.kept == ["DockerMachine default/dev-md-0-abcde still exists"]
}

test_linked_infra_machine_being_deleted_keeps_it if {
	v := verdict(left_behind, [fixtures.deleting(fixtures.capd_infra)])
	not v.orphan
	v.kept == ["DockerMachine default/dev-md-0-abcde is being deleted but still exists"]
}

test_pool_listing_the_node_keeps_it if {
	node := not_ready(fixtures.pool_node, long_ago)
	node_named := json.patch(node, [
		{"op": "add", "path": "/metadata/annotations/cluster.x-k8s.io~1machine", "value": "gone"},
	])
	v := verdict(node_named, [fixtures.capd_pool])
	not v.orphan
	v.kept == ["DockerMachinePool default/dev-mp-0 still exists"]
}

test_unverified_kind_keeps_it if {
	machine := json.patch(fixtures.capd_machine, [{"op": "replace", "path": "/spec/infrastructureRef/kind", "value": "UnknownMachine"}])
	v := verdict(left_behind, [machine])
	not v.orphan
	v.kept[1] == `UnknownMachine default/dev-md-0-abcde of group "infrastructure.cluster.x-k8s.io" is not synced, so its absence proves nothing`
}

test_exemptions_do_not_make_an_orphan if {
	params := {"exemptGroups": ["system:authenticated"], "exemptUsers": [""]}
	not orphans.verdict(left_behind, fixtures.inventory([fixtures.capd_infra]), params, now, "5m", false, null).orphan
}

test_no_synced_infra_machine_of_its_scheme_keeps_it if {
	v := orphans.verdict(left_behind, {}, {}, now, "5m", false, null)
	not v.orphan
	v.kept == [`no InfraMachine of a synced kind in the cluster uses providerID scheme "docker", so the absence of one carrying "docker:////dev-md-0-abcde" proves nothing`]
	aws := json.patch(left_behind, [{"op": "replace", "path": "/spec/providerID", "value": "aws:///us-east-1a/i-1"}])
	not orphans.verdict(aws, evidence, {}, now, "5m", false, null).orphan
}

test_evidence_of_another_cluster_keeps_it_when_scoped if {
	not orphans.verdict(left_behind, evidence, {"clusterName": "dev", "clusterNamespace": "elsewhere"}, now, "5m", false, null).orphan
	other := json.patch(sibling, [{"op": "replace", "path": "/metadata/labels/cluster.x-k8s.io~1cluster-name", "value": "other"}])
	not orphans.verdict(left_behind, fixtures.inventory([other]), {"clusterName": "dev"}, now, "5m", false, null).orphan
	orphans.verdict(left_behind, fixtures.inventory([other]), {}, now, "5m", false, null).orphan
}

test_evidence_of_an_unsynced_kind_does_not_count if {
	params := {"infraMachineKinds": [{"group": "infrastructure.cluster.x-k8s.io", "kind": "AWSMachine"}]}
	not orphans.verdict(left_behind, evidence, params, now, "5m", false, null).orphan
}

test_node_without_provider_id_is_kept if {
	v := verdict(json.remove(left_behind, ["spec"]), [])
	not v.orphan
	v.kept == ["it has no spec.providerID, so nodeguard cannot prove no InfraMachine carries it"]
	scheme_less := json.patch(left_behind, [{"op": "replace", "path": "/spec/providerID", "value": "i-0a1b2c"}])
	w := verdict(scheme_less, [])
	w.kept == [`no InfraMachine of a synced kind in the cluster uses providerID scheme "", so the absence of one carrying "i-0a1b2c" proves nothing`]
}

# --- 4. Not Ready for the grace period ----------------------------------------------------

test_ready_node_is_kept if {
	node := object.union(left_behind, {"status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": long_ago}]}})
	v := verdict(node, [])
	not v.orphan
	v.kept == ["its Ready condition is True"]
}

test_within_grace_is_kept if {
	v := orphans.verdict(left_behind, evidence, {}, now, "15m", false, null)
	not v.orphan
	v.kept == ["it has been not Ready only since 2026-11-30T11:50:00Z, less than the grace period 15m before 2026-11-30T12:00:00Z"]
}

test_grace_exactly_passed_is_an_orphan if {
	orphans.verdict(left_behind, evidence, {}, now, "10m", false, null).orphan
	not orphans.verdict(left_behind, evidence, {}, now, "10m1s", false, null).orphan
}

test_no_ready_condition_counts_from_creation if {
	node := object.union(fixtures.capd_node, {"metadata": {"creationTimestamp": long_ago}})
	v := verdict(node, [])
	v.orphan
	v.notReadySince == long_ago
	not orphans.verdict(node, evidence, {}, now, "1h", false, null).orphan
}

test_no_known_time_is_kept if {
	v := verdict(fixtures.capd_node, [])
	not v.orphan
	v.notReadySince == ""
	v.kept == ["it has no known not-Ready time (no Ready condition and no creationTimestamp)"]
}

test_unreadable_clock_is_kept if {
	not orphans.verdict(left_behind, evidence, {}, "yesterday", "5m", false, null).orphan
	not orphans.verdict(left_behind, evidence, {}, now, "five minutes", false, null).orphan
	not orphans.verdict(not_ready(fixtures.capd_node, "a while ago"), evidence, {}, now, "5m", false, null).orphan
}

# --- Wider match ---------------------------------------------------------------------------

bare := fixtures.without_annotations(left_behind)

# A DockerMachine of another host: evidence the cluster uses docker:// providerIDs.
sibling := json.patch(fixtures.capd_infra, [
	{"op": "replace", "path": "/metadata/name", "value": "dev-md-0-zzzzz"},
	{"op": "replace", "path": "/spec/providerID", "value": "docker:////dev-md-0-zzzzz"},
])

test_wider_match_finds_unannotated_node if {
	v := orphans.verdict(bare, fixtures.inventory([sibling]), {}, now, "5m", true, null)
	v.orphan
	not v.managed
	contains(v.reason, `no Machine, InfraMachine or pool carries providerID "docker:////dev-md-0-abcde"`)
}

test_wider_match_is_off_by_default if {
	not verdict(bare, [sibling]).orphan
	v := data.nodeguard.orphan with input as {"node": bare, "inventory": fixtures.inventory([sibling]), "now": now}
	not v.orphan
}

test_wider_match_needs_a_scheme_in_use if {
	v := orphans.verdict(bare, {}, {}, now, "5m", true, null)
	not v.orphan
	v.kept == ["it has no CAPI annotations and no InfraMachine in the cluster uses its providerID scheme"]
	aws := json.patch(bare, [{"op": "replace", "path": "/spec/providerID", "value": "aws:///us-east-1a/i-1"}])
	not orphans.verdict(aws, fixtures.inventory([sibling]), {}, now, "5m", true, null).orphan
	no_pid := json.remove(bare, ["spec"])
	not orphans.verdict(no_pid, fixtures.inventory([sibling]), {}, now, "5m", true, null).orphan
}

test_wider_match_needs_evidence_labelled_for_the_cluster if {
	unlabelled := json.remove(sibling, ["metadata/labels"])
	not orphans.verdict(bare, fixtures.inventory([unlabelled]), {"clusterName": "dev"}, now, "5m", true, null).orphan
	orphans.verdict(bare, fixtures.inventory([sibling]), {"clusterName": "dev"}, now, "5m", true, null).orphan
	not orphans.verdict(bare, fixtures.inventory([sibling]), {"clusterNamespace": "elsewhere"}, now, "5m", true, null).orphan
}

test_wider_match_keeps_what_something_carries if {
	not orphans.verdict(bare, fixtures.inventory([sibling, fixtures.capd_infra]), {}, now, "5m", true, null).orphan
	machine := json.remove(fixtures.capd_machine, ["status"])
	not orphans.verdict(bare, fixtures.inventory([sibling, machine]), {}, now, "5m", true, null).orphan
}

test_wider_match_keeps_ready_nodes if {
	ready := object.union(bare, {"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
	not orphans.verdict(ready, fixtures.inventory([sibling]), {}, now, "5m", true, null).orphan
}

# --- Entry point -----------------------------------------------------------------------------

test_entry_point_defaults_grace if {
	v := data.nodeguard.orphan with input as {"node": left_behind, "inventory": evidence, "now": now}
	v.orphan
	recent := data.nodeguard.orphan with input as {"node": not_ready(fixtures.capd_node, "2026-11-30T11:56:00Z"), "inventory": evidence, "now": now}
	not recent.orphan
}

test_entry_point_reads_every_input if {
	v := data.nodeguard.orphan with input as {
		"node": bare,
		"inventory": fixtures.inventory([sibling]),
		"parameters": {"clusterName": "dev"},
		"now": now,
		"grace": "1m",
		"matchProviderID": true,
	}
	v.orphan
}

test_provider_id_scheme if {
	orphans.provider_id_scheme("aws:///us-east-1a/i-1") == "aws"
	not orphans.provider_id_scheme("i-1")
	not orphans.provider_id_scheme("://x")
}

# --- The Node-only screen ------------------------------------------------------------------

# Nodes each kept by one criterion that reads only the Node, the parameters or the clock.
screened := {
	"unmanaged": {
		"node": bare, "params": {},
		"kept": "it is not managed by Cluster API (no cluster.x-k8s.io/machine and cluster.x-k8s.io/cluster-namespace annotations)",
	},
	"other cluster": {
		"node": left_behind, "params": {"clusterName": "other"},
		"kept": "it belongs to Cluster default/dev, not to the Cluster judged",
	},
	"ready": {
		"node": object.union(left_behind, {"status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": long_ago}]}}),
		"params": {}, "kept": "its Ready condition is True",
	},
	"no providerID": {
		"node": json.remove(left_behind, ["spec"]), "params": {},
		"kept": "it has no spec.providerID, so nodeguard cannot prove no InfraMachine carries it",
	},
	"within grace": {
		"node": not_ready(fixtures.capd_node, "2026-11-30T11:58:00Z"), "params": {},
		"kept": "it has been not Ready only since 2026-11-30T11:58:00Z, less than the grace period 5m before 2026-11-30T12:00:00Z",
	},
}

test_node_passes_fails_each_node_only_criterion if {
	every c in screened {
		not orphans.node_passes(c.node, c.params, now, "5m", false)
	}
}

# Whatever the inventory, what keeps a Node from passing keeps it from being
# an orphan: the same reason is in kept_because.
test_a_node_that_does_not_pass_is_kept if {
	inventories := [{}, evidence, fixtures.inventory([sibling, fixtures.capd_machine]), fixtures.inventory([sibling, fixtures.capd_infra])]
	every c in screened {
		every inv in inventories {
			c.kept in orphans.kept_because(c.node, inv, c.params, now, "5m", false, null)
		}
	}
}

test_node_passes_what_only_the_inventory_decides if {
	orphans.node_passes(left_behind, {}, now, "5m", false)
	orphans.node_passes(bare, {}, now, "5m", true)
	orphans.node_passes(left_behind, {"clusterName": "dev", "clusterNamespace": "default"}, now, "5m", false)

	# Passes, but kept by the inventory: its Machine exists.
	not verdict(left_behind, [fixtures.capd_machine]).orphan
}

test_recheck_at_is_the_end_of_the_grace if {
	recent := not_ready(fixtures.capd_node, "2026-11-30T11:58:00Z")
	orphans.recheck_at(recent, {}, now, "5m", false) == "2026-11-30T12:03:00Z"
	orphans.recheck_at(recent, {}, now, "90s", false) == ""
	orphans.recheck_at(recent, {}, now, "2m30.5s", false) == "2026-11-30T12:00:30.5Z"
}

test_recheck_at_is_empty_when_more_than_the_clock_keeps_it if {
	orphans.recheck_at(left_behind, {}, now, "5m", false) == ""
	recent := not_ready(fixtures.capd_node, "2026-11-30T11:58:00Z")
	orphans.recheck_at(recent, {"clusterName": "other"}, now, "5m", false) == ""
	orphans.recheck_at(fixtures.without_annotations(recent), {}, now, "5m", false) == ""
	orphans.recheck_at(fixtures.capd_node, {}, now, "5m", false) == ""
	orphans.recheck_at(recent, {}, now, "five minutes", false) == ""
}

test_entry_point_screen if {
	recent := not_ready(fixtures.capd_node, "2026-11-30T11:58:00Z")
	s := data.nodeguard.orphan_screen with input as {"node": recent, "now": now}
	s == {"passes": false, "recheckAt": "2026-11-30T12:03:00Z"}
	t := data.nodeguard.orphan_screen with input as {"node": bare, "now": now, "grace": "1m", "matchProviderID": true, "parameters": {"clusterName": "dev"}}
	t == {"passes": true, "recheckAt": ""}
}

# --- Not a ghost ------------------------------------------------------------------------

# The Machine and DockerMachine went at 11:40; the kubelet re-registered the
# Node at 11:45, and it has been NotReady since (its CNI never came up): it
# passes every other criterion, with the wider match, yet its host runs.
reregistered_not_ready := object.union(fixtures.without_annotations(not_ready(fixtures.capd_node, "2026-11-30T11:45:00Z")), {"metadata": {"creationTimestamp": "2026-11-30T11:45:00Z"}})

tombstone := {
	"providerID": "docker:////dev-md-0-abcde", "object": "DockerMachine default/dev-md-0-abcde", "node": "dev-md-0-abcde",
	"deletedAt": "2026-11-30T11:40:00Z", "until": "2026-12-01T11:40:00Z",
}

test_a_ghost_is_never_an_orphan if {
	inv := fixtures.inventory([sibling])
	orphans.verdict(reregistered_not_ready, inv, {}, now, "5m", true, null).orphan
	v := orphans.verdict(reregistered_not_ready, inv, {}, now, "5m", true, tombstone)
	not v.orphan
	count(v.kept) == 1
	startswith(v.kept[0], "it is a ghost, never an orphan to delete: providerID \"docker:////dev-md-0-abcde\" was carried by DockerMachine")
}

test_a_node_left_behind_with_a_tombstone_is_still_an_orphan if {
	# The Node CAPI failed to delete, NotReady since before the tombstone: its host is gone.
	v := orphans.verdict(left_behind, fixtures.inventory([sibling]), {}, now, "5m", false, object.union(tombstone, {"deletedAt": "2026-11-30T11:55:00Z"}))
	v.orphan
}

test_the_entry_point_passes_the_tombstone if {
	input_ := {"node": reregistered_not_ready, "inventory": fixtures.inventory([sibling]), "now": now, "matchProviderID": true}
	v := data.nodeguard.orphan with input as input_
	v.orphan
	w := data.nodeguard.orphan with input as object.union(input_, {"tombstone": tombstone})
	not w.orphan
}
