# METADATA
# title: Tests of the Gatekeeper entry point with nodeguard as external data provider
# description: |
#   external_data is Gatekeeper's builtin (declared for opa by
#   policies/gatekeeper.capabilities.json, implemented only in Gatekeeper); each
#   test replaces it with a function giving the answer nodeguard, or a failure,
#   would give. (opa replaces a builtin without implementation only by a
#   function, not by a value.)
package k8snodeguardexternal_test

import data.k8snodeguardexternal
import data.lib.nodeguard
import data.lib.nodeguard_test as fixtures

review := object.union(fixtures.delete_review(fixtures.capd_node), {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002"})

key := nodeguard.provider_key(review)

gk_input(r, parameters) := {"review": r, "parameters": parameters}

# external_data's result when nodeguard answered the key with objs.
answered(objs, parameters) := {
	"responses": [[key, {"inventory": fixtures.inventory(objs), "parameters": parameters}]],
	"errors": [],
	"status_code": 200,
	"system_error": "",
}

synced := {"infraMachineKinds": [{"group": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine"}], "infraMachinePoolKinds": []}

deleting_infra := json.patch(fixtures.capd_infra, [{"op": "add", "path": "/metadata/deletionTimestamp", "value": "2026-12-01T10:00:00Z"}])

blocked(_) := answered([fixtures.capd_machine, fixtures.capd_infra], synced)

test_blockers_from_the_answer_are_violations if {
	violations := k8snodeguardexternal.violation with input as gk_input(review, {}) with external_data as blocked
	count(violations) == 1
	some v in violations
	v.details.blocker.kind == "DockerMachine"
	contains(v.msg, `Node "dev-md-0-abcde" cannot be deleted: DockerMachine default/dev-md-0-abcde`)
}

being_deleted(_) := answered([fixtures.capd_machine, deleting_infra], synced)

# What Gatekeeper's sync drops (an object with a deletionTimestamp), nodeguard
# answers: the teardown window holds.
test_an_infra_machine_being_deleted_still_blocks if {
	violations := k8snodeguardexternal.violation with input as gk_input(review, {}) with external_data as being_deleted
	some v in violations
	v.details.blocker.deleting == true
	contains(v.msg, "is being deleted but still exists")
}

gone(_) := answered([fixtures.capd_machine], synced)

test_no_violation_once_the_answer_holds_nothing_linked if {
	violations := k8snodeguardexternal.violation with input as gk_input(review, {}) with external_data as gone
	count(violations) == 0
}

# The request names the provider and one key: the review's uid and only the
# Node's declared fields.
asked(request) := answered([fixtures.capd_machine, fixtures.capd_infra], synced) if {
	request.provider == "nodeguard"
	count(request.keys) == 1
	sent := json.unmarshal(request.keys[0])
	sent.uid == "705ab4f5-6393-11e8-b7cc-42010a800002"
	sent.node == {
		"metadata": {
			"name": "dev-md-0-abcde",
			"annotations": {
				"cluster.x-k8s.io/cluster-name": "dev",
				"cluster.x-k8s.io/cluster-namespace": "default",
				"cluster.x-k8s.io/machine": "dev-md-0-abcde",
			},
		},
		"spec": {"providerID": "docker:////dev-md-0-abcde"},
	}
}

test_the_key_carries_the_uid_and_the_declared_node_fields if {
	violations := k8snodeguardexternal.violation with input as gk_input(review, {}) with external_data as asked
	count(violations) == 1
}

# The one violation a failed answer gives, checked for what every such
# violation says.
provider_violation(violations) := v if {
	count(violations) == 1
	some v in violations
	v.details.provider == "nodeguard"
	contains(v.msg, `Node "dev-md-0-abcde" cannot be deleted: nodeguard's external data provider "nodeguard" did not give`)
}

# What Gatekeeper's builtin returns when the request fails (HandleError).
unreachable(_) := {"responses": null, "errors": null, "status_code": 500, "system_error": "failed to send external data request: connection refused"}

test_unreachable_provider_is_a_violation if {
	v := provider_violation(k8snodeguardexternal.violation) with input as gk_input(review, {}) with external_data as unreachable
	v.details.error == "Gatekeeper could not reach it: failed to send external data request: connection refused"
}

not_ready(_) := {"responses": [], "errors": [[key, "nodeguard is not ready"]], "status_code": 200, "system_error": ""}

test_an_error_for_the_key_is_a_violation if {
	v := provider_violation(k8snodeguardexternal.violation) with input as gk_input(review, {}) with external_data as not_ready
	v.details.error == "it answered: nodeguard is not ready"
}

odd_error(_) := {"responses": [], "errors": ["oops"], "status_code": 200, "system_error": ""}

test_a_malformed_error_is_still_a_violation if {
	v := provider_violation(k8snodeguardexternal.violation) with input as gk_input(review, {}) with external_data as odd_error
	v.details.error == "it answered: oops"
}

unauthorized(_) := json.patch(answered([], synced), [{"op": "replace", "path": "/status_code", "value": 401}])

test_an_http_error_status_is_a_violation if {
	v := provider_violation(k8snodeguardexternal.violation) with input as gk_input(review, {}) with external_data as unauthorized
	v.details.error == "it answered with HTTP status 401"
}

other_key(_) := {"responses": [["another key", {"inventory": {}, "parameters": {}}]], "errors": [], "status_code": 200, "system_error": ""}

no_inventory(_) := {"responses": [[key, {"parameters": {}}]], "errors": [], "status_code": 200, "system_error": ""}

not_an_object(_) := {"responses": [[key, "allowed"]], "errors": [], "status_code": 200, "system_error": ""}

test_a_missing_or_malformed_answer_is_a_violation if {
	a := provider_violation(k8snodeguardexternal.violation) with input as gk_input(review, {}) with external_data as other_key
	a.details.error == "its answer holds no readable facts for this Node"
	b := provider_violation(k8snodeguardexternal.violation) with input as gk_input(review, {}) with external_data as no_inventory
	b.details.error == a.details.error
	c := provider_violation(k8snodeguardexternal.violation) with input as gk_input(review, {}) with external_data as not_an_object
	c.details.error == a.details.error
}

# Every key answered from Gatekeeper's cache: status 0 (another Constraint of
# this kind already asked for this review).
cached(_) := json.patch(answered([fixtures.capd_machine, fixtures.capd_infra], synced), [{"op": "replace", "path": "/status_code", "value": 0}])

test_a_cached_answer_is_read if {
	violations := k8snodeguardexternal.violation with input as gk_input(review, {}) with external_data as cached
	some v in violations
	v.details.blocker.kind == "DockerMachine"
}

nothing_synced(_) := answered([fixtures.capd_machine], {"infraMachineKinds": [], "infraMachinePoolKinds": []})

# The synced kinds come from nodeguard: a kind it syncs proves an absence
# whatever the Constraint says, and one it does not sync proves nothing.
test_the_provided_kinds_replace_the_constraints if {
	allowed := k8snodeguardexternal.violation with input as gk_input(review, {"infraMachineKinds": []}) with external_data as gone
	count(allowed) == 0

	unverified := k8snodeguardexternal.violation with input as gk_input(review, synced) with external_data as nothing_synced
	some u in unverified
	u.details.unverified.kind == "DockerMachine"
}

other_cluster(_) := answered(
	[fixtures.capd_machine, fixtures.capd_infra],
	object.union(synced, {"clusterNamespace": "default", "clusterName": "other"}),
)

# nodeguard's route names the cluster: its Machines alone count.
test_the_provided_cluster_scope_applies if {
	# The DockerMachine is labelled for dev, so it is out of scope too.
	bare := object.union(fixtures.delete_review(fixtures.without_annotations(fixtures.capd_node)), {"uid": review.uid})
	violations := k8snodeguardexternal.violation with input as gk_input(bare, {}) with external_data as other_cluster_bare
	count(violations) == 0
}

other_cluster_bare(request) := {
	"responses": [[request.keys[0], {
		"inventory": fixtures.inventory([fixtures.capd_machine, fixtures.capd_infra]),
		"parameters": object.union(synced, {"clusterNamespace": "default", "clusterName": "other"}),
	}]],
	"errors": [], "status_code": 200, "system_error": "",
}

# A Node whose annotations name Cluster dev, on Cluster other's route: denied.
test_a_misrouted_node_is_a_violation if {
	violations := k8snodeguardexternal.violation with input as gk_input(review, {}) with external_data as other_cluster
	count(violations) == 1
	some v in violations
	contains(v.msg, "this review came on the route of Cluster default/other")
}

exempting(_) := answered(
	[fixtures.capd_machine, fixtures.capd_infra],
	object.union(synced, {"exemptUsers": ["alice"], "allowUnverifiedKinds": true}),
)

# Exemptions and the rest come from the Constraint: what else nodeguard sends
# is ignored.
test_only_provided_parameters_are_taken_from_the_answer if {
	violations := k8snodeguardexternal.violation with input as gk_input(review, {}) with external_data as exempting
	count(violations) == 1

	exempt := k8snodeguardexternal.violation with input as gk_input(review, {"exemptUsers": ["alice"]}) with external_data as blocked
	count(exempt) == 0
}

# Reviews that are not a Node DELETE never reach the provider: even a
# failing one leaves them alone.
test_audit_and_other_operations_yield_no_violation if {
	audit := {"kind": {"group": "", "version": "v1", "kind": "Node"}, "object": fixtures.capd_node}
	count(k8snodeguardexternal.violation) == 0 with input as gk_input(audit, {}) with external_data as unreachable
	update := object.union(review, {"operation": "UPDATE"})
	count(k8snodeguardexternal.violation) == 0 with input as gk_input(update, {}) with external_data as unreachable
}

test_a_delete_without_the_node_is_denied_without_asking if {
	violations := k8snodeguardexternal.violation with input as gk_input(json.remove(review, ["oldObject"]), {})
		with external_data as unreachable
	count(violations) == 1
	some v in violations
	v.details == {}
	contains(v.msg, "cannot be judged")
}
