# The nodeguard link model: how objects are linked to a Node, declared once. The rule follows these
# declarations, and so does the enforcer: what it caches of each object,
# its indexes, the candidates it picks for a Node and the references its
# fresh reads follow are all derived from link_model (enforcer/linkmodel).
# A new link is one entry in the group of its role, plus its tests.
package lib.nodeguard

# METADATA
# title: Links
# description: |
#   Each link holds when every node field of the Node is a non-empty string and
#   the object's fields match it, pairwise: "equal" (each object field equals
#   the Node field in the same position) or "contains" (the one object field is
#   a list holding the Node field). role is what the object is: a Machine (it
#   blocks the InfraMachine its reference names), an InfraMachine or an
#   InfraMachinePool of a synced kind (it blocks itself). when, blocks and
#   phrase are what people read: docs/policy.md and the denial messages.
#   They are grouped by role (machine_links, infra_machine_links,
#   infra_machine_pool_links): the rule reads each group where it looks for
#   objects of that role, without filtering the whole list on every decision.
links := array.flatten([machine_links, infra_machine_links, infra_machine_pool_links])

# METADATA
# title: Machine links
# description: The links whose objects are Machines (role Machine).
machine_links := [
	{
		"type": "machineNodeRef",
		"role": "Machine",
		"node": [["metadata", "name"]],
		"fields": [["status", "nodeRef", "name"]],
		"match": "equal",
		"when": "a Machine's status.nodeRef.name is the Node's name",
		"blocks": "the InfraMachine the Machine's spec.infrastructureRef names",
		"phrase": "status.nodeRef",
	},
	{
		"type": "machineProviderID",
		"role": "Machine",
		"node": [["spec", "providerID"]],
		"fields": [["spec", "providerID"]],
		"match": "equal",
		"when": "a Machine's spec.providerID is the Node's spec.providerID",
		"blocks": "the InfraMachine the Machine's spec.infrastructureRef names",
		"phrase": "spec.providerID",
	},
	{
		# Anyone who may update the Node can edit its annotations, so like every
		# link this one only ever adds blockers.
		"type": "nodeAnnotation",
		"role": "Machine",
		"node": [
			["metadata", "annotations", "cluster.x-k8s.io/cluster-namespace"],
			["metadata", "annotations", "cluster.x-k8s.io/machine"],
		],
		"fields": [["metadata", "namespace"], ["metadata", "name"]],
		"match": "equal",
		"when": "the Node's cluster.x-k8s.io/machine and cluster.x-k8s.io/cluster-namespace annotations name a Machine",
		"blocks": "that Machine's InfraMachine (annotations only ever add blockers: anyone who may update the Node can edit them)",
		"phrase": "named by the Node's cluster.x-k8s.io/machine annotation",
	},
]

# METADATA
# title: InfraMachine links
# description: The links whose objects are InfraMachines of a synced kind (role InfraMachine).
infra_machine_links := [
	{
		"type": "infraProviderID",
		"role": "InfraMachine",
		"node": [["spec", "providerID"]],
		"fields": [["spec", "providerID"]],
		"match": "equal",
		"when": "an InfraMachine of a synced kind has the Node's spec.providerID as its own spec.providerID",
		"blocks": "that InfraMachine, even with no Machine (an orphan)",
		"phrase": "its own spec.providerID",
	},
]

# METADATA
# title: InfraMachinePool links
# description: The links whose objects are InfraMachinePools of a synced pool kind (role InfraMachinePool).
infra_machine_pool_links := [
	{
		"type": "poolProviderIDList",
		"role": "InfraMachinePool",
		"node": [["spec", "providerID"]],
		"fields": [["spec", "providerIDList"]],
		"match": "contains",
		"when": "an InfraMachinePool of a synced pool kind lists the Node's spec.providerID in spec.providerIDList",
		"blocks": "that pool, until it stops listing the Node",
		"phrase": "its spec.providerIDList",
	},
]

# METADATA
# title: Link model
# description: |
#   Everything the rule reads of Nodes and of the objects linked to them: links,
#   machine_kind (the Machines' group and kind), node_fields and object_fields. The enforcer
#   reads this document, from the policy it runs, and keeps exactly these
#   fields.
link_model := object.union(object_fields, {"links": links, "machine_kind": machine_kind, "node_fields": node_fields})

# METADATA
# title: Node fields
# description: |
#   Every field the rule reads of a Node: its name and each link's Node
#   fields, sorted. The enforcer decodes a Node into exactly these, and the
#   key Gatekeeper sends nodeguard's external data provider carries exactly
#   these (provider.rego).
node_fields := sort({path |
	some path in array.concat([["metadata", "name"]], [p | some link in links; some p in link.node])
})

# METADATA
# title: Object fields
# description: |
#   The fields the rule reads of linked objects besides the links' own:
#   reference, the Machine field naming its InfraMachine (an object reference:
#   apiGroup or apiVersion, kind, name, optional namespace); deletion_timestamp
#   (being deleted still blocks); cluster_label and cluster_name (the cluster
#   scope; cluster_name of Machines only).
object_fields := {
	"reference": ["spec", "infrastructureRef"],
	"deletion_timestamp": ["metadata", "deletionTimestamp"],
	"cluster_label": ["metadata", "labels", "cluster.x-k8s.io/cluster-name"],
	"cluster_name": ["spec", "clusterName"],
}

# METADATA
# title: Machine kind
# description: The group and kind of Cluster API's Machines.
machine_kind := {"group": "cluster.x-k8s.io", "kind": "Machine"}
