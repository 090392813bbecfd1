//go:build tools

// Package tools pins the Cluster API core manager (the machine, MachineSet
// and Cluster controllers) the e2e suite runs out of cluster, and clusterctl,
// which renders nodeguard's add-on provider components in the e2e suite.
package tools

import (
	_ "sigs.k8s.io/cluster-api/cmd/clusterctl"
	_ "sigs.k8s.io/cluster-api/core"
)
