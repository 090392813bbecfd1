# METADATA
# title: Ghost Node criteria
# description: |
#   The host outlived its deletion: a Machine, InfraMachine or pool membership
#   that carried a providerID went away (CAPI's signal that the host is
#   destroyed), yet a Node with that providerID is alive again, linked by
#   nothing. Its kubelet is running: a replacement Pod scheduled next to the
#   process it replaces would duplicate a StatefulSet identity. The caller
#   passes the tombstone of the Node's providerID (a record that what carried
#   it went away), if it holds one; these pure functions say whether the Node
#   is such a ghost, and whether a Node's registration is one. A ghost is
#   never an orphan to delete: deleting it again frees its Pods' identities
#   while the host runs.
# custom:
#   criteria:
#     - title: Its providerID was tombstoned
#       text: >-
#         The Node's spec.providerID is a tombstone's: nodeguard saw the Machine, InfraMachine or pool membership that
#         carried it go away, and the tombstone's window has not passed. Only the providerID counts: Node names are
#         reused (IP-based names for a new instance at the same address), so a name is evidence, never a match.
#     - title: Nothing links it
#       text: >-
#         No Machine links the Node, and the rule allows its delete with nothing linked (no-link): a Machine or
#         InfraMachine carrying the providerID again is a legitimate reuse, not a ghost.
#     - title: It is alive again
#       text: >-
#         It was created after the tombstone's deletedAt (a re-registration), or its Ready condition turned True after
#         it (Ready again), both to the second the API server keeps. A Node Ready since before then is the Node whose
#         deletion was under way, not yet marked NotReady; a time in the same second proves nothing (a Node created
#         and its Machine deleted within one second is no re-registration), and neither does an unknown or unreadable
#         one.
package nodeguard.ghosts

import data.lib.nodeguard
import data.nodeguard.anyone
import data.nodeguard.nodes

# METADATA
# title: Default window
# description: How long a providerID stays tombstoned after what carried it went away.
default_window := "24h"

# METADATA
# title: Verdict
# description: |
#   Whether the Node is a ghost: {node, providerID, ghost, tombstone, kept,
#   reason}. tombstone is {providerID, object, node, deletedAt, until} (object
#   names what went away, node the Node's name then: evidence for the
#   operator), or null; kept lists every criterion that keeps the Node from
#   being one (empty for a ghost); now is RFC 3339.
verdict(node, inventory, parameters, tombstone, now) := {
	"node": object.get(node, nodeguard.node_paths.name, ""),
	"providerID": _pid(node),
	"ghost": count(kept) == 0,
	"tombstone": tombstone,
	"kept": kept,
	"reason": _reason(tombstone, kept),
} if {
	kept := kept_because(node, inventory, parameters, tombstone, now)
}

# METADATA
# title: Kept because
# description: Every criterion that keeps the Node from being a ghost, one sentence each; empty for a ghost.
kept_because(node, inventory, parameters, tombstone, now) := array.concat(
	_kept_but_alive(node, inventory, parameters, tombstone, now),
	_not_alive(node, tombstone),
)

# METADATA
# scope: document
# title: Ghost
# description: |
#   The Node is a ghost (verdict's ghost), the criteria tried cheapest first:
#   the orphan criteria ask it of every Node they judge with a tombstone.
default ghost(_, _, _, _, _) := false

ghost(node, inventory, parameters, tombstone, now) if {
	count(_not_tombstoned(node, tombstone, now)) == 0
	count(_not_alive(node, tombstone)) == 0
	count(_kept_but_alive(node, inventory, parameters, tombstone, now)) == 0
}

# METADATA
# title: Registration
# description: |
#   Whether a Node may register: {allowed, registers, message, verdict}. A
#   registration is a CREATE, or an UPDATE that sets spec.providerID on a Node
#   that had none (an external cloud-controller-manager sets it after the
#   kubelet registered); it is a ghost's when the Node's providerID is
#   tombstoned and nothing links it (a registration is alive by definition).
#   Any other operation registers nothing and is allowed. old is the Node
#   before an UPDATE (null for a CREATE).
registration(operation, node, old, inventory, parameters, tombstone, now) := {
	"allowed": count(kept) > 0,
	"registers": registers,
	"message": _registration_message(node, tombstone, kept),
	"verdict": verdict(node, inventory, parameters, tombstone, now),
} if {
	registers := _registers(operation, node, old)
	kept := _registration_kept(registers, node, inventory, parameters, tombstone, now)
}

default _registers(_, _, _) := false

_registers("CREATE", _, _)

_registers("UPDATE", node, old) if {
	object.get(old, nodeguard.node_paths.provider_id, "") == ""
	_pid(node) != ""
}

_registration_kept(false, _, _, _, _, _) := ["it registers nothing: not a CREATE, nor an UPDATE setting spec.providerID"]

_registration_kept(true, node, inventory, parameters, tombstone, now) := _kept_but_alive(node, inventory, parameters, tombstone, now)

_registration_message(node, tombstone, kept) := "" if {
	count(kept) > 0
} else := concat(" ", [
	sprintf(
		"nodeguard: Node %q may not register: %s, and nothing links it: Cluster API believes its host destroyed, yet a kubelet runs there.",
		[object.get(node, nodeguard.node_paths.name, ""), _evidence(tombstone)],
	),
	sprintf("Stop the host; if it is meant to rejoin, clear the tombstone (nodeguard ghosts --clear %s).", [tombstone.providerID]),
])

# The criteria but "alive": a registration is alive by definition.
_kept_but_alive(node, inventory, parameters, tombstone, now) := array.flatten([
	_not_tombstoned(node, tombstone, now),
	[sprintf("Machine %s links it", [m.machine]) | some m in nodeguard.linked_machines(node, inventory, parameters)],
	_linked(anyone.decide(node, inventory, parameters)),
])

_pid(node) := object.get(node, nodeguard.node_paths.provider_id, "")

_not_tombstoned(node, tombstone, now) := ["it has no spec.providerID"] if {
	_pid(node) == ""
} else := ["no tombstone holds its providerID"] if {
	not is_object(tombstone)
} else := [sprintf("the tombstone is of providerID %q, not the Node's", [tombstone.providerID])] if {
	tombstone.providerID != _pid(node)
} else := [sprintf("the tombstone of %s ended at %s", [tombstone.object, tombstone.until])] if {
	not _before(now, tombstone.until)
} else := []

# Undefined when a time cannot be parsed: an unreadable window ends nothing
# early and starts nothing; the caller's tombstone is then kept.
_before(a, b) if time.parse_rfc3339_ns(a) < time.parse_rfc3339_ns(b)

# Undefined when a time cannot be parsed: an unknown time proves nothing alive.
# To the second: the API server keeps Node times in seconds.
_after(a, b) if _second(a) > _second(b)

_second(t) := floor(time.parse_rfc3339_ns(t) / 1000000000)

_linked(d) := [sprintf("the rule would not allow deleting it (%s): something links it", [d.reason])] if {
	d.reason != "no-link"
} else := []

# Without a tombstone there is no time to be alive after: criterion 1 says so.
_not_alive(node, tombstone) := [] if {
	not is_object(tombstone)
} else := [] if {
	_after(nodes.created(node), tombstone.deletedAt)
} else := [] if {
	_after(nodes.ready_since(node), tombstone.deletedAt)
} else := ["it was not created after the tombstone and has not turned Ready since"]

_reason(tombstone, kept) := "" if {
	count(kept) > 0
} else := sprintf("%s, and a Node with it is alive again with nothing linking it: its host was not destroyed", [_evidence(tombstone)])

_evidence(tombstone) := sprintf(
	"providerID %q was carried by %s, deleted at %s (the Node was %q then)",
	[tombstone.providerID, tombstone.object, tombstone.deletedAt, tombstone.node],
)
