# METADATA
# title: The rule, for anyone
# description: |
#   Whether the host behind a Node is known to be gone, whoever asks: the rule
#   judged for a DELETE by a user with no exemption (an exemption says who may
#   delete, not whether the host is gone). The orphan criteria read it, and so
#   do the released Nodes nodeguard publishes for a workload cluster's
#   ValidatingAdmissionPolicy. Not part of the Gatekeeper templates: it judges
#   no request.
package nodeguard.anyone

import data.lib.nodeguard

# METADATA
# title: Decide
# description: lib.nodeguard.decide for a DELETE of the Node by a user with no exemption.
decide(node, inventory, parameters) := nodeguard.decide(
	{
		"operation": "DELETE",
		"kind": {"group": "", "version": "v1", "kind": "Node"},
		"name": object.get(node, nodeguard.node_paths.name, ""),
		"oldObject": node,
		"userInfo": {"username": "", "groups": []},
	},
	inventory,
	object.union(parameters, {"exemptUsers": [], "exemptGroups": []}),
)
