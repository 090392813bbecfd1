package lib.nodeguard_test

import data.lib.nodeguard

# Gatekeeper copies each schema into the Constraint CRD; describe what it does.
test_every_parameter_has_a_schema_a_default_and_a_description if {
	count(nodeguard.declared_parameters) > 0
	every name, parameter in nodeguard.declared_parameters {
		object.subset({"schema", "default", "description", "user_groups"}, object.keys(parameter))
		object.subset(object.keys(parameter), {"schema", "default", "description"})
		regex.match(`^[a-z][A-Za-z]+$`, name)
		trim_space(parameter.description) != ""
	}
}

test_every_default_matches_its_schema if {
	every parameter in nodeguard.declared_parameters {
		matches(parameter.default, parameter.schema)
	}
}

# The check above can fail: a kind without its kind does not match.
test_a_default_against_its_schema_can_fail if {
	kinds := nodeguard.declared_parameters.infraMachineKinds
	not matches([{"group": "infrastructure.cluster.x-k8s.io"}], kinds.schema)
	not matches("true", nodeguard.declared_parameters.allowUnverifiedKinds.schema)
	matches([{"group": "infrastructure.cluster.x-k8s.io", "kind": "FooMachine"}], kinds.schema)
}

# json.match_schema takes an object (or its JSON text): wrap the value in one.
matches(value, schema) if {
	[true, _] = json.match_schema({"value": value}, {"type": "object", "required": ["value"], "properties": {"value": schema}})
}

# Gatekeeper requires structural schemas: a type at every level, items for an
# array, properties for an object.
test_every_schema_is_structural if {
	every parameter in nodeguard.declared_parameters {
		every node in schema_nodes(parameter.schema) {
			structural(node)
		}
	}
}

test_a_schema_without_a_type_is_not_structural if {
	not structural({"items": {"type": "string"}})
	not structural({"type": "array"})
	not structural({"type": "object"})
	not structural({"type": "object", "properties": {"a": {}}, "required": ["b"]})
}

# The schema itself and every schema below it (items, properties.*).
schema_nodes(schema) := [node |
	walk(schema, [path, node])
	schema_path(path)
]

schema_path(path) if count(path) == 0

schema_path(path) if path[count(path) - 1] == "items"

schema_path(path) if {
	count(path) > 1
	path[count(path) - 2] == "properties"
}

structural(node) if {
	node.type in {"string", "boolean", "integer", "number"}
}

structural(node) if {
	node.type == "array"
	is_object(node.items)
}

structural(node) if {
	node.type == "object"
	count(node.properties) > 0
	every name in object.get(node, "required", []) {
		node.properties[name]
	}
}

test_default_parameters_are_the_declared_defaults if {
	object.keys(nodeguard.default_parameters) == object.keys(nodeguard.declared_parameters)
	every name, parameter in nodeguard.declared_parameters {
		nodeguard.default_parameters[name] == parameter.default
	}
}

# The sync config watches each default kind at its version.
test_every_default_kind_names_group_version_and_kind if {
	kinds := array.concat(nodeguard.default_infra_machine_kinds, nodeguard.default_infra_machine_pool_kinds)
	count(kinds) == count(nodeguard.declared_parameters.infraMachineKinds.default) + count(nodeguard.declared_parameters.infraMachinePoolKinds.default)
	every kind in kinds {
		object.keys(kind) == {"group", "version", "kind"}
		every _, v in kind {
			v != ""
		}
	}
}

test_complete_parameters_may_carry_more_than_the_declared_names if {
	nodeguard._complete(object.union(nodeguard.default_parameters, {"unknownParameter": true}))
	not nodeguard._complete({"unknownParameter": true})
	not nodeguard._complete(["infraMachineKinds"])
}

# A group parameter is a list of group names; the rule compares the user's
# groups with them (exemptGroups is one).
test_group_parameters_are_lists_of_group_names if {
	"exemptGroups" in nodeguard.group_parameters
	every name in nodeguard.group_parameters {
		nodeguard.declared_parameters[name].user_groups == true
		nodeguard.declared_parameters[name].schema == {"type": "array", "items": {"type": "string"}}
	}
	marked := {name | some name, parameter in nodeguard.declared_parameters; parameter.user_groups == true}
	nodeguard.group_parameters == sort(marked)
}
