# Tests of the link model: the declaration the rule and the enforcer read,
# and how a link matches an object.
package lib.nodeguard_test

import data.lib.nodeguard

# A contains link matches a list holding the Node's value, not a value held
# in an object or a string equal to it. (The rule once had a second, faster
# copy of this test for Machine links that accepted an object's value.)
test_contains_matches_only_a_list if {
	link := {"type": "t", "match": "contains", "fields": [["spec", "ids"]]}
	nodeguard._matches(link, ["a"], {"spec": {"ids": ["b", "a"]}})
	not nodeguard._matches(link, ["a"], {"spec": {"ids": {"k": "a"}}})
	not nodeguard._matches(link, ["a"], {"spec": {"ids": "a"}})
	not nodeguard._matches(link, ["a"], {"spec": {}})
}

# Each link says its role once; the rule and the enforcer read it there.
test_every_link_has_a_known_role if {
	count(nodeguard.links) > 0
	every link in nodeguard.links {
		link.role in {"Machine", "MachinePool", "InfraMachine", "InfraMachinePool"}
	}
	count({link.type | some link in nodeguard.links}) == count(nodeguard.links)
}

# What the enforcer reads (enforcer/rule): every link, the Machine kind,
# the Node fields, the object fields the rule names and the group parameters.
test_link_model_holds_what_the_enforcer_reads if {
	nodeguard.link_model.links == nodeguard.links
	nodeguard.link_model.machine_kind == {"group": "cluster.x-k8s.io", "kind": "Machine"}
	nodeguard.link_model.node_fields == nodeguard.node_fields
	nodeguard.link_model.group_parameters == nodeguard.group_parameters
	every name, path in nodeguard.object_fields {
		nodeguard.link_model[name] == path
	}
	object.keys(nodeguard.link_model) == {"links", "referrers", "machine_kind", "node_fields", "node_provider_id", "group_parameters"} | object.keys(nodeguard.object_fields)
}

# The Node fields are the named Node paths and every link's Node fields, each
# once, sorted: nothing the rule reads of a Node is missing, nothing else is
# kept.
test_node_fields_are_the_named_paths_and_the_links_node_fields if {
	nodeguard.node_fields == sort({p | some p in nodeguard.node_fields})
	every path in nodeguard.node_fields {
		_named_or_linked(path)
	}
	every _, path in nodeguard.node_paths {
		path in nodeguard.node_fields
	}
	every link in nodeguard.links {
		every path in link.node {
			path in nodeguard.node_fields
		}
	}
}

_named_or_linked(path) if {
	some p in nodeguard.node_paths
	p == path
}

_named_or_linked(path) if {
	some link in nodeguard.links
	path in link.node
}
