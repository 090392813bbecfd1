# METADATA
# title: Released Nodes
# description: |
#   What nodeguard writes on each Node of a workload cluster whose Cluster is in
#   mode admission-policy, so that a ValidatingAdmissionPolicy there decides Node
#   deletes in the API server, with no call to nodeguard: the verdict, as the
#   annotation custom.released_annotation holding the Node's UID on a Node the
#   rule lets anyone delete, and custom.blocker_annotation holding the rule's
#   messages on a Node kept while a linked object is being deleted. The delete
#   policy (custom.policy) compares the annotation with the Node's UID and holds
#   no rule of its own; the guard policy (custom.guard) lets only nodeguard's
#   identity set, change or remove the annotations. custom.version is the version
#   of the policies and bindings generated from it (constraints/admission-policy/).
# custom:
#   policy: nodeguard-node-delete
#   guard: nodeguard-node-verdicts
#   released_annotation: nodeguard.io/released
#   blocker_annotation: nodeguard.io/blocker
#   kind: ValidatingAdmissionPolicy
#   version: 0.4.0
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
