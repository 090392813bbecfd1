package reaper

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// LeaseOptions configure the leader election that keeps deletion to one
// replica.
type LeaseOptions struct {
	Client          kubernetes.Interface
	Namespace, Name string
	Identity        string
	LeaseDuration   time.Duration // default 15s
	RenewDeadline   time.Duration // default 10s
	RetryPeriod     time.Duration // default 2s
	Log             *slog.Logger
}

// DefaultLeaseName is the Lease the replicas compete for.
const DefaultLeaseName = "nodeguard-orphan-reaper"

// Elect campaigns for the Lease until ctx is done and returns whether this
// replica leads now. Leadership ends when a renewal fails for RenewDeadline,
// before another replica can take the Lease (LeaseDuration later), so two
// replicas never both lead while their clocks agree to within the gap.
func Elect(ctx context.Context, o LeaseOptions) (func() bool, error) {
	if o.Client == nil || o.Namespace == "" || o.Identity == "" {
		return nil, fmt.Errorf("leader election needs a client, a namespace and an identity")
	}
	if o.Name == "" {
		o.Name = DefaultLeaseName
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = 15*time.Second, 10*time.Second, 2*time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	var leading atomic.Bool
	newElector := func() (*leaderelection.LeaderElector, error) {
		return leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: &resourcelock.LeaseLock{
				LeaseMeta:  metav1.ObjectMeta{Namespace: o.Namespace, Name: o.Name},
				Client:     o.Client.CoordinationV1(),
				LockConfig: resourcelock.ResourceLockConfig{Identity: o.Identity},
			},
			LeaseDuration:   o.LeaseDuration,
			RenewDeadline:   o.RenewDeadline,
			RetryPeriod:     o.RetryPeriod,
			ReleaseOnCancel: true,
			Name:            o.Name,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) {
					leading.Store(true)
					o.Log.Info("orphan reaper: leading", "lease", o.Namespace+"/"+o.Name, "identity", o.Identity)
				},
				OnStoppedLeading: func() {
					leading.Store(false)
					o.Log.Info("orphan reaper: not leading", "lease", o.Namespace+"/"+o.Name, "identity", o.Identity)
				},
			},
		})
	}
	// Validate the configuration now rather than in the goroutine.
	first, err := newElector()
	if err != nil {
		return nil, fmt.Errorf("leader election: %w", err)
	}
	var current atomic.Pointer[leaderelection.LeaderElector]
	current.Store(first)
	go func() {
		for ctx.Err() == nil {
			current.Load().Run(ctx) // returns when leadership is lost or ctx is done
			next, err := newElector()
			if err != nil {
				o.Log.Error("orphan reaper: leader election", "error", err.Error())
				return
			}
			current.Store(next)
		}
	}()
	// The callbacks alone can lag (a starved goroutine); also require the
	// last successful renewal to be within RenewDeadline, which is before
	// any other replica may take the Lease (LeaseDuration).
	return func() bool {
		le := current.Load()
		return leading.Load() && le.IsLeader() && le.Check(o.RenewDeadline-o.LeaseDuration) == nil
	}, nil
}
