package lib.nodeguard

# The rule's parameters (a Constraint's spec.parameters) are declared here and
# nowhere else: default_parameters (the enforcer's defaults too) derives from
# declared_parameters, and `make generate` writes the ConstraintTemplate's
# openAPIV3Schema, the sample Constraint and docs/policy.md's table from it.
#
# declared_parameters is one literal, without references to other rules (a Go
# test checks it; docs/performance.md, "How the rule is written for OPA's
# evaluator", says why).

# METADATA
# title: Declared parameters
# description: |
#   Every parameter of the rule, by name: schema (an OpenAPI v3 fragment,
#   structural as Gatekeeper requires: a type at every level), default (what a
#   Constraint that leaves it out means; a kind's version is what the generated
#   sync config watches, the rule reads group and kind), description, and
#   user_groups: true for a list of group names the rule compares with the
#   requesting user's groups (group_parameters).
declared_parameters := {
	"infraMachineKinds": {
		"schema": {
			"type": "array",
			"items": {
				"type": "object",
				"required": ["group", "kind"],
				"properties": {"group": {"type": "string"}, "kind": {"type": "string"}},
			},
		},
		"default": [
			{"group": "infrastructure.cluster.x-k8s.io", "version": "v1beta2", "kind": "AWSMachine"},
			{"group": "infrastructure.cluster.x-k8s.io", "version": "v1beta1", "kind": "AzureMachine"},
			{"group": "infrastructure.cluster.x-k8s.io", "version": "v1beta1", "kind": "AzureMachinePoolMachine"},
			{"group": "infrastructure.cluster.x-k8s.io", "version": "v1beta1", "kind": "GCPMachine"},
			{"group": "infrastructure.cluster.x-k8s.io", "version": "v1beta1", "kind": "VSphereMachine"},
			{"group": "vmware.infrastructure.cluster.x-k8s.io", "version": "v1beta1", "kind": "VSphereMachine"},
			{"group": "infrastructure.cluster.x-k8s.io", "version": "v1beta1", "kind": "OpenStackMachine"},
			{"group": "infrastructure.cluster.x-k8s.io", "version": "v1beta1", "kind": "Metal3Machine"},
			{"group": "infrastructure.cluster.x-k8s.io", "version": "v1beta2", "kind": "IBMVPCMachine"},
			{"group": "infrastructure.cluster.x-k8s.io", "version": "v1beta2", "kind": "IBMPowerVSMachine"},
			{"group": "infrastructure.cluster.x-k8s.io", "version": "v1beta1", "kind": "HCloudMachine"},
			{"group": "infrastructure.cluster.x-k8s.io", "version": "v1beta1", "kind": "HetznerBareMetalMachine"},
			{"group": "infrastructure.cluster.x-k8s.io", "version": "v1beta1", "kind": "NutanixMachine"},
			{"group": "infrastructure.cluster.x-k8s.io", "version": "v1alpha1", "kind": "KubevirtMachine"},
			{"group": "infrastructure.cluster.x-k8s.io", "version": "v1beta2", "kind": "DockerMachine"},
			{"group": "infrastructure.cluster.x-k8s.io", "version": "v1beta2", "kind": "DevMachine"},
		],
		"description": "InfraMachine kinds whose objects are synced. A Machine referencing a kind not listed cannot prove its InfraMachine is gone, so the delete is denied.",
	},
	"infraMachinePoolKinds": {
		"schema": {
			"type": "array",
			"items": {
				"type": "object",
				"required": ["group", "kind"],
				"properties": {"group": {"type": "string"}, "kind": {"type": "string"}},
			},
		},
		"default": [
			{"group": "infrastructure.cluster.x-k8s.io", "version": "v1beta2", "kind": "AWSMachinePool"},
			{"group": "infrastructure.cluster.x-k8s.io", "version": "v1beta1", "kind": "AzureMachinePool"},
			{"group": "infrastructure.cluster.x-k8s.io", "version": "v1beta1", "kind": "GCPMachinePool"},
			{"group": "infrastructure.cluster.x-k8s.io", "version": "v1beta2", "kind": "DockerMachinePool"},
			{"group": "infrastructure.cluster.x-k8s.io", "version": "v1beta2", "kind": "DevMachinePool"},
			# Managed pools (EKS, ROSA, GKE, AKS): no Machine per instance unless
			# MachinePool Machines are on. Versions are those the providers'
			# contract labels resolve to (CAPA v2.13.0, CAPG v1.13.1, CAPZ v1.21.0).
			{"group": "infrastructure.cluster.x-k8s.io", "version": "v1beta2", "kind": "AWSManagedMachinePool"},
			{"group": "infrastructure.cluster.x-k8s.io", "version": "v1beta2", "kind": "ROSAMachinePool"},
			{"group": "infrastructure.cluster.x-k8s.io", "version": "v1beta1", "kind": "GCPManagedMachinePool"},
			{"group": "infrastructure.cluster.x-k8s.io", "version": "v1beta1", "kind": "AzureManagedMachinePool"},
			{"group": "infrastructure.cluster.x-k8s.io", "version": "v1beta1", "kind": "AzureASOManagedMachinePool"},
		],
		"description": "InfraMachinePool kinds whose spec.providerIDList links Nodes (self-managed and managed pools); must be synced. A MachinePool's spec.template.spec.infrastructureRef names one.",
	},
	"allowUnverifiedKinds": {
		"schema": {"type": "boolean"},
		"default": false,
		"description": "Allow the delete when a linked Machine references a kind not in infraMachineKinds (default false: deny).",
	},
	"clusterName": {
		"schema": {"type": "string"},
		"default": "",
		"description": "Only Machines and InfraMachines of this CAPI Cluster count (empty: all).",
	},
	"clusterNamespace": {
		"schema": {"type": "string"},
		"default": "",
		"description": "Only Machines and InfraMachines in this namespace count (empty: all).",
	},
	"exemptUsers": {
		"schema": {"type": "array", "items": {"type": "string"}},
		"default": [],
		"description": "Users allowed to delete any Node; the response warns what was bypassed.",
	},
	"exemptGroups": {
		"schema": {"type": "array", "items": {"type": "string"}},
		"default": [],
		"user_groups": true,
		"description": "Groups allowed to delete any Node; the response warns what was bypassed.",
	},
}

# METADATA
# title: Default synced InfraMachine kinds
# description: |
#   Kinds whose objects are synced, so their absence proves the host is gone
#   (declared in declared_parameters.infraMachineKinds). The rule reads group
#   and kind; version is the one the generated sync config asks Gatekeeper to
#   watch.
default_infra_machine_kinds := declared_parameters.infraMachineKinds.default

# METADATA
# title: Default synced InfraMachinePool kinds
# description: |
#   Pool kinds whose spec.providerIDList links Nodes to the pool (declared in
#   declared_parameters.infraMachinePoolKinds).
default_infra_machine_pool_kinds := declared_parameters.infraMachinePoolKinds.default

# METADATA
# title: Default parameters
# description: What a Constraint without parameters means, by parameter name.
default_parameters[name] := parameter.default if {
	some name, parameter in declared_parameters
}

# METADATA
# title: Group parameters
# description: |
#   The parameters declared with user_groups: true, sorted: the rule reads a
#   user's groups only to compare them with the group names these list. The
#   enforcer passes the rule only the groups of a user that some such parameter
#   lists (tests/fieldcoverage reruns the Rego tests on that).
group_parameters := sort([name | some name, parameter in declared_parameters; parameter.user_groups == true])

# The parameters the rule reads: as given when they hold every declared name
# (the enforcer passes them all), else over the defaults (a Constraint may
# leave some out, or be no object at all).
_effective(parameters) := parameters if {
	_complete(parameters)
} else := object.union(default_parameters, _object_or_empty(parameters))

_object_or_empty(x) := x if {
	is_object(x)
} else := {}

# The enforcer passes every parameter (its defaults come from
# default_parameters); only a Constraint leaves some out, and only then are
# the defaults built (docs/performance.md, "How the rule is written for OPA's
# evaluator").
_complete(parameters) if {
	is_object(parameters)
	object.subset(object.keys(parameters), object.keys(declared_parameters))
}
