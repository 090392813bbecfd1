# METADATA
# title: Orphan Node criteria
# description: |
#   The second half of the rule: a Node should go once its InfraMachine is gone.
#   Cluster API deletes a Node once, about 10 s after its Machine's deletion
#   started (cluster-api #14024); a denial at that moment, or a Machine deleted
#   before it got its nodeRef (#7237), leaves the Node behind for good. These
#   pure functions say which Nodes are such orphans, calling the rule's own
#   link functions; `nodeguard orphans` and `nodeguard serve --reap-orphan-nodes`
#   evaluate them. Not part of the Gatekeeper template: they judge no request.
# custom:
#   criteria:
#     - title: Managed by Cluster API
#       text: >-
#         The Node carries the cluster.x-k8s.io/machine and cluster.x-k8s.io/cluster-namespace annotations CAPI writes;
#         judged for one Cluster (clusterName/clusterNamespace), its cluster annotations must not name another.
#     - title: Its Machine is gone
#       text: >-
#         The Machine those annotations name does not exist, and no other Machine links the Node by status.nodeRef
#         or spec.providerID (a Machine being deleted still exists: the Node is CAPI's to delete).
#     - title: The rule allows deleting it
#       text: >-
#         anyone.decide/3 allows the delete for a user with no exemption: no linked InfraMachine or pool exists (being
#         deleted still counts) and no linked kind is unverified. And since, with the Machine gone, nothing says
#         which kind the InfraMachine was, the Node has a spec.providerID whose scheme an InfraMachine of a synced
#         kind in the cluster uses (labelled for it when a cluster is named): else an InfraMachine of a kind
#         nodeguard does not see could still carry it.
#     - title: Not Ready for the grace period
#       text: >-
#         Its Ready condition is not True and last changed at least the grace period ago (default 5m); a Node without
#         a Ready condition counts from its creationTimestamp; an unknown or unreadable time keeps the Node.
#     - title: Not a ghost
#       text: >-
#         The Node is not a ghost (nodeguard.ghosts): a Node alive again with the providerID of a Machine,
#         InfraMachine or pool membership that went away is a host that outlived its deletion, and deleting its Node
#         again would free its Pods' identities while it runs.
#     - title: Wider match (opt-in, off by default)
#       text: >-
#         With matchProviderID, a Node without CAPI's annotations also counts as managed when it has a
#         spec.providerID whose scheme (the part before ://) is the scheme of an InfraMachine of a synced kind in
#         the cluster (labelled for it when a cluster is named), and no Machine, InfraMachine or pool carries that
#         providerID (cluster-api #7237, cluster-api-provider-metal3 #890). The other criteria still apply.
package nodeguard.orphans

import data.lib.nodeguard
import data.nodeguard.anyone
import data.nodeguard.ghosts
import data.nodeguard.nodes

# METADATA
# title: Default grace period
# description: How long a Node must have been not Ready before it can be an orphan.
default_grace := "5m"

# METADATA
# title: Verdict
# description: |
#   Whether the Node is an orphan, and why or why not: {node, orphan, managed,
#   cluster, machine, notReadySince, reason, kept}. kept lists every criterion
#   that keeps the Node (empty for an orphan); reason says why an orphan is one.
#   now is RFC 3339, grace a Go duration ("5m"); tombstone is the one of the
#   Node's providerID, or null (nodeguard.ghosts).
verdict(node, inventory, parameters, now, grace, match_provider_id, tombstone) := {
	"node": object.get(node, nodeguard.node_paths.name, ""),
	"orphan": count(kept) == 0,
	"managed": managed(node),
	"cluster": cluster(node),
	"machine": annotated_machine(node),
	"notReadySince": since,
	"reason": _orphan_reason(node, since, grace, kept),
	"kept": kept,
} if {
	since := nodes.not_ready_since(node)
	kept := kept_because(node, inventory, parameters, now, grace, match_provider_id, tombstone)
}

# METADATA
# scope: document
# title: Managed by Cluster API
# description: The Node carries CAPI's cluster.x-k8s.io/machine and cluster.x-k8s.io/cluster-namespace annotations.
default managed(_) := false

managed(node) if {
	object.get(node, nodeguard.node_paths.machine, "") != ""
	object.get(node, nodeguard.node_paths.cluster_namespace, "") != ""
}

# METADATA
# title: Cluster of a managed Node
# description: '"namespace/name" of the CAPI Cluster the Node''s annotations name, or "".'
cluster(node) := concat("/", [ns, name]) if {
	ns := object.get(node, nodeguard.node_paths.cluster_namespace, "")
	ns != ""
	name := object.get(node, nodes.node_fields.fields.cluster_name, "")
	name != ""
} else := ""

# METADATA
# title: Machine a managed Node names
# description: '"namespace/name" of the Machine the Node''s annotations name, or "".'
annotated_machine(node) := concat("/", [
	object.get(node, nodeguard.node_paths.cluster_namespace, ""),
	object.get(node, nodeguard.node_paths.machine, ""),
]) if {
	managed(node)
} else := ""

# METADATA
# title: Grace passed
# description: |
#   since is at least grace before now. Undefined when a time or the duration
#   cannot be parsed, so an unreadable clock keeps the Node.
grace_passed(since, now, grace) if {
	since != ""
	time.parse_rfc3339_ns(now) - time.parse_rfc3339_ns(since) >= time.parse_duration_ns(grace)
}

# METADATA
# title: Provider ID match
# description: |
#   The opt-in wider match: a Node without CAPI's annotations whose providerID
#   scheme is in use in the cluster (scheme_in_use). Whether anything carries
#   the providerID itself is left to the other criteria.
provider_id_match(node, inventory, parameters) if {
	not managed(node)
	scheme_in_use(object.get(node, nodeguard.node_paths.provider_id, ""), inventory, parameters)
}

# METADATA
# title: Provider ID scheme in use
# description: |
#   An InfraMachine of a synced kind in the cluster has a providerID of the same
#   scheme as pid: the provider's kind is synced, so the absence of an
#   InfraMachine carrying pid itself proves something.
scheme_in_use(pid, inventory, parameters) if {
	scheme := provider_id_scheme(pid)
	some kind in object.union(nodeguard.default_parameters, parameters).infraMachineKinds
	some ns, gv, name
	obj := inventory.namespace[ns][gv][kind.kind][name]
	startswith(gv, concat("", [kind.group, "/"]))
	provider_id_scheme(object.get(obj, nodeguard.object_fields.provider_id, "")) == scheme
	_evidence_for_cluster(ns, obj, parameters)
}

# METADATA
# title: Provider ID scheme
# description: The part of a providerID before "://" (aws, docker, metal3, ...); undefined without one.
provider_id_scheme(pid) := scheme if {
	parts := split(pid, "://")
	count(parts) > 1
	scheme := parts[0]
	scheme != ""
}

# Unlike the rule's scope (where an unlabelled InfraMachine counts, failing
# closed), evidence that a cluster uses a scheme must be labelled for that
# cluster: the wider match may only ever find fewer orphans.
_evidence_for_cluster(ns, obj, parameters) if {
	object.get(parameters, "clusterNamespace", "") in {"", ns}
	object.get(parameters, "clusterName", "") in {"", object.get(obj, nodeguard.object_fields.cluster_label, "")}
}

# METADATA
# title: Kept because
# description: |
#   Every criterion that keeps the Node, one sentence each; empty when it is an
#   orphan. Linked Machines and the rule's blockers come from lib.nodeguard.
#   node_passes tries the criteria that read only the Node, the same helpers.
kept_because(node, inventory, parameters, now, grace, match_provider_id, tombstone) := array.flatten([
	_unmanaged(node, match_provider_id),
	_scheme_unmatched(node, inventory, parameters, match_provider_id),
	_other_cluster(node, parameters),
	_ready_reason(node),
	[_machine_reason(m) | some m in nodeguard.linked_machines(node, inventory, parameters)],
	_rule_reasons(anyone.decide(node, inventory, parameters)),
	_no_provider_id(node),
	_scheme_unused(node, inventory, parameters),
	_grace_reason(nodes.not_ready_since(node), now, grace),
	_ghost(node, inventory, parameters, tombstone, now),
])

# METADATA
# scope: document
# title: Passes the Node-only criteria
# description: |
#   No criterion of kept_because that reads only the Node, the parameters and
#   the clock keeps the Node; they are tried cheapest first, so a Ready Node
#   is told at once. A Node that does not pass is no orphan whatever the
#   inventory holds: the enforcer judges the other criteria only for Nodes
#   that pass.
default node_passes(_, _, _, _, _) := false

node_passes(node, parameters, now, grace, match_provider_id) if {
	_passes_but_grace(node, parameters, match_provider_id)
	count(_grace_reason(nodes.not_ready_since(node), now, grace)) == 0
}

# METADATA
# title: Recheck at
# description: |
#   When node_passes may change with the clock alone: the end of the grace
#   period (RFC 3339), when the grace is all that keeps the Node; "" when
#   nothing changes until the Node does.
recheck_at(node, parameters, now, grace, match_provider_id) := time.format(time.parse_rfc3339_ns(since) + time.parse_duration_ns(grace)) if {
	_passes_but_grace(node, parameters, match_provider_id)
	since := nodes.not_ready_since(node)
	count(_grace_reason(since, now, grace)) > 0
} else := ""

_passes_but_grace(node, parameters, match_provider_id) if {
	count(_ready_reason(node)) == 0
	count(_unmanaged(node, match_provider_id)) == 0
	count(_no_provider_id(node)) == 0
	count(_other_cluster(node, parameters)) == 0
}

# Not managed, and the wider match is off.
_unmanaged(node, match_provider_id) := ["it is not managed by Cluster API (no cluster.x-k8s.io/machine and cluster.x-k8s.io/cluster-namespace annotations)"] if {
	not managed(node)
	match_provider_id != true
} else := []

# Not managed, and the wider match finds no scheme in use for it.
_scheme_unmatched(node, inventory, parameters, match_provider_id) := ["it has no CAPI annotations and no InfraMachine in the cluster uses its providerID scheme"] if {
	not managed(node)
	match_provider_id == true
	not provider_id_match(node, inventory, parameters)
} else := []

# Judged for one Cluster, a Node whose annotations name another is not that
# Cluster's to judge: its Machines are out of scope, so their absence proves nothing.
_other_cluster(node, parameters) := [sprintf("it belongs to Cluster %s, not to the Cluster judged", [cluster(node)])] if {
	cluster(node) != ""
	[ns, name] := split(cluster(node), "/")
	some [key, have] in [["clusterNamespace", ns], ["clusterName", name]]
	not object.get(parameters, key, "") in {"", have}
} else := []

# The rule's infraProviderID link sees only synced kinds. With the Machine
# gone, nothing says which kind the Node's InfraMachine was; only when the
# cluster's synced InfraMachines use the Node's providerID scheme does the
# absence of one carrying that providerID prove the host is gone.
_no_provider_id(node) := ["it has no spec.providerID, so nodeguard cannot prove no InfraMachine carries it"] if {
	managed(node)
	object.get(node, nodeguard.node_paths.provider_id, "") == ""
} else := []

_scheme_unused(node, inventory, parameters) := [sprintf(
	"no InfraMachine of a synced kind in the cluster uses providerID scheme %q, so the absence of one carrying %q proves nothing",
	[_scheme_or_empty(pid), pid],
)] if {
	managed(node)
	pid := object.get(node, nodeguard.node_paths.provider_id, "")
	pid != ""
	not scheme_in_use(pid, inventory, parameters)
} else := []

_scheme_or_empty(pid) := provider_id_scheme(pid) if {
	provider_id_scheme(pid)
} else := ""

_ready_reason(node) := ["its Ready condition is True"] if {
	nodes.ready(node)
} else := []

_machine_reason(m) := sprintf("Machine %s is being deleted but still exists (linked by %s)", [m.machine, concat(", ", m.types)]) if {
	m.deleting
} else := sprintf("Machine %s exists (linked by %s)", [m.machine, concat(", ", m.types)])

_rule_reasons(d) := array.concat(
	[sprintf("%s %s/%s %s", [b.kind, b.namespace, b.name, _state[b.deleting]]) | some b in d.blockers],
	[sprintf("%s %s/%s of group %q is not synced, so its absence proves nothing", [u.kind, u.namespace, u.name, u.group]) | some u in d.unverified],
)

# Without a tombstone no Node is a ghost: the call is not made (it costs
# every Node the full criteria judge ~170 allocations).
_ghost(node, inventory, parameters, tombstone, now) := [sprintf("it is a ghost, never an orphan to delete: %s", [v.reason])] if {
	is_object(tombstone)
	ghosts.ghost(node, inventory, parameters, tombstone, now)
	v := ghosts.verdict(node, inventory, parameters, tombstone, now)
} else := []

_state := {true: "is being deleted but still exists", false: "still exists"}

_grace_reason(since, now, grace) := [] if {
	grace_passed(since, now, grace)
} else := ["it has no known not-Ready time (no Ready condition and no creationTimestamp)"] if {
	since == ""
} else := [sprintf("it has been not Ready only since %s, less than the grace period %s before %s", [since, grace, now])]

_orphan_reason(node, since, grace, kept) := "" if {
	count(kept) > 0
} else := _reason(node, since, grace)

_reason(node, since, grace) := sprintf(
	"Machine %s is gone, nothing links an InfraMachine to the Node, and it has not been Ready since %s (grace %s)",
	[annotated_machine(node), since, grace],
) if {
	managed(node)
} else := sprintf(
	"no Machine, InfraMachine or pool carries providerID %q, and it has not been Ready since %s (grace %s)",
	[object.get(node, nodeguard.node_paths.provider_id, ""), since, grace],
)
