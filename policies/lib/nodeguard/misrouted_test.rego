# Tests of a misrouted review: a Node whose Cluster API annotations name
# another Cluster than the route it was reviewed on is denied (misrouted),
# never judged against the wrong Cluster's Machines.
package lib.nodeguard_test

# capd_node's annotations name Cluster default/dev.
test_node_of_another_cluster_on_a_cluster_route_is_misrouted if {
	d := decide_with(capd_node, [], {"clusterNamespace": "default", "clusterName": "prod"})
	not d.allowed
	d.reason == "misrouted"
	d.blockers == []
	contains(d.messages[0], `Node "dev-md-0-abcde" is Cluster default/dev's`)
	contains(d.messages[0], "the route of Cluster default/prod")
}

test_node_of_another_namespace_is_misrouted if {
	d := decide_with(capd_node, [], {"clusterNamespace": "elsewhere", "clusterName": "dev"})
	d.reason == "misrouted"
}

test_node_without_cluster_annotations_is_not_misrouted if {
	d := decide_with(without_annotations(capd_node), [], {"clusterNamespace": "default", "clusterName": "prod"})
	d.allowed
	d.reason == "no-link"
}

test_node_of_this_cluster_is_judged if {
	d := decide_with(capd_node, [capd_machine, capd_infra], {"clusterNamespace": "default", "clusterName": "dev"})
	d.reason == "blocked"
}

test_unscoped_route_never_misroutes if {
	d := decide(capd_node, [])
	d.reason == "no-link"
}

test_exempt_user_passes_a_misrouted_review_warned if {
	d := decide_with(capd_node, [], {"clusterNamespace": "default", "clusterName": "prod", "exemptUsers": ["alice"]})
	d.allowed
	d.reason == "exempt"
	contains(d.warnings[0], "the route of Cluster default/prod")
}
