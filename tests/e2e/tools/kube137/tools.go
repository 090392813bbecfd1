//go:build tools

// Package tools pins kube-apiserver 1.37 for the e2e suite: the first release
// that loads ValidatingAdmissionPolicies from static manifests (KEP-5793,
// beta), beside the 1.36 of ../ the rest of the suite runs on.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
