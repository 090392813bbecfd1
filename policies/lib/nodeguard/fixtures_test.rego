# Test fixtures: realistic CAPI objects (CAPD on v1beta2, CAPA on v1beta1) and
# an inventory builder in Gatekeeper's layout.
package lib.nodeguard_test

# Gatekeeper's layout: namespace[ns][apiVersion][kind][name].
inventory(objs) := {"namespace": {o.metadata.namespace: _by_gv(objs, o.metadata.namespace) | some o in objs}}

_by_gv(objs, ns) := {o.apiVersion: _by_kind(objs, ns, o.apiVersion) |
	some o in objs
	o.metadata.namespace == ns
}

_by_kind(objs, ns, gv) := {o.kind: _by_name(objs, ns, gv, o.kind) |
	some o in objs
	o.metadata.namespace == ns
	o.apiVersion == gv
}

_by_name(objs, ns, gv, kind) := {o.metadata.name: o |
	some o in objs
	o.metadata.namespace == ns
	o.apiVersion == gv
	o.kind == kind
}

delete_review(node) := {
	"operation": "DELETE",
	"kind": {"group": "", "version": "v1", "kind": "Node"},
	"name": node.metadata.name,
	"oldObject": node,
	"userInfo": {"username": "alice", "groups": ["system:authenticated"]},
}

# --- CAPD, v1beta2 -------------------------------------------------------------

capd_node := {
	"apiVersion": "v1",
	"kind": "Node",
	"metadata": {
		"name": "dev-md-0-abcde",
		"annotations": {
			"cluster.x-k8s.io/cluster-name": "dev",
			"cluster.x-k8s.io/cluster-namespace": "default",
			"cluster.x-k8s.io/machine": "dev-md-0-abcde",
			"cluster.x-k8s.io/owner-kind": "MachineSet",
			"cluster.x-k8s.io/owner-name": "dev-md-0-x7k2p",
		},
	},
	"spec": {"providerID": "docker:////dev-md-0-abcde"},
}

capd_machine := {
	"apiVersion": "cluster.x-k8s.io/v1beta2",
	"kind": "Machine",
	"metadata": {
		"namespace": "default",
		"name": "dev-md-0-abcde",
		"labels": {"cluster.x-k8s.io/cluster-name": "dev"},
	},
	"spec": {
		"clusterName": "dev",
		"providerID": "docker:////dev-md-0-abcde",
		"infrastructureRef": {
			"apiGroup": "infrastructure.cluster.x-k8s.io",
			"kind": "DockerMachine",
			"name": "dev-md-0-abcde",
		},
	},
	"status": {"nodeRef": {"name": "dev-md-0-abcde"}},
}

capd_infra := {
	"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
	"kind": "DockerMachine",
	"metadata": {
		"namespace": "default",
		"name": "dev-md-0-abcde",
		"labels": {"cluster.x-k8s.io/cluster-name": "dev"},
	},
	"spec": {"providerID": "docker:////dev-md-0-abcde"},
}

# --- CAPA, v1beta1 -------------------------------------------------------------

capa_node := {
	"apiVersion": "v1",
	"kind": "Node",
	"metadata": {"name": "ip-10-0-1-17.ec2.internal", "annotations": {}},
	"spec": {"providerID": "aws:///us-east-1a/i-0a1b2c3d4e5f60718"},
}

capa_machine := {
	"apiVersion": "cluster.x-k8s.io/v1beta1",
	"kind": "Machine",
	"metadata": {
		"namespace": "prod",
		"name": "prod-md-0-q8z4v",
		"labels": {"cluster.x-k8s.io/cluster-name": "prod"},
	},
	"spec": {
		"clusterName": "prod",
		"providerID": "aws:///us-east-1a/i-0a1b2c3d4e5f60718",
		"infrastructureRef": {
			"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
			"kind": "AWSMachine",
			"namespace": "prod",
			"name": "prod-md-0-q8z4v",
		},
	},
	"status": {"nodeRef": {"apiVersion": "v1", "kind": "Node", "name": "ip-10-0-1-17.ec2.internal"}},
}

capa_infra := {
	"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
	"kind": "AWSMachine",
	"metadata": {
		"namespace": "prod",
		"name": "prod-md-0-q8z4v",
		"labels": {"cluster.x-k8s.io/cluster-name": "prod"},
	},
	"spec": {"providerID": "aws:///us-east-1a/i-0a1b2c3d4e5f60718"},
}

capd_pool := {
	"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
	"kind": "DockerMachinePool",
	"metadata": {
		"namespace": "default",
		"name": "dev-mp-0",
		"labels": {"cluster.x-k8s.io/cluster-name": "dev"},
	},
	"spec": {"providerIDList": ["docker:////dev-mp-0-1", "docker:////dev-mp-0-2"]},
}

pool_node := {
	"apiVersion": "v1",
	"kind": "Node",
	"metadata": {
		"name": "dev-mp-0-2",
		"annotations": {
			"cluster.x-k8s.io/cluster-name": "dev",
			"cluster.x-k8s.io/cluster-namespace": "default",
			"cluster.x-k8s.io/owner-kind": "MachinePool",
			"cluster.x-k8s.io/owner-name": "dev-mp-0",
		},
	},
	"spec": {"providerID": "docker:////dev-mp-0-2"},
}

deleting(obj) := object.union(obj, {"metadata": {"deletionTimestamp": "2026-11-29T10:00:00Z", "finalizers": ["dockermachine.infrastructure.cluster.x-k8s.io"]}})

without_annotations(node) := json.remove(node, ["metadata/annotations"])
