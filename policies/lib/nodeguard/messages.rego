# The sentences a denial says: one per blocker and unverified kind, naming the
# Node, what blocks it, how it is linked and what to do.
package lib.nodeguard

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
