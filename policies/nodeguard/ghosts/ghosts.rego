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
#   is such a ghost. A ghost is never an orphan to delete: deleting it again
#   frees its Pods' identities while the host runs.
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
#     - title: It is alive
#       text: >-
#         Its Ready condition is True, or it was created at or after the tombstone (a re-registration not yet Ready).
package nodeguard.ghosts

import data.lib.nodeguard
import data.nodeguard.anyone
import data.nodeguard.orphans

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
	"providerID": object.get(node, nodeguard.node_paths.provider_id, ""),
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
kept_because(node, inventory, parameters, tombstone, now) := array.flatten([
	_not_tombstoned(node, tombstone, now),
	[sprintf("Machine %s links it", [m.machine]) | some m in nodeguard.linked_machines(node, inventory, parameters)],
	_linked(anyone.decide(node, inventory, parameters)),
	_not_alive(node, tombstone),
])

_pid(node) := object.get(node, nodeguard.node_paths.provider_id, "")

_not_tombstoned(node, tombstone, now) := ["it has no spec.providerID"] if {
	_pid(node) == ""
} else := ["no tombstone holds its providerID"] if {
	not _is_object(tombstone)
} else := [sprintf("the tombstone is of providerID %q, not the Node's", [tombstone.providerID])] if {
	tombstone.providerID != _pid(node)
} else := [sprintf("the tombstone of %s ended at %s", [tombstone.object, tombstone.until])] if {
	not _before(now, tombstone.until)
} else := []

_is_object(x) if is_object(x)

# Undefined when a time cannot be parsed: an unreadable window ends nothing
# early and starts nothing; the caller's tombstone is then kept.
_before(a, b) if time.parse_rfc3339_ns(a) < time.parse_rfc3339_ns(b)

_linked(d) := [sprintf("the rule would not allow deleting it (%s): something links it", [d.reason])] if {
	d.reason != "no-link"
} else := []

_not_alive(node, tombstone) := [] if {
	orphans.ready(node)
} else := [] if {
	created := object.get(node, orphans.node_fields.fields.created, "")
	not _before(created, tombstone.deletedAt)
	created != ""
} else := ["it is not Ready and was not created after the tombstone"]

_reason(tombstone, kept) := "" if {
	count(kept) > 0
} else := sprintf(
	"providerID %q was carried by %s, gone since %s (the Node was %q then), and a Node with it is alive again with nothing linking it: its host was not destroyed",
	[tombstone.providerID, tombstone.object, tombstone.deletedAt, tombstone.node],
)
