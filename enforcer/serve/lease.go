package serve

import (
	"context"
	"log/slog"
	"os"

	"github.com/google/uuid"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/nodeguard/nodeguard/enforcer/kube"
)

// The Leases the replicas compete for: one replica runs the fleet, one
// (possibly another) deletes orphans.
const (
	fleetLease  = "nodeguard-fleet"
	reaperLease = "nodeguard-orphan-reaper"
)

// leaseName is a Lease's name for an install with watch filter value
// (none: base): each shard of a fleet elects its own leaders.
func leaseName(base, value string) string {
	if value == "" {
		return base
	}
	return base + "-" + value
}

// elect campaigns for a Lease in namespace until ctx is done, then gives it
// up (Done), watching it so a standby takes a released Lease at once.
func elect(ctx context.Context, client kubernetes.Interface, dyn dynamic.Interface, namespace, name, purpose string, log *slog.Logger) (*kube.Leader, error) {
	host, _ := os.Hostname()
	return kube.Elect(ctx, kube.LeaseOptions{Client: client, Watch: dyn, Namespace: namespace, Name: name, Purpose: purpose,
		Identity: host + "_" + uuid.NewString(), Log: log})
}
