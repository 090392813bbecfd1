# METADATA
# title: Node facts
# description: |
#   What the orphan and ghost criteria read of a Node besides the link model's
#   Node fields, declared once (node_fields), and the facts they read from it:
#   whether and since when it is Ready, when it was created. Both criteria
#   import this package, so neither imports the other's helpers. Each reads
#   the Node itself: a call within a call costs every judged Node.
package nodeguard.nodes

# METADATA
# title: Node fields
# description: |
#   What the criteria read of a Node besides the link model's Node fields
#   (data.lib.nodeguard.link_model, named in node_paths): fields, paths to
#   strings by name (cluster_name, the Cluster API annotation naming the
#   Node's Cluster; created, when the Node was created); and conditions, the
#   entries of the list at path whose type is one of types, of which only
#   keys. The criteria read these by name, and the enforcer's Node caches
#   keep exactly these and the link model's; tests/fieldcoverage fails a
#   criterion that reads anything else.
node_fields := {
	"fields": {
		"cluster_name": ["metadata", "annotations", "cluster.x-k8s.io/cluster-name"],
		"created": ["metadata", "creationTimestamp"],
	},
	"conditions": {
		"path": ["status", "conditions"],
		"types": ["Ready"],
		"keys": ["type", "status", "lastTransitionTime"],
	},
}

# METADATA
# title: Ready
# description: The Node's Ready condition is True.
ready(node) if {
	some c in object.get(node, node_fields.conditions.path, [])
	c.type == "Ready"
	c.status == "True"
}

# METADATA
# title: Ready since
# description: When the Node's Ready condition turned True; undefined when it is not True or the time is unknown.
ready_since(node) := since if {
	some c in object.get(node, node_fields.conditions.path, [])
	c.type == "Ready"
	c.status == "True"
	since := object.get(c, "lastTransitionTime", "")
	since != ""
}

# METADATA
# title: Not Ready since
# description: |
#   When the Node's Ready condition last changed (it is not True), or its
#   creationTimestamp when it has no Ready condition; "" when unknown.
not_ready_since(node) := object.get(conditions[0], "lastTransitionTime", "") if {
	conditions := [c | some c in object.get(node, node_fields.conditions.path, []); c.type == "Ready"]
	count(conditions) > 0
} else := object.get(node, node_fields.fields.created, "")

# METADATA
# title: Created
# description: The Node's creationTimestamp, or "".
created(node) := object.get(node, node_fields.fields.created, "")
