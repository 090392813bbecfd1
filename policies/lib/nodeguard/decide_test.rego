# METADATA
# title: Tests of the rule library
# description: Every link, both Machine API versions, scope, exemptions, unverified kinds and messages.
package lib.nodeguard_test

import data.lib.nodeguard

decide(node, objs) := nodeguard.decide(delete_review(node), inventory(objs), {})

decide_with(node, objs, params) := nodeguard.decide(delete_review(node), inventory(objs), params)

blocker_ids(decision) := {sprintf("%s/%s/%s", [b.kind, b.namespace, b.name]) | some b in decision.blockers}

link_types(blocker) := {link.type | some link in blocker.links}

# Keep only what a link needs, to test each link on its own.
bare_node(node) := {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.metadata.name}}

bare_machine(machine) := json.remove(machine, ["status", "spec/providerID"])

# --- Each link alone -------------------------------------------------------------

test_link_machine_node_ref_v1beta2 if {
	d := decide(bare_node(capd_node), [json.remove(capd_machine, ["spec/providerID"]), capd_infra])
	not d.allowed
	blocker_ids(d) == {"DockerMachine/default/dev-md-0-abcde"}
	link_types(d.blockers[0]) == {"machineNodeRef"}
	d.blockers[0].links[0].machine == "default/dev-md-0-abcde"
}

test_link_machine_node_ref_v1beta1 if {
	d := decide(bare_node(capa_node), [json.remove(capa_machine, ["spec/providerID"]), capa_infra])
	not d.allowed
	blocker_ids(d) == {"AWSMachine/prod/prod-md-0-q8z4v"}
	link_types(d.blockers[0]) == {"machineNodeRef"}
}

test_link_machine_provider_id if {
	node := json.remove(capd_node, ["metadata/annotations"])
	d := decide(node, [json.remove(capd_machine, ["status"]), json.remove(capd_infra, ["spec/providerID"])])
	not d.allowed
	link_types(d.blockers[0]) == {"machineProviderID"}
}

test_link_infra_provider_id_without_machine if {
	d := decide(without_annotations(capd_node), [capd_infra])
	not d.allowed
	blocker_ids(d) == {"DockerMachine/default/dev-md-0-abcde"}
	link_types(d.blockers[0]) == {"infraProviderID"}
	contains(d.messages[0], "delete the DockerMachine first, then the Node")
}

test_link_node_annotation if {
	node := json.remove(capd_node, ["spec"])
	d := decide(node, [bare_machine(capd_machine), json.remove(capd_infra, ["spec/providerID"])])
	not d.allowed
	link_types(d.blockers[0]) == {"nodeAnnotation"}
}

test_link_annotation_needs_namespace_too if {
	node := json.remove(capd_node, ["spec", "metadata/annotations/cluster.x-k8s.io~1cluster-namespace"])
	d := decide(node, [bare_machine(capd_machine), json.remove(capd_infra, ["spec/providerID"])])
	d.allowed
}

test_link_pool_provider_id_list if {
	d := decide(pool_node, [capd_pool])
	not d.allowed
	blocker_ids(d) == {"DockerMachinePool/default/dev-mp-0"}
	link_types(d.blockers[0]) == {"poolProviderIDList"}
	contains(d.messages[0], "scale the MachinePool down instead")
	contains(d.messages[0], "docker:////dev-mp-0-2")
}

test_pool_that_does_not_list_the_node if {
	node := json.patch(pool_node, [{"op": "replace", "path": "/spec/providerID", "value": "docker:////dev-mp-0-9"}])
	decide(node, [capd_pool]).allowed
}

test_all_links_at_once_v1beta2 if {
	d := decide(capd_node, [capd_machine, capd_infra])
	not d.allowed
	count(d.blockers) == 1
	link_types(d.blockers[0]) == {"machineNodeRef", "machineProviderID", "nodeAnnotation", "infraProviderID"}
}

test_all_links_at_once_v1beta1 if {
	d := decide(capa_node, [capa_machine, capa_infra])
	not d.allowed
	link_types(d.blockers[0]) == {"machineNodeRef", "machineProviderID", "infraProviderID"}
	d.blockers[0].group == "infrastructure.cluster.x-k8s.io"
	d.blockers[0].version == "v1beta2"
}

# --- infrastructureRef shapes --------------------------------------------------------

test_v1beta1_ref_namespace_is_honoured if {
	machine := json.patch(capa_machine, [{"op": "replace", "path": "/spec/infrastructureRef/namespace", "value": "infra"}])
	infra := json.patch(capa_infra, [{"op": "replace", "path": "/metadata/namespace", "value": "infra"}])
	d := decide(bare_node(capa_node), [machine, infra])
	blocker_ids(d) == {"AWSMachine/infra/prod-md-0-q8z4v"}

	# The same name in the Machine's namespace is not what the ref names.
	decide(bare_node(capa_node), [machine, capa_infra]).allowed
}

test_v1beta1_ref_without_namespace_uses_the_machines if {
	machine := json.remove(capa_machine, ["spec/infrastructureRef/namespace"])
	blocker_ids(decide(bare_node(capa_node), [machine, capa_infra])) == {"AWSMachine/prod/prod-md-0-q8z4v"}
}

test_ref_version_differs_from_synced_version if {
	machine := json.patch(capa_machine, [{"op": "replace", "path": "/spec/infrastructureRef/apiVersion", "value": "infrastructure.cluster.x-k8s.io/v1beta1"}])
	not decide(bare_node(capa_node), [machine, capa_infra]).allowed
}

test_infra_synced_in_two_versions_is_one_blocker if {
	old := object.union(capd_infra, {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1"})
	d := decide(capd_node, [capd_machine, capd_infra, old])
	count(d.blockers) == 1
	d.blockers[0].version == "v1beta1"
}

test_machine_synced_in_two_versions_links_once if {
	old := object.union(capd_machine, {"apiVersion": "cluster.x-k8s.io/v1beta1"})
	d := decide(capd_node, [capd_machine, old, capd_infra])
	count(d.blockers) == 1
	count(d.blockers[0].links) == 4
}

test_machine_of_another_api_group_is_ignored if {
	openshift := object.union(capd_machine, {"apiVersion": "machine.openshift.io/v1beta1"})
	decide(bare_node(capd_node), [openshift, capd_infra]).allowed
}

test_machine_without_infrastructure_ref_links_nothing if {
	decide(capd_node, [json.remove(capd_machine, ["spec/infrastructureRef"])]).allowed
}

test_core_group_ref if {
	machine := json.patch(capa_machine, [{"op": "replace", "path": "/spec/infrastructureRef", "value": {"apiVersion": "v1", "kind": "ConfigMap", "name": "host"}}])
	host := {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"namespace": "prod", "name": "host"}}
	d := decide(bare_node(capa_node), [machine, host])
	blocker_ids(d) == {"ConfigMap/prod/host"}
	d.blockers[0].group == ""
	d.blockers[0].version == "v1"
}

# --- CAPI's order ----------------------------------------------------------------------

test_capi_order_infra_gone_is_allowed if {
	d := decide(capd_node, [capd_machine])
	d.allowed
	d.reason == "no-link"
	d.messages == []
	d.warnings == []
}

test_capi_order_v1beta1_infra_gone_is_allowed if {
	decide(capa_node, [deleting(capa_machine)]).allowed
}

test_deleting_infra_still_blocks if {
	d := decide(capd_node, [deleting(capd_machine), deleting(capd_infra)])
	not d.allowed
	d.reason == "blocked"
	d.blockers[0].deleting == true
	contains(d.messages[0], "is being deleted but still exists")
	contains(d.messages[0], "wait until it is gone")
}

test_existing_infra_is_not_deleting if {
	decide(capd_node, [capd_machine, capd_infra]).blockers[0].deleting == false
}

test_no_objects_at_all_is_allowed if {
	nodeguard.decide(delete_review(capd_node), {}, {}).allowed
}

test_empty_provider_id_links_nothing if {
	node := json.patch(bare_node(capd_node), [{"op": "add", "path": "/spec", "value": {"providerID": ""}}])
	infra := json.patch(capd_infra, [{"op": "replace", "path": "/spec/providerID", "value": ""}])
	machine := json.patch(bare_machine(capd_machine), [{"op": "add", "path": "/spec/providerID", "value": ""}])
	pool := json.patch(capd_pool, [{"op": "add", "path": "/spec/providerIDList/-", "value": ""}])
	decide(node, [infra, machine, pool]).allowed
}

# --- Tampering: links only add blockers ------------------------------------------------

test_annotation_removed_other_links_still_block if {
	d := decide(without_annotations(capd_node), [capd_machine, capd_infra])
	not d.allowed
	link_types(d.blockers[0]) == {"machineNodeRef", "machineProviderID", "infraProviderID"}
}

test_annotation_pointing_elsewhere_adds_a_blocker if {
	other_machine := json.patch(bare_machine(capd_machine), [
		{"op": "replace", "path": "/metadata/name", "value": "other"},
		{"op": "replace", "path": "/spec/infrastructureRef/name", "value": "other"},
	])
	other_infra := json.patch(capd_infra, [
		{"op": "replace", "path": "/metadata/name", "value": "other"},
		{"op": "replace", "path": "/spec/providerID", "value": "docker:////other"},
	])
	node := json.patch(capd_node, [{"op": "replace", "path": "/metadata/annotations/cluster.x-k8s.io~1machine", "value": "other"}])
	d := decide(node, [capd_machine, capd_infra, other_machine, other_infra])
	blocker_ids(d) == {"DockerMachine/default/dev-md-0-abcde", "DockerMachine/default/other"}
	count(d.messages) == 2
}

test_annotation_pointing_to_nothing_does_not_unblock if {
	node := json.patch(capd_node, [{"op": "replace", "path": "/metadata/annotations/cluster.x-k8s.io~1machine", "value": "missing"}])
	not decide(node, [capd_machine, capd_infra]).allowed
}

# --- Several blockers --------------------------------------------------------------------

test_several_blockers_each_get_a_sentence if {
	stray := json.patch(capd_infra, [
		{"op": "replace", "path": "/kind", "value": "DevMachine"},
		{"op": "replace", "path": "/metadata/name", "value": "stray"},
	])
	d := decide(capd_node, [capd_machine, capd_infra, stray, capd_pool])
	blocker_ids(d) == {"DockerMachine/default/dev-md-0-abcde", "DevMachine/default/stray"}
	count(d.messages) == 2
	some m1 in d.messages
	contains(m1, "DevMachine default/stray")
	some m2 in d.messages
	contains(m2, "DockerMachine default/dev-md-0-abcde")
}

# --- Cluster scope ------------------------------------------------------------------------

other_cluster(obj) := json.patch(obj, [
	{"op": "replace", "path": "/metadata/labels/cluster.x-k8s.io~1cluster-name", "value": "other"},
	{"op": "replace", "path": "/spec/clusterName", "value": "other"},
])

test_scope_excludes_machines_of_other_clusters if {
	machine := other_cluster(capd_machine)
	infra := json.patch(capd_infra, [{"op": "replace", "path": "/metadata/labels/cluster.x-k8s.io~1cluster-name", "value": "other"}])
	decide_with(capd_node, [machine, infra], {"clusterName": "dev"}).allowed
	not decide(capd_node, [machine, infra]).allowed
}

test_scope_keeps_machines_of_this_cluster if {
	not decide_with(capd_node, [capd_machine, capd_infra], {"clusterName": "dev", "clusterNamespace": "default"}).allowed
}

test_scope_by_spec_cluster_name_alone if {
	machine := json.remove(capd_machine, ["metadata/labels"])
	infra := json.remove(capd_infra, ["metadata/labels"])
	not decide_with(bare_node(capd_node), [machine, infra], {"clusterName": "dev"}).allowed
	decide_with(bare_node(capd_node), [machine, infra], {"clusterName": "other"}).allowed
}

test_scope_by_label_alone if {
	machine := json.remove(capd_machine, ["spec/clusterName"])
	not decide_with(bare_node(capd_node), [machine, capd_infra], {"clusterName": "dev"}).allowed
}

test_scope_by_namespace if {
	decide_with(capd_node, [capd_machine, capd_infra], {"clusterNamespace": "elsewhere"}).allowed
	not decide_with(capd_node, [capd_machine, capd_infra], {"clusterNamespace": "default"}).allowed
}

test_scope_counts_unlabelled_infra if {
	not decide_with(without_annotations(capd_node), [json.remove(capd_infra, ["metadata/labels"])], {"clusterName": "dev"}).allowed
}

test_scope_excludes_pool_of_other_cluster if {
	pool := json.patch(capd_pool, [{"op": "replace", "path": "/metadata/labels/cluster.x-k8s.io~1cluster-name", "value": "other"}])
	decide_with(pool_node, [pool], {"clusterName": "dev"}).allowed
}

test_same_node_name_in_two_clusters_unscoped_fails_closed if {
	machine := other_cluster(json.remove(capd_machine, ["spec/providerID"]))
	not decide(bare_node(capd_node), [machine, capd_infra]).allowed
}

# --- Exemptions --------------------------------------------------------------------------------

test_exempt_user_is_allowed_with_a_warning if {
	d := decide_with(capd_node, [capd_machine, capd_infra], {"exemptUsers": ["alice"]})
	d.allowed
	d.reason == "exempt"
	d.messages == []
	count(d.warnings) == 1
	contains(d.warnings[0], `user "alice" is exempt`)
	contains(d.warnings[0], "DockerMachine default/dev-md-0-abcde")
}

test_exempt_group_is_allowed_with_a_warning if {
	d := decide_with(capd_node, [capd_machine, capd_infra], {"exemptGroups": ["system:authenticated"]})
	d.allowed
	contains(d.warnings[0], `group "system:authenticated" is exempt`)
}

test_exemption_with_nothing_to_bypass_warns_nothing if {
	d := decide_with(capd_node, [capd_machine], {"exemptUsers": ["alice"]})
	d.allowed
	d.reason == "no-link"
	d.warnings == []
}

test_other_users_are_not_exempt if {
	not decide_with(capd_node, [capd_machine, capd_infra], {"exemptUsers": ["bob"], "exemptGroups": ["ops"]}).allowed
}

test_review_without_user_info if {
	review := json.remove(delete_review(capd_node), ["userInfo"])
	not nodeguard.decide(review, inventory([capd_machine, capd_infra]), {"exemptGroups": ["ops"]}).allowed
}

# --- What is judged ------------------------------------------------------------------------------

test_update_is_not_judged if {
	review := object.union(delete_review(capd_node), {"operation": "UPDATE", "object": capd_node})
	d := nodeguard.decide(review, inventory([capd_machine, capd_infra]), {})
	d.allowed
	d.reason == "not-judged"
	d.messages == []
}

test_audit_review_without_operation_is_not_judged if {
	review := {"kind": {"group": "", "version": "v1", "kind": "Node"}, "object": capd_node}
	nodeguard.decide(review, inventory([capd_machine, capd_infra]), {}).allowed
}

test_other_kind_is_not_judged if {
	review := object.union(delete_review(capd_node), {"kind": {"group": "", "version": "v1", "kind": "Pod"}})
	nodeguard.decide(review, inventory([capd_machine, capd_infra]), {}).allowed
}

test_node_kind_of_another_group_is_not_judged if {
	review := object.union(delete_review(capd_node), {"kind": {"group": "example.com", "version": "v1", "kind": "Node"}})
	nodeguard.decide(review, inventory([capd_machine, capd_infra]), {}).allowed
}

test_delete_without_old_object_fails_closed if {
	review := json.remove(delete_review(capd_node), ["oldObject"])
	d := nodeguard.decide(review, inventory([]), {})
	not d.allowed
	d.reason == "unjudgeable"
	contains(d.messages[0], `Node "dev-md-0-abcde" cannot be judged`)
}

# A Node without a name is no Node the links can be read of.
test_delete_of_a_node_without_a_name_fails_closed if {
	review := json.remove(delete_review(capd_node), ["oldObject/metadata/name"])
	d := nodeguard.decide(review, inventory([capd_machine, capd_infra]), {})
	not d.allowed
	d.reason == "unjudgeable"
}

test_delete_with_object_only_uses_object if {
	review := object.union(json.remove(delete_review(capd_node), ["oldObject"]), {"object": capd_node})
	not nodeguard.decide(review, inventory([capd_machine, capd_infra]), {}).allowed
}

# --- Unverified kinds ----------------------------------------------------------------------------

unknown_kind_machine := json.patch(capd_machine, [{
	"op": "replace",
	"path": "/spec/infrastructureRef",
	"value": {"apiGroup": "infrastructure.example.com", "kind": "FooMachine", "name": "dev-md-0-abcde"},
}])

test_unsynced_kind_fails_closed if {
	d := decide(capd_node, [unknown_kind_machine])
	not d.allowed
	d.reason == "unverified"
	d.blockers == []
	d.unverified[0].kind == "FooMachine"
	d.unverified[0].group == "infrastructure.example.com"
	contains(d.messages[0], `add {group: "infrastructure.example.com", kind: "FooMachine"} to infraMachineKinds`)
}

test_unsynced_kind_allowed_when_opted_out if {
	decide_with(capd_node, [unknown_kind_machine], {"allowUnverifiedKinds": true}).allowed
}

test_unsynced_kind_listed_is_verified if {
	kinds := array.concat(nodeguard.default_infra_machine_kinds, [{"group": "infrastructure.example.com", "kind": "FooMachine"}])
	decide_with(capd_node, [unknown_kind_machine], {"infraMachineKinds": kinds}).allowed
}

test_unsynced_kind_present_is_a_blocker if {
	custom_infra := object.union(capd_infra, {"apiVersion": "infrastructure.example.com/v1", "kind": "FooMachine"})
	d := decide(capd_node, [unknown_kind_machine, custom_infra])
	blocker_ids(d) == {"FooMachine/default/dev-md-0-abcde"}
	d.unverified == []
}

# A blocker and an unverified kind at once: blocked is the reason.
test_blocked_goes_before_unverified if {
	d := decide(capd_node, [unknown_kind_machine, capd_infra])
	d.reason == "blocked"
	count(d.blockers) == 1
	count(d.unverified) == 1
	count(d.messages) == 2
}

test_custom_kinds_replace_the_defaults if {
	d := decide_with(capd_node, [capd_machine], {"infraMachineKinds": [{"group": "infrastructure.cluster.x-k8s.io", "kind": "AWSMachine"}]})
	not d.allowed
	d.unverified[0].kind == "DockerMachine"
}

test_unlisted_kind_is_not_found_by_provider_id if {
	params := {"infraMachineKinds": [], "infraMachinePoolKinds": []}
	decide_with(without_annotations(capd_node), [capd_infra, capd_pool], params).allowed
}

# The enforcer passes every parameter; they are used as given, not merged.
test_complete_parameters_are_used_as_given if {
	params := object.union(nodeguard.default_parameters, {"infraMachineKinds": [], "allowUnverifiedKinds": true})
	decide_with(capd_node, [capd_machine], params).allowed
	not decide_with(capd_node, [capd_machine], json.remove(params, ["allowUnverifiedKinds"])).allowed
}

# Parameters missing any default key are merged with the defaults.
test_every_default_parameter_is_needed_to_skip_the_merge if {
	nodeguard._complete(nodeguard.default_parameters)
	every name, _ in nodeguard.default_parameters {
		not nodeguard._complete(object.remove(nodeguard.default_parameters, [name]))
	}
}

test_parameters_that_are_not_an_object_mean_defaults if {
	not nodeguard.decide(delete_review(capd_node), inventory([capd_machine, capd_infra]), null).allowed
}

# --- Messages ---------------------------------------------------------------------------------------

test_message_names_node_blocker_link_and_next_step if {
	d := decide(capa_node, [capa_machine, capa_infra])
	msg := d.messages[0]
	startswith(msg, `Node "ip-10-0-1-17.ec2.internal" cannot be deleted: AWSMachine prod/prod-md-0-q8z4v (infrastructure.cluster.x-k8s.io) still exists`)
	contains(msg, "linked by Machine prod/prod-md-0-q8z4v (status.nodeRef, spec.providerID) and its own spec.providerID;")
	contains(msg, "delete Machine prod/prod-md-0-q8z4v instead")
}

test_message_names_the_annotation_link if {
	node := json.remove(capd_node, ["spec"])
	d := decide(node, [bare_machine(capd_machine), capd_infra])
	contains(d.messages[0], "named by the Node's cluster.x-k8s.io/machine annotation")
}

test_judged if {
	nodeguard.judged(delete_review(capd_node))
	not nodeguard.judged(object.union(delete_review(capd_node), {"operation": "CREATE"}))
}

test_two_machines_referencing_one_infra_machine if {
	twin := json.patch(capd_machine, [{"op": "replace", "path": "/metadata/name", "value": "twin"}])
	d := decide(capd_node, [capd_machine, twin, capd_infra])
	not d.allowed
	count(d.blockers) == 1
	contains(d.messages[0], "delete Machine default/dev-md-0-abcde and default/twin instead")
}

test_user_in_two_exempt_groups if {
	review := object.union(delete_review(capd_node), {"userInfo": {"username": "bob", "groups": ["zeta", "alpha"]}})
	d := nodeguard.decide(review, inventory([capd_machine, capd_infra]), {"exemptGroups": ["zeta", "alpha"]})
	d.allowed
	contains(d.warnings[0], `group "alpha" is exempt`)
}

# Without the provider's facts the Node cannot be judged: denied, and said so.
test_provider_error_is_unjudgeable if {
	d := nodeguard.decide_with_provider(delete_review(capd_node), {"error": "it answered: not ready"}, {})
	not d.allowed
	d.reason == "unjudgeable"
	d.findings[0].details == {"provider": "nodeguard", "error": "it answered: not ready"}
}
