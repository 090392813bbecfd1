# The nodeguard link model: how objects are linked to a Node, declared once. The rule follows these
# declarations, and so does the enforcer: what it caches of each object,
# its indexes, the candidates it picks for a Node and the references its
# fresh reads follow are all derived from link_model (enforcer/rule).
# A new link is one entry in links, plus its tests.
package lib.nodeguard

# METADATA
# title: Links
# description: |
#   Each link holds when every node field of the Node is a non-empty string and
#   the object's fields match it, pairwise: "equal" (each object field equals
#   the Node field in the same position) or "contains" (the one object field is
#   a list holding the Node field). role is what the object is: a Machine or a
#   MachinePool (a referrer: it blocks what its reference names), an
#   InfraMachine or an InfraMachinePool of a synced kind (it blocks itself).
#   when, blocks and phrase are what people read: docs/policy.md and the
#   denial messages.
links := [
	# One literal, paths written out (docs/performance.md, "How the rule is
	# written for OPA's evaluator").
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
	{
		# A managed pool (EKS, AKS, GKE node groups) has no Machine per
		# instance by default: the MachinePool and its pool are the only
		# objects that know the Node.
		"type": "machinePoolProviderIDList",
		"role": "MachinePool",
		"node": [["spec", "providerID"]],
		"fields": [["spec", "providerIDList"]],
		"match": "contains",
		"when": "a MachinePool's spec.providerIDList lists the Node's spec.providerID",
		"blocks": "the InfraMachinePool the MachinePool's spec.template.spec.infrastructureRef names, until the MachinePool stops listing the Node",
		"phrase": "spec.providerIDList",
	},
]

# METADATA
# title: Referrers
# description: |
#   The Cluster API kinds that block what their reference names, by role: a
#   Machine the InfraMachine of spec.infrastructureRef, a MachinePool the
#   InfraMachinePool of spec.template.spec.infrastructureRef. names is the
#   role of what the reference names (the enforcer watches a referenced kind
#   as that role); kinds the parameter that lists such kinds (the denial's
#   advice); by the key naming the referrer in a blocker's links. A
#   referenced object of a kind no parameter lists as synced proves nothing
#   by its absence.
referrers := {
	"Machine": {
		"group": "cluster.x-k8s.io", "kind": "Machine",
		"reference": ["spec", "infrastructureRef"],
		"names": "InfraMachine", "kinds": "infraMachineKinds", "by": "machine",
	},
	"MachinePool": {
		"group": "cluster.x-k8s.io", "kind": "MachinePool",
		"reference": ["spec", "template", "spec", "infrastructureRef"],
		"names": "InfraMachinePool", "kinds": "infraMachinePoolKinds", "by": "machine_pool",
	},
}

# METADATA
# title: Link model
# description: |
#   Everything the rule reads of Nodes, of the objects linked to them and of
#   the requesting user: links, referrers, machine_kind (the Machines' group
#   and kind), node_fields, node_provider_id (the Node field naming its host:
#   a link on it names the host too, which is what a tombstone remembers),
#   object_fields and group_parameters (parameters.rego). The
#   enforcer reads this document, from the policy it runs, and keeps exactly
#   these fields and the groups those parameters list.
link_model := object.union(object_fields, {
	"links": links,
	"referrers": referrers,
	"machine_kind": machine_kind,
	"node_fields": node_fields,
	"node_provider_id": node_paths.provider_id,
	"group_parameters": group_parameters,
})

# METADATA
# title: Node paths
# description: |
#   The Node fields the rules name: the Node's name, its spec.providerID, and
#   the annotations Cluster API writes naming its Machine (machine), that
#   Machine's namespace (cluster_namespace) and its Cluster's name
#   (cluster_name). The rules read these by name
#   where they read a Node outside a link; links (the declaration itself)
#   write their paths out.
node_paths := {
	"name": ["metadata", "name"],
	"provider_id": ["spec", "providerID"],
	"machine": ["metadata", "annotations", "cluster.x-k8s.io/machine"],
	"cluster_namespace": ["metadata", "annotations", "cluster.x-k8s.io/cluster-namespace"],
	"cluster_name": ["metadata", "annotations", "cluster.x-k8s.io/cluster-name"],
}

# METADATA
# title: Node fields
# description: |
#   Every field the rule reads of a Node: node_paths and each link's Node
#   fields, each once, sorted. The enforcer decodes a Node into exactly these,
#   and the key Gatekeeper sends nodeguard's external data provider carries
#   exactly these (provider.rego).
node_fields := sort({path |
	some path in array.concat([p | some p in node_paths], [p | some link in links; some p in link.node])
})

# METADATA
# title: Object fields
# description: |
#   The fields the rules name of linked objects, besides a referrer's
#   reference (referrers: an object reference, apiGroup or apiVersion, kind,
#   name, optional namespace): deletion_timestamp (being deleted still
#   blocks); cluster_label and cluster_name (the cluster scope; cluster_name of
#   referrers only); provider_id (the links compare it, the orphan criteria
#   read an InfraMachine's for its scheme, and a pool member's is its
#   instance); pool_name (the MachinePool a Machine belongs to, when Cluster
#   API's MachinePool Machines are on).
object_fields := {
	"deletion_timestamp": ["metadata", "deletionTimestamp"],
	"cluster_label": ["metadata", "labels", "cluster.x-k8s.io/cluster-name"],
	"cluster_name": ["spec", "clusterName"],
	"provider_id": ["spec", "providerID"],
	"pool_name": ["metadata", "labels", "cluster.x-k8s.io/pool-name"],
}

# METADATA
# title: Machine kind
# description: The group and kind of Cluster API's Machines.
machine_kind := {"group": referrers.Machine.group, "kind": referrers.Machine.kind}
