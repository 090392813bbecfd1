# METADATA
# title: nodeguard rule library
# description: |
#   A Node may be deleted only when no InfraMachine linked to it still exists.
#   Pure functions over (review, inventory, parameters); the inventory has
#   Gatekeeper's layout: inventory.namespace[ns][groupVersion][Kind][name].
#   Every runtime (Gatekeeper, the enforcer, the OPA bundle) calls decide/3.
#   The links it follows are declared in links.rego.
# custom:
#   semantics:
#     - title: Deleting objects
#       text: An InfraMachine with a deletionTimestamp still exists, so it still blocks; its host may still run.
#     - title: Unverified kinds
#       text: >-
#         A linked Machine whose InfraMachine kind is not in infraMachineKinds (not synced) proves nothing by
#         its absence, so the delete is denied unless allowUnverifiedKinds is true.
#     - title: Exemptions
#       text: >-
#         A user in exemptUsers, or in a group of exemptGroups, is allowed; the enforcer's answer carries a
#         warning naming what was bypassed (Gatekeeper cannot warn on an allowed request).
#     - title: Cluster scope
#       text: >-
#         With clusterName/clusterNamespace set, only Machines and InfraMachines of that CAPI Cluster count;
#         an InfraMachine without a cluster-name label still counts (fail closed). A Node whose
#         cluster.x-k8s.io/cluster-name or cluster-namespace annotation names another Cluster is denied
#         (misrouted): its Machines are not this Cluster's, so their absence here proves nothing.
#     - title: MachinePools and managed pools
#       text: >-
#         A MachinePool listing the Node's providerID in spec.providerIDList blocks the pool its
#         spec.template.spec.infrastructureRef names (an EKS, AKS or GKE managed pool has no Machine per instance);
#         the pool listing it blocks too, so either list blocks until Cluster API drops the instance from both. A
#         pool kind that is not synced makes the MachinePool's Node unverified.
#     - title: MachinePool Machines
#       text: >-
#         Where a Machine of a pool (label cluster.x-k8s.io/pool-name) in the pool's namespace carries the Node's
#         providerID, the pool links yield and that Machine's InfraMachine decides: Cluster API deletes such a Node
#         once the instance's InfraMachine is gone, while the pools still list it until their next reconcile. After
#         that Machine is gone too, a Node the pools still list stays blocked until they drop it.
#     - title: What is judged
#       text: >-
#         Only DELETE of a core Node. Other operations, other kinds and audit reviews (no operation) are allowed.
#         A DELETE without the Node (no oldObject or object) is denied.
package lib.nodeguard

# METADATA
# title: Decide
# description: |
#   The decision for one admission review: allowed; reason, one word for why
#   (no-link, exempt or not-judged when allowed; blocked, unverified,
#   misrouted or unjudgeable when denied); blockers (linked InfraMachines or pools that
#   still exist); unverified (linked Machines' InfraMachines of a kind not
#   synced); messages (one sentence per blocker and unverified kind, when
#   denied, and findings: each message with its details, see denial);
#   warnings (what an exempt user bypassed). Read top to bottom: a
#   request that is no Node DELETE is not judged; for a Node, the links
#   (links.rego) give the objects that could keep its host alive, and the
#   verdict follows from what still exists; a Node DELETE that cannot be
#   judged is denied (fail closed: a Node we cannot see might be linked to
#   anything).
decide(review, inventory, parameters) := {
	"allowed": true, "reason": "not-judged",
	"blockers": [], "unverified": [], "messages": [], "warnings": [],
} if {
	not judged(review)
} else := _judge(review, node, name, inventory, _effective(parameters)) if {
	node := _node(review)
	name := object.get(node, node_paths.name, null)
	is_string(name)
} else := denial("unjudgeable", [{
	"message": sprintf(
		"Node %q cannot be judged: the DELETE request carries no oldObject, so nodeguard cannot tell which InfraMachines are linked to it; retry the delete.",
		[object.get(review, "name", "")],
	),
	"details": {},
}])

# METADATA
# title: Denial
# description: |
#   A denied decision for reason: its findings are what it says, each a
#   message and the details a Gatekeeper violation carries (the blocker, the
#   unverified kind, the provider's error), paired where they are made.
denial(reason, findings) := {
	"allowed": false, "reason": reason,
	"blockers": [], "unverified": [], "warnings": [],
	"messages": [f.message | some f in findings], "findings": findings,
}

# METADATA
# title: Violations
# description: |
#   A Gatekeeper entry point's violations for a decision: one per finding of
#   a denial, its message and details.
violations(decision) := {{"msg": f.message, "details": f.details} |
	not decision.allowed
	some f in decision.findings
}

# A Node on the wrong Cluster's route is misrouted; any other is judged by
# its links.
_judge(review, node, name, inventory, params) := _misrouted_verdict(name, sentence, object.get(review, "userInfo", {}), params) if {
	sentence := _misrouted(name, node, params)
} else := verdict if {
	# Each link is [key, how]: the key names an InfraMachine or pool, how says
	# by which link.
	links := _links(node, _active_links(node), inventory, params)
	found := {key: _lookup(inventory, key) | some [key, _] in links}
	blockers := [_blocker(key, obj, links) | some key, [obj] in found]
	unverified := _unverified(found, links, params)
	findings := array.concat(
		[{"message": _blocker_sentence(name, object.get(node, node_paths.provider_id, ""), b), "details": {"blocker": b}} | some b in blockers],
		[{"message": _unverified_sentence(name, u), "details": {"unverified": u}} | some u in unverified],
	)
	verdict := _verdict(name, blockers, unverified, findings, object.get(review, "userInfo", {}), params)
}

# METADATA
# title: Judged
# description: |
#   Only DELETE of a core Node is judged; other operations, other kinds and
#   audit reviews (which carry no operation) yield no violation.
judged(review) if {
	review.operation == "DELETE"
	review.kind.kind == "Node"
	object.get(review.kind, "group", "") == ""
}

# Nothing linked still exists: allowed. Something does (or cannot be proven
# gone) but the user is exempt: allowed, with a warning saying what was
# bypassed. Otherwise denied, blocked first.
_verdict(name, blockers, unverified, findings, user, params) := {
	"allowed": true, "reason": "no-link",
	"blockers": blockers, "unverified": unverified, "messages": [], "warnings": [],
} if {
	count(findings) == 0
} else := {
	"allowed": true, "reason": "exempt",
	"blockers": blockers, "unverified": unverified, "messages": [],
	"warnings": [sprintf(
		"nodeguard: %s is exempt, so the delete of Node %q was allowed although it would be denied: %s",
		[exempt_by, name, concat(" ", [f.message | some f in findings])],
	)],
} if {
	exempt_by := _exempt_by(user, params)
	exempt_by != ""
} else := {
	# denial's shape, written out: the rule's hot path (one call fewer).
	"allowed": false, "reason": _denied_because[count(blockers) > 0],
	"blockers": blockers, "unverified": unverified, "warnings": [],
	"messages": [f.message | some f in findings], "findings": findings,
}

_denied_because := {true: "blocked", false: "unverified"}

# A Node judged on a Cluster's route whose Cluster API annotations name
# another Cluster: the webhook configuration sends it to the wrong Machines.
_misrouted(name, node, params) := sentence if {
	params.clusterName != ""
	namespace := object.get(node, node_paths.cluster_namespace, params.clusterNamespace)
	cluster := object.get(node, node_paths.cluster_name, params.clusterName)
	_another_cluster(namespace, cluster, params)
	sentence := concat("", [
		sprintf("Node %q is Cluster %s/%s's (its cluster.x-k8s.io annotations say so), ", [name, namespace, cluster]),
		sprintf("but this review came on the route of Cluster %s/%s, whose Machines are not its own; ", [params.clusterNamespace, params.clusterName]),
		"fix that workload cluster's webhook configuration (nodeguard serve --fleet keeps it right).",
	])
}

_another_cluster(_, cluster, params) if cluster != params.clusterName

_another_cluster(namespace, _, params) if {
	params.clusterNamespace != ""
	namespace != params.clusterNamespace
}

# Misrouted is denied as blocked is: an exempt user still passes, warned.
_misrouted_verdict(name, sentence, user, params) := v if {
	v := _verdict(name, [], [], [{"message": sentence, "details": {}}], user, params)
	v.allowed
} else := denial("misrouted", [{"message": sentence, "details": {}}])

_exempt_by(user, params) := sprintf("user %q", [user.username]) if {
	user.username in params.exemptUsers
} else := sprintf("group %q", [min(groups)]) if {
	# The first exempt group in order, so a user in several gets one answer.
	groups := {group | some group in object.get(user, "groups", []); group in params.exemptGroups}
	count(groups) > 0
} else := ""

# On DELETE the API server sends the Node as oldObject; Gatekeeper also copies
# it to object.
_node(review) := review.oldObject if {
	count(object.get(review, "oldObject", {})) > 0
} else := review.object if {
	count(object.get(review, "object", {})) > 0
}

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

# --- Links -------------------------------------------------------------------

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

# --- Blockers and unverified kinds ---------------------------------------------

_blocker(key, found, links) := object.union(key, {
	"version": found.version,
	"deleting": _deleting(found.obj),
	"links": _links_of(links, key),
})

# The inventory keys objects by groupVersion; a reference's version may differ
# from the synced one, so match on group and take the lowest synced version
# when several are synced. [] when nothing is synced under the key.
_lookup(inventory, key) := [{"version": version, "obj": inventory.namespace[key.namespace][gv][key.kind][key.name]}] if {
	synced := {[_version(gv), gv] |
		some gv
		inventory.namespace[key.namespace][gv][key.kind][key.name]
		_group(gv) == key.group
	}
	count(synced) > 0
	[version, gv] := min(synced)
} else := []

_version(gv) := split(gv, "/")[1] if {
	contains(gv, "/")
} else := gv

# An object a referrer references that is absent proves nothing when its
# kind is not synced (as an InfraMachine or a pool kind): deny unless the
# parameters opt out. (Only a referrer's link can name an object that is
# absent: the others found it.)
_unverified(found, links, params) := [] if {
	params.allowUnverifiedKinds == true
} else := [object.union(key, {"links": _links_of(links, key)}) |
	some key, hits in found
	hits == []
	not _synced(key, params.infraMachineKinds)
	not _synced(key, params.infraMachinePoolKinds)
]

# Sets iterate in sorted order, so the links of a key come out stable.
_links_of(links, key) := [link | some [k, link] in links; k == key]

_deleting(obj) if {
	object.get(obj, object_fields.deletion_timestamp, false) != false
} else := false

_synced(key, kinds) if {
	some kind in kinds
	kind.group == key.group
	kind.kind == key.kind
}

# --- Messages ------------------------------------------------------------------

_blocker_sentence(node_name, pid, b) := sprintf(
	"Node %q cannot be deleted: %s %s/%s (%s) %s, linked by %s; %s.",
	[node_name, b.kind, b.namespace, b.name, b.group, _state[b.deleting], _links_phrase(b.links), _advice(pid, b)],
)

_state := {true: "is being deleted but still exists", false: "still exists"}

# What to do next depends on who owns the host: a Machine, a pool, or nobody.
_advice(pid, b) := "its host may still be running: wait until it is gone, then delete the Node" if {
	b.deleting
} else := sprintf("delete Machine %s instead; Cluster API deletes the Node once the %s is gone", [concat(" and ", machines), b.kind]) if {
	# Several Machines may reference one InfraMachine: name them all, in order.
	machines := {link.machine | some link in b.links; link.machine}
	count(machines) > 0
} else := sprintf("scale the MachinePool down instead; the delete is allowed once %s providerID %q", [_no_longer_listed(b), pid]) if {
	some link in b.links
	_link_role[link.type] in {"MachinePool", "InfraMachinePool"}
} else := sprintf("delete the %s first, then the Node", [b.kind])

# Who lists the Node: the MachinePools that do, then the pool itself if it does.
_no_longer_listed(b) := sprintf("the %s no longer lists", [listers[0]]) if {
	listers := _pool_listers(b)
	count(listers) == 1
} else := sprintf("neither the %s lists", [concat(" nor the ", _pool_listers(b))])

_pool_listers(b) := array.concat(
	[sprintf("MachinePool %s", [mp]) | some mp in {link.machine_pool | some link in b.links; link.machine_pool}],
	[b.kind | some link in b.links; _link_role[link.type] == "InfraMachinePool"],
)

_unverified_sentence(node_name, u) := sprintf(
	"Node %q cannot be deleted: it is linked by %s to %s %s/%s of group %q, a kind nodeguard does not see, so nodeguard cannot prove that host is gone; %s.",
	[node_name, _links_phrase(u.links), u.kind, u.namespace, u.name, u.group, _unverified_advice(u)],
)

_unverified_advice(u) := sprintf(
	"add {group: %q, kind: %q} to %s and to the sync config, or set allowUnverifiedKinds: true",
	[u.group, u.kind, concat(" or ", sort({r.kinds | some l in u.links; some r in referrers; l[r.by]}))],
)

# One phrase per referrer (naming each of its links; Machines first), then the
# direct links.
_links_phrase(links) := concat(" and ", array.concat(
	# regal ignore:external-reference
	[sprintf("%s %s (%s)", [r.kind, owner, concat(", ", [_link_phrase[l.type] | some l in links; l[r.by] == owner])]) |
		# regal ignore:external-reference
		some r in referrers
		some owner in {l[r.by] | some l in links; l[r.by]}
	],
	# regal ignore:external-reference
	[_link_phrase[l.type] | some l in links; object.keys(l) == {"type"}],
))

# Complete rules, so each is built once per decision, not once per lookup.
# regal ignore:prefer-set-or-object-rule
_link_phrase := {link.type: link.phrase | some link in links}

# regal ignore:prefer-set-or-object-rule
_link_role := {link.type: link.role | some link in links}
