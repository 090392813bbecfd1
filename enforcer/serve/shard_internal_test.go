package serve

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A watch filter is a label value, and makes an install one shard of a
// fleet: refused without --fleet, or with --self-cluster (a shard judges no
// management cluster Nodes).
func TestWatchFilterMakesAShardOfAFleet(t *testing.T) {
	fleetOn := func(v string) Options { return Options{Fleet: FleetOptions{Enabled: true, WatchFilter: v}} }
	require.NoError(t, checkWatchFilter(Options{}))
	require.NoError(t, checkWatchFilter(fleetOn("shard-a")))
	assert.ErrorContains(t, checkWatchFilter(fleetOn("a b")), "is not a label value")
	assert.ErrorContains(t, checkWatchFilter(Options{Fleet: FleetOptions{WatchFilter: "a"}}), "needs --fleet")
	selfToo := fleetOn("a")
	selfToo.SelfCluster = "default/mgmt"
	assert.ErrorContains(t, checkWatchFilter(selfToo), "--self-cluster")
	assert.Equal(t, "nodeguard-fleet-a", leaseName(fleetLease, "a"))
	assert.Equal(t, "nodeguard-fleet", leaseName(fleetLease, ""))
}
