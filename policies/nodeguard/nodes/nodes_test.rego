# METADATA
# title: Tests of the Node facts
# description: Ready, since when, created, and the declaration the Node caches follow.
package nodeguard.nodes_test

import data.nodeguard.nodes

node(conditions) := {"metadata": {"name": "n", "creationTimestamp": "2026-12-01T00:00:00Z"}, "status": {"conditions": conditions}}

ready := {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-02T00:00:00Z"}

not_ready := {"type": "Ready", "status": "False", "lastTransitionTime": "2026-12-03T00:00:00Z"}

pressure := {"type": "MemoryPressure", "status": "True", "lastTransitionTime": "2026-12-04T00:00:00Z"}

test_ready_reads_the_ready_condition_only if {
	nodes.ready(node([pressure, ready]))
	not nodes.ready(node([pressure, not_ready]))
	not nodes.ready(node([pressure]))
	not nodes.ready({})
}

test_ready_since_is_when_it_turned_true if {
	nodes.ready_since(node([pressure, ready])) == "2026-12-02T00:00:00Z"
	not nodes.ready_since(node([not_ready]))
	not nodes.ready_since(node([{"type": "Ready", "status": "True"}]))
}

test_not_ready_since_falls_back_to_the_creation_time if {
	nodes.not_ready_since(node([pressure, not_ready])) == "2026-12-03T00:00:00Z"
	nodes.not_ready_since(node([pressure])) == "2026-12-01T00:00:00Z"
	nodes.not_ready_since({}) == ""
}

test_created if {
	nodes.created(node([])) == "2026-12-01T00:00:00Z"
	nodes.created({}) == ""
}

test_node_fields_are_paths if {
	every p in nodes.node_fields.fields {
		is_array(p)
		every seg in p {
			is_string(seg)
		}
	}
	"type" in nodes.node_fields.conditions.keys
	"lastTransitionTime" in nodes.node_fields.conditions.keys
}
