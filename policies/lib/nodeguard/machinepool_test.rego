# Tests of the MachinePool link: managed pools (EKS managed node groups, shaped
# as CAPA writes them), whose instances have no Machine, and Cluster API's
# MachinePool Machines, whose per-instance Machine decides.
package lib.nodeguard_test

import data.lib.nodeguard

eks_pid := "aws:///us-west-2a/i-0a1b2c3d4e5f60001"

eks_node := {
	"apiVersion": "v1",
	"kind": "Node",
	"metadata": {
		"name": "ip-10-0-1-17.us-west-2.compute.internal",
		"annotations": {
			"cluster.x-k8s.io/cluster-name": "prod",
			"cluster.x-k8s.io/cluster-namespace": "fleet",
			"cluster.x-k8s.io/owner-kind": "MachinePool",
			"cluster.x-k8s.io/owner-name": "prod-mp-0",
		},
	},
	"spec": {"providerID": eks_pid},
}

eks_machine_pool := {
	"apiVersion": "cluster.x-k8s.io/v1beta2",
	"kind": "MachinePool",
	"metadata": {"namespace": "fleet", "name": "prod-mp-0", "labels": {"cluster.x-k8s.io/cluster-name": "prod"}},
	"spec": {
		"clusterName": "prod",
		"providerIDList": ["aws:///us-west-2a/i-0a1b2c3d4e5f60000", eks_pid],
		"template": {"spec": {
			"clusterName": "prod",
			"bootstrap": {"dataSecretName": ""},
			"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "AWSManagedMachinePool", "name": "prod-mp-0"},
		}},
	},
}

eks_managed_pool := {
	"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
	"kind": "AWSManagedMachinePool",
	"metadata": {"namespace": "fleet", "name": "prod-mp-0", "labels": {"cluster.x-k8s.io/cluster-name": "prod"}},
	"spec": {"eksNodegroupName": "fleet_prod-mp-0", "providerIDList": ["aws:///us-west-2a/i-0a1b2c3d4e5f60000", eks_pid]},
}

unlisted(obj) := json.patch(obj, [{"op": "replace", "path": "/spec/providerIDList", "value": ["aws:///us-west-2a/i-0a1b2c3d4e5f60000"]}])

test_managed_pool_blocks_through_the_machine_pool_and_itself if {
	d := decide(eks_node, [eks_machine_pool, eks_managed_pool])
	not d.allowed
	d.reason == "blocked"
	blocker_ids(d) == {"AWSManagedMachinePool/fleet/prod-mp-0"}
	link_types(d.blockers[0]) == {"machinePoolProviderIDList", "poolProviderIDList"}
	{l.machine_pool | some l in d.blockers[0].links; l.machine_pool} == {"fleet/prod-mp-0"}
	count(d.messages) == 1
	contains(d.messages[0], "MachinePool fleet/prod-mp-0 (spec.providerIDList) and its spec.providerIDList")
	contains(d.messages[0], "scale the MachinePool down instead")
	contains(d.messages[0], "allowed once neither the MachinePool fleet/prod-mp-0 nor the AWSManagedMachinePool lists providerID")
}

# Cluster API copies the pool's list into the MachinePool on its reconcile: the
# MachinePool may still list an instance its pool already dropped, and the
# other way round. Either list blocks.
test_either_list_blocks if {
	d := decide(eks_node, [eks_machine_pool, unlisted(eks_managed_pool)])
	not d.allowed
	link_types(d.blockers[0]) == {"machinePoolProviderIDList"}
	contains(d.messages[0], "once the MachinePool fleet/prod-mp-0 no longer lists")
	e := decide(eks_node, [unlisted(eks_machine_pool), eks_managed_pool])
	not e.allowed
	link_types(e.blockers[0]) == {"poolProviderIDList"}
}

test_listed_by_neither_is_allowed if {
	d := decide(eks_node, [unlisted(eks_machine_pool), unlisted(eks_managed_pool)])
	d.allowed
	d.reason == "no-link"
}

# The pool kind is not synced: its absence proves nothing.
test_machine_pool_whose_pool_kind_is_not_synced_is_unverified if {
	d := decide_with(eks_node, [eks_machine_pool], {"infraMachinePoolKinds": []})
	not d.allowed
	d.reason == "unverified"
	d.unverified[0].kind == "AWSManagedMachinePool"
	d.unverified[0].links == [{"type": "machinePoolProviderIDList", "machine_pool": "fleet/prod-mp-0"}]
	contains(d.messages[0], "to infraMachinePoolKinds and to the sync config")
	decide_with(eks_node, [eks_machine_pool], {"infraMachinePoolKinds": [], "allowUnverifiedKinds": true}).allowed
}

# A synced pool kind whose object is gone: nothing left runs the instance.
test_machine_pool_whose_pool_is_gone_is_allowed if {
	decide(eks_node, [eks_machine_pool]).allowed
}

test_machine_pool_v1beta1_reference if {
	mp := json.patch(eks_machine_pool, [
		{"op": "replace", "path": "/apiVersion", "value": "cluster.x-k8s.io/v1beta1"},
		{"op": "replace", "path": "/spec/template/spec/infrastructureRef", "value": {
			"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "AWSManagedMachinePool",
			"name": "prod-mp-0", "namespace": "fleet",
		}},
	])
	d := decide(eks_node, [mp, unlisted(eks_managed_pool)])
	not d.allowed
	blocker_ids(d) == {"AWSManagedMachinePool/fleet/prod-mp-0"}
}

# A MachinePool outside the core group is no MachinePool of Cluster API's.
test_machine_pool_of_another_group_does_not_link if {
	mp := json.patch(eks_machine_pool, [{"op": "replace", "path": "/apiVersion", "value": "example.com/v1"}])
	decide(eks_node, [mp, unlisted(eks_managed_pool)]).allowed
}

test_scope_excludes_machine_pools_of_other_clusters if {
	mp := json.patch(eks_machine_pool, [{"op": "replace", "path": "/spec/clusterName", "value": "other"}])
	mp2 := json.patch(mp, [{"op": "replace", "path": "/metadata/labels/cluster.x-k8s.io~1cluster-name", "value": "other"}])
	decide_with(eks_node, [mp2, unlisted(eks_managed_pool)], {"clusterName": "prod", "clusterNamespace": "fleet"}).allowed
	not decide_with(eks_node, [eks_machine_pool, unlisted(eks_managed_pool)], {"clusterName": "prod", "clusterNamespace": "fleet"}).allowed
}

# --- MachinePool Machines --------------------------------------------------------

# With MachinePool Machines on, CAPD writes a DockerMachine per instance and
# Cluster API a Machine for it, labelled with the pool's name.
member_node := object.union(pool_node, {"metadata": {"annotations": {"cluster.x-k8s.io/machine": "dev-mp-0-2"}}})

member_machine := {
	"apiVersion": "cluster.x-k8s.io/v1beta2",
	"kind": "Machine",
	"metadata": {
		"namespace": "default", "name": "dev-mp-0-2",
		"labels": {"cluster.x-k8s.io/cluster-name": "dev", "cluster.x-k8s.io/pool-name": "dev-mp-0"},
	},
	"spec": {
		"clusterName": "dev",
		"providerID": "docker:////dev-mp-0-2",
		"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": "dev-mp-0-2"},
	},
	"status": {"nodeRef": {"name": "dev-mp-0-2"}},
}

member_infra := {
	"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
	"kind": "DockerMachine",
	"metadata": {"namespace": "default", "name": "dev-mp-0-2", "labels": {"cluster.x-k8s.io/cluster-name": "dev"}},
	"spec": {"providerID": "docker:////dev-mp-0-2"},
}

dev_machine_pool := {
	"apiVersion": "cluster.x-k8s.io/v1beta2",
	"kind": "MachinePool",
	"metadata": {"namespace": "default", "name": "dev-mp-0", "labels": {"cluster.x-k8s.io/cluster-name": "dev"}},
	"spec": {
		"clusterName": "dev",
		"providerIDList": capd_pool.spec.providerIDList,
		"template": {"spec": {"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachinePool", "name": "dev-mp-0"}}},
	},
}

# The instance's own InfraMachine still exists: it blocks, named once, and the
# pools (whose lists merely lag it) add nothing.
test_pool_member_is_decided_by_its_own_infra_machine if {
	d := decide(member_node, [member_machine, member_infra, dev_machine_pool, capd_pool])
	not d.allowed
	blocker_ids(d) == {"DockerMachine/default/dev-mp-0-2"}
	count(d.messages) == 1
}

# Cluster API's own order: the per-instance InfraMachine is gone, the Machine
# is being deleted, the pools still list the instance until their next
# reconcile. Cluster API's Node delete must be admitted.
test_pool_member_whose_infra_machine_is_gone_is_allowed_while_the_pools_still_list_it if {
	d := decide(member_node, [deleting(member_machine), dev_machine_pool, capd_pool])
	d.allowed
	d.reason == "no-link"
}

# Only a Machine of a pool that carries the Node's providerID speaks for the
# instance: a Machine without the pool label, one with another providerID
# (a Node's annotations can name any Machine), or one in another namespace
# leaves the pools blocking.
test_pool_links_yield_only_to_a_member_with_the_nodes_provider_id if {
	plain := json.remove(member_machine, ["metadata/labels/cluster.x-k8s.io~1pool-name"])
	not decide(member_node, [plain, dev_machine_pool, capd_pool]).allowed
	other := json.patch(member_machine, [{"op": "replace", "path": "/spec/providerID", "value": "docker:////dev-mp-0-1"}])
	d := decide(member_node, [other, dev_machine_pool, capd_pool])
	not d.allowed
	blocker_ids(d) == {"DockerMachinePool/default/dev-mp-0"}
	elsewhere := json.patch(member_machine, [{"op": "replace", "path": "/metadata/namespace", "value": "other"}])
	not decide(member_node, [elsewhere, dev_machine_pool, capd_pool]).allowed
}

# The waiver reads the Machine's providerID through object_fields, so a pool
# member without one is no member.
test_pool_member_without_provider_id_does_not_yield if {
	m := json.remove(member_machine, ["spec/providerID"])
	not decide(member_node, [m, dev_machine_pool, capd_pool]).allowed
}

test_pool_members_need_a_node_provider_id if {
	count(nodeguard._pool_members(json.remove(member_node, ["spec"]), {["Machine", "default", "cluster.x-k8s.io/v1beta2", "dev-mp-0-2"]: {"machineNodeRef"}}, inventory([member_machine]))) == 0
}
