# How the declared links (links.rego) are followed for one Node: the links it
# activates, the Machines and pools that refer onward to InfraMachines, the
# objects each link finds, and the cluster scope they must be in.
package lib.nodeguard

# METADATA
# title: Linked Machines
# description: |
#   The Machines in scope linked to the Node by a Machine link (links.rego),
#   as a set of {machine: "namespace/name", types, deleting}, whether or not
#   they reference an InfraMachine. The orphan criteria use it: a Node with a
#   linked Machine is CAPI's to delete, not nodeguard's.
linked_machines(node, inventory, parameters) := {{"machine": concat("/", [ns, name]), "types": sort(types), "deleting": _deleting(machine)} |
	some ["Machine", ns, gv, name], types in _referring(_active_links(node), inventory, _effective(parameters))
	machine := inventory.namespace[ns][gv][referrers.Machine.kind][name]
}

# Written for OPA's evaluator: docs/performance.md, "How the rule is written
# for OPA's evaluator".

# The links whose Node fields are all set, with those values: [link, values].
_active_links(node) := [[link, values] |
	some link in links
	values := [object.get(node, path, "") | some path in link.node]
	not "" in values
]

# The paths are data (links.rego), so they cannot be written as references.
_matches(link, values, obj) if {
	link.match == "equal"
	[object.get(obj, path, null) | some path in link.fields] == values
}

_matches(link, values, obj) if {
	link.match == "contains"
	list := object.get(obj, link.fields[0], null)
	is_array(list)
	values[0] in list
}

# The referrers (Machines, MachinePools) in scope that the active links of
# their role match, by [role, namespace, groupVersion, name], with the types
# of the links that match each.
_referring(active, inventory, params) := {[role, ns, gv, name]: types |
	some role, referrer in referrers
	role_links := [[link, values] | some [link, values] in active; link.role == role]
	count(role_links) > 0
	some ns, gv, name
	obj := inventory.namespace[ns][gv][referrer.kind][name]

	# Gatekeeper scans every Machine: the selective test goes first.
	types := {link.type | some [link, values] in role_links; _matches(link, values, obj)}
	count(types) > 0
	_group(gv) == referrer.group
	_machine_in_scope(ns, obj, params)
}

# Every link found, as [key, how]: through referrers and to objects, less the
# pool links that yield to a pool member.
_links(node, active, inventory, params) := {[key, how] |
	referring := _referring(active, inventory, params)
	members := _pool_members(node, referring, inventory)
	some [key, how] in (_links_through_referrers(referring, inventory) | _links_to_objects(active, inventory, params))
	not _yields(key, how, members)
}

# A referrer's link goes through it to the object its reference names.
_links_through_referrers(referring, inventory) := {[key, {"type": type, referrer.by: concat("/", [ns, name])}] |
	some [role, ns, gv, name], types in referring
	referrer := referrers[role]
	key := _infra_ref(ns, inventory.namespace[ns][gv][referrer.kind][name], referrer.reference)
	some type in types
}

# An InfraMachine or pool link blocks the object itself, if it is of a kind
# its role's parameter says is synced.
_links_to_objects(active, inventory, params) := {[key, {"type": link.type}] |
	some [link, values] in active
	some kind in params[_synced_kinds[link.role]]
	some ns, gv, name
	obj := inventory.namespace[ns][gv][kind.kind][name]
	_matches(link, values, obj)
	_group(gv) == kind.group
	_infra_in_scope(ns, obj, params)
	key := {"group": kind.group, "kind": kind.kind, "namespace": ns, "name": name}
}

_synced_kinds := {"InfraMachine": "infraMachineKinds", "InfraMachinePool": "infraMachinePoolKinds"}

# With Cluster API's MachinePool Machines on, an instance of a pool has a
# Machine and an InfraMachine of its own, and Cluster API deletes its Node
# once that InfraMachine is gone, while the pools' providerIDLists still list
# it until their next reconcile. So in a namespace where a Machine of a pool
# (its pool_name label set) carries the Node's providerID, that Machine's
# links decide and the pool links yield: the namespaces where they do.
_pool_members(node, referring, inventory) := {ns |
	pid := object.get(node, node_paths.provider_id, "")
	pid != ""
	some ["Machine", ns, gv, name], _ in referring
	machine := inventory.namespace[ns][gv][referrers.Machine.kind][name]

	# The path is data (object_fields), so it cannot be written as a reference.
	# regal ignore:superfluous-object-get
	object.get(machine, object_fields.provider_id, null) == pid
	object.get(machine, object_fields.pool_name, "") != ""
}

# A pool link (of a MachinePool or an InfraMachinePool) in such a namespace.
_yields(key, how, members) if {
	key.namespace in members
	_link_role[how.type] in {"MachinePool", "InfraMachinePool"}
}

# v1beta2 refs carry apiGroup and live in the referrer's namespace; v1beta1
# refs carry apiVersion and may name a namespace.
_infra_ref(referrer_ns, obj, path) := {
	"group": _ref_group(ref),
	"kind": ref.kind,
	"namespace": _ref_namespace(ref, referrer_ns),
	"name": ref.name,
} if {
	ref := object.get(obj, path, null)
}

_ref_group(ref) := ref.apiGroup if {
	is_string(ref.apiGroup)
} else := _group(ref.apiVersion)

_ref_namespace(ref, machine_ns) := ref.namespace if {
	ref.namespace != ""
} else := machine_ns

# "group/version" -> group; core "v1" -> "".
_group(gv) := split(gv, "/")[0] if {
	contains(gv, "/")
} else := ""

# --- Cluster scope -------------------------------------------------------------

# A referrer counts when it is in the cluster's namespace and names the
# cluster in spec.clusterName or its cluster-name label.
_machine_in_scope(ns, machine, params) if {
	params.clusterNamespace in {"", ns}
	params.clusterName in {
		"",
		object.get(machine, object_fields.cluster_name, ""),
		object.get(machine, object_fields.cluster_label, ""),
	}
}

# An InfraMachine without a cluster-name label might belong to this cluster,
# so it counts (fail closed); one labelled for another cluster does not.
_infra_in_scope(ns, obj, params) if {
	params.clusterNamespace in {"", ns}
	not _labelled_for_another_cluster(obj, params.clusterName)
}

_labelled_for_another_cluster(obj, cluster) if {
	cluster != ""
	not object.get(obj, object_fields.cluster_label, "") in {"", cluster}
}
