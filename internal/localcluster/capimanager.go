package localcluster

import (
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"

	"github.com/nodeguard/nodeguard/internal/testpki"
)

// CAPIManagerBinary is the Cluster API core manager (machine, MachineSet and
// Cluster controllers) that tests/e2e/tools/build.sh builds from
// tests/e2e/tools/capi, the release Current names.
const CAPIManagerBinary = "capi-manager"

// StartCAPIManager runs the real Cluster API core manager out of cluster
// against the API server of kubeconfig, as FIELD-NOTES.md describes, until
// stop is called. Its output goes to log. It needs no
// cert-manager: its webhook server cannot be turned off, so it gets a
// throwaway certificate in workDir and a free port, and nothing registers it
// with the API server (objects are written at v1beta2, no conversion needed).
func StartCAPIManager(binDir, kubeconfig, workDir string, log io.Writer) (stop func(), err error) {
	certDir := filepath.Join(workDir, "capi-webhook-certs")
	ca, err := testpki.NewCA(certDir)
	if err == nil {
		err = ca.WriteTLS(certDir)
	}
	if err != nil {
		return nil, fmt.Errorf("CAPI webhook: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(filepath.Join(binDir, CAPIManagerBinary),
		"--kubeconfig", kubeconfig,
		"--leader-elect=false", "--diagnostics-address=0", "--health-addr=0",
		"--webhook-port", strconv.Itoa(port), "--webhook-cert-dir", certDir,
		// MachinePools, topology and runtime extensions need objects and
		// servers this harness does not have; the machine controller needs none.
		"--feature-gates=MachinePool=false,ClusterTopology=false,RuntimeSDK=false",
		"--skip-crd-migration-phases=StorageVersionMigration,CleanupManagedFields")
	cmd.Stdout, cmd.Stderr = log, log
	stop, err = start(cmd)
	if err != nil {
		return nil, fmt.Errorf("start the CAPI manager: %w", err)
	}
	return stop, nil
}
