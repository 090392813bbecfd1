package kube

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// LeaseOptions configure the leader election that keeps a job to one
// replica.
type LeaseOptions struct {
	Client kubernetes.Interface
	// Watch, when set, watches the Lease: a standby sees it released the
	// moment the leader gives it up, and takes it then rather than at its
	// next retry (up to RetryPeriod x 2.2 later).
	Watch           dynamic.Interface
	Namespace, Name string
	Identity        string
	// Purpose names the job in logs ("fleet", "orphan reaper").
	Purpose       string
	LeaseDuration time.Duration // default 15s
	RenewDeadline time.Duration // default 10s
	RetryPeriod   time.Duration // default 2s
	Log           *slog.Logger
}

// Leader is one replica's part in an election.
type Leader struct {
	opts    LeaseOptions
	leading atomic.Bool
	current atomic.Pointer[leaderelection.LeaderElector]
	done    chan struct{}

	mu       sync.Mutex
	retry    context.CancelFunc // ends the attempt under way, to start another at once
	notified []func(leading bool)
}

var leases = schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}

// Elect campaigns for the Lease until ctx is done; then it gives the Lease up
// (so another replica takes it at once, not LeaseDuration later) and closes
// Done. Leadership ends when a renewal fails for RenewDeadline, before
// another replica can take the Lease (LeaseDuration later), so two replicas
// never both lead while their clocks agree to within the gap.
func Elect(ctx context.Context, o LeaseOptions) (*Leader, error) {
	if o.Client == nil || o.Namespace == "" || o.Name == "" || o.Identity == "" {
		return nil, errors.New("leader election needs a client, a namespace, a Lease name and an identity")
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = 15*time.Second, 10*time.Second, 2*time.Second
	}
	o.Log = cmp.Or(o.Log, slog.New(slog.DiscardHandler))
	o.Purpose = cmp.Or(o.Purpose, o.Name)
	l := &Leader{opts: o, done: make(chan struct{})}
	// Validate the configuration now rather than in the goroutine.
	first, err := l.elector()
	if err != nil {
		return nil, fmt.Errorf("leader election: %w", err)
	}
	l.current.Store(first)
	wctx, stopWatch := context.WithCancel(ctx)
	var watching sync.WaitGroup
	if o.Watch != nil {
		watch, err := WatchObject(ObjectOptions{Client: o.Watch, Resource: leases, Namespace: o.Namespace, Name: o.Name,
			Changed: l.leaseChanged})
		if err != nil {
			stopWatch()
			return nil, err
		}
		watching.Go(func() { watch.Run(wctx) })
	}
	go func() {
		defer close(l.done)
		defer watching.Wait()
		defer stopWatch()
		for ctx.Err() == nil {
			attempt, cancel := context.WithCancel(ctx)
			l.mu.Lock()
			l.retry = cancel
			l.mu.Unlock()
			// Returns when leadership is lost, the attempt is ended, or ctx is
			// done: then, as leader, it has released the Lease.
			l.current.Load().Run(attempt)
			cancel()
			next, err := l.elector()
			if err != nil {
				o.Log.Error(o.Purpose+": leader election", "error", err.Error())
				return
			}
			l.current.Store(next)
		}
	}()
	return l, nil
}

func (l *Leader) elector() (*leaderelection.LeaderElector, error) {
	o := l.opts
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
			OnStartedLeading: func(context.Context) { l.set(true) },
			// Called at the end of every attempt, led or not.
			OnStoppedLeading: func() { l.set(false) },
		},
	})
}

func (l *Leader) set(leading bool) {
	if l.leading.Swap(leading) == leading {
		return
	}
	what := "leading"
	if !leading {
		what = "not leading"
	}
	l.opts.Log.Info(l.opts.Purpose+": "+what, "lease", l.opts.Namespace+"/"+l.opts.Name, "identity", l.opts.Identity)
	l.mu.Lock()
	notified := l.notified
	l.mu.Unlock()
	for _, f := range notified {
		f(leading)
	}
}

// Notify has f told (it must not block) when this replica starts or stops
// leading, from now on.
func (l *Leader) Notify(f func(leading bool)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.notified = append(l.notified, f)
}

// leaseChanged starts a standby's next attempt at once when the Lease is
// given up (client-go's release empties holderIdentity).
func (l *Leader) leaseChanged(lease *unstructured.Unstructured) {
	if lease == nil || l.current.Load().IsLeader() {
		return
	}
	if holder, _, _ := unstructured.NestedString(lease.Object, "spec", "holderIdentity"); holder != "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.retry != nil {
		l.retry()
	}
}

// Leading says whether this replica leads now. The callbacks alone can lag
// (a starved goroutine): it also requires the last successful renewal to be
// within RenewDeadline, which is before any other replica may take the Lease
// (LeaseDuration).
func (l *Leader) Leading() bool {
	le := l.current.Load()
	return l.leading.Load() && le.IsLeader() && le.Check(l.opts.RenewDeadline-l.opts.LeaseDuration) == nil
}

// Done is closed once the election ended after ctx: the Lease released, if
// this replica held it.
func (l *Leader) Done() <-chan struct{} { return l.done }
