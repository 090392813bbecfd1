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
