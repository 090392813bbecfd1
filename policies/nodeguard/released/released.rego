# METADATA
# title: Released Nodes
# description: |
#   What nodeguard publishes into a workload cluster whose Cluster is in mode
#   admission-policy, so that a ValidatingAdmissionPolicy there decides Node
#   deletes in the API server, with no call to nodeguard: the Nodes the rule
#   lets anyone delete, by name and UID. The policy looks the verdict up and
#   holds no rule of its own; custom.version is the version of the policy and
#   binding generated from it (constraints/admission-policy/).
# custom:
#   policy: nodeguard
#   kind: ValidatingAdmissionPolicy
#   version: 0.3.0
package nodeguard.released

import data.nodeguard.anyone

# METADATA
# title: Verdict
# description: |
#   {released, blocker}. released: the rule allows deleting the Node for a user
#   with no exemption (anyone.decide), so the host behind it is known to be
#   gone. blocker: for a Node kept while a linked object is being deleted
#   (Cluster API's teardown, when a delete is most likely tried), the rule's
#   messages; else "" (the policy then says how to ask nodeguard why), which
#   keeps what is published small: a running Node is blocked, and says so.
verdict(node, inventory, parameters) := {
	"released": d.allowed,
	"blocker": _blocker(d),
} if {
	d := anyone.decide(node, inventory, parameters)
}

_blocker(d) := concat(" ", d.messages) if {
	not d.allowed
	some b in d.blockers
	b.deleting
} else := ""
