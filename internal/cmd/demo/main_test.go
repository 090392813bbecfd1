//go:build e2e

package main

import (
	"bytes"
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The demo is the README's first command: it must show both scenarios with
// the real CAPI manager and fail if nodeguard or CAPI acted otherwise (run
// returns an error then).
func TestDemo(t *testing.T) {
	bin := os.Getenv("NODEGUARD_E2E_BIN")
	if bin == "" {
		// Asked for with -tags e2e, a skip would pass having shown nothing.
		t.Fatal("no kube-apiserver/etcd: set NODEGUARD_E2E_BIN to the directory tests/e2e/tools/build.sh prints (make e2e does both)")
	}
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), bin, &out), out.String())
	for _, want := range []string{
		"$ kubectl delete node " + node,
		`admission webhook "node-delete.nodeguard.io" denied the request`,
		"still exists, linked by Machine default/" + node,
		"is being deleted but still exists",
		`machine.cluster.x-k8s.io "` + node + `" deleted`,
		"Machine condition Deleting: WaitingForInfrastructureDeletion",
		"CAPI then deleted the Node through nodeguard",
	} {
		assert.Contains(t, out.String(), want)
	}
	t.Log(out.String())
}
