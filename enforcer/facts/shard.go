// This file proves, for an install started with a watch filter, that its
// caches hold every object of each of its Clusters. Caches filtered by a
// label (SyncerOptions.WatchFilter) cannot see what they lack: a Machine of
// one of the install's Clusters still labelled for another shard (a move
// under way, a pool whose template lacks the label) is invisible, and the
// rule would find nothing linked to its Node. So a Cluster counts as held
// only once a LIST of everything carrying its cluster-name label finds each
// object labelled for this shard and in the cache; until then, and again
// the moment one of its objects leaves the cache without being deleted,
// Holds fails and callers deny (the Guard) or act on nothing (releases,
// orphans, ghosts).

package facts

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/record"
)

// ShardOptions configure a Shard.
type ShardOptions struct {
	// Value is the install's watch-filter value.
	Value string
	// Client lists the Clusters' objects; Syncer holds the caches proven.
	Client dynamic.Interface
	Syncer *Syncer
	// Recheck is how often a held Cluster is proven again, so an object
	// created with another shard's label (a pool's template not relabelled)
	// is found (default DefaultShardRecheck, jittered by up to a tenth).
	Recheck time.Duration
}

// DefaultShardRecheck is how often a held Cluster is proven again.
const DefaultShardRecheck = 10 * time.Minute

// Retries of a Cluster not held: objects still labelled for another shard
// are looked at again every shardMovingRetry, objects the caches have not
// caught up with every shardCatchUpRetry.
const (
	shardMovingRetry  = 2 * time.Second
	shardCatchUpRetry = 200 * time.Millisecond
)

// Shard says which of an install's Clusters its caches hold whole.
type Shard struct {
	opts ShardOptions
	loop *kube.Loop[string]

	mu sync.Mutex
	// member says whether a Cluster is one of the install's (set by Run's
	// caller: the Clusters' informer, filtered by the same label).
	member func(key string) bool
	// held is nil for a held Cluster, the reason otherwise; absent: not
	// looked at yet.
	held map[string]error
}

// NewShard returns a Shard of opts.Syncer's caches, before the Syncer
// starts; Run starts it.
func NewShard(opts ShardOptions) *Shard {
	if opts.Recheck <= 0 {
		opts.Recheck = DefaultShardRecheck
	}
	s := &Shard{opts: opts, held: map[string]error{}}
	s.loop = kube.NewLoop(kube.LoopOptions{Name: "shard", Workers: 4, BaseBackoff: shardCatchUpRetry, MaxBackoff: shardMovingRetry}, s.prove)
	opts.Syncer.OnLeaving(s.leaving)
	return s
}

// Run proves Clusters until ctx is done; member says whether a Cluster is
// the install's. Call ClusterChanged for every change of one.
func (s *Shard) Run(ctx context.Context, member func(key string) bool) {
	s.mu.Lock()
	s.member = member
	s.mu.Unlock()
	s.loop.Run(ctx)
}

// ClusterChanged has a Cluster's membership looked at again.
func (s *Shard) ClusterChanged(key string) { s.loop.Add(key) }

// Holds returns nil when the caches hold every object of cluster
// ("namespace/name"), else why not.
func (s *Shard) Holds(cluster string) error {
	if cluster == "" {
		return fmt.Errorf("this nodeguard holds only the objects labelled %s=%s, and the request names no Cluster",
			kube.WatchFilterLabel, s.opts.Value)
	}
	s.mu.Lock()
	err, seen := s.held[cluster]
	s.mu.Unlock()
	switch {
	case !seen:
		return fmt.Errorf("Cluster %s is not one of this nodeguard's Clusters (%s=%s), or is not proven held yet", cluster,
			kube.WatchFilterLabel, s.opts.Value)
	case err != nil:
		return err
	}
	return nil
}

// leaving is told (Syncer.OnLeaving) of an object that leaves the caches
// without being deleted (moved to another shard), before they drop it: its
// Cluster is not held from that moment until proven again.
func (s *Shard) leaving(role Role, u *unstructured.Unstructured) {
	key := clusterOf(s.opts.Syncer.inv.Model(), s.opts.Syncer.inv.Record(u, role))
	if key == "" {
		return
	}
	s.mu.Lock()
	if err, seen := s.held[key]; seen && err == nil {
		s.held[key] = fmt.Errorf("%s %s/%s of Cluster %s left this nodeguard's caches (relabelled away from %s=%s): proving the "+
			"Cluster's objects again", u.GetKind(), u.GetNamespace(), u.GetName(), key, kube.WatchFilterLabel, s.opts.Value)
	}
	s.mu.Unlock()
	s.loop.Add(key)
}

// prove looks at one Cluster: gone from the install, it is forgotten;
// otherwise it is held once every object carrying its name is labelled for
// this shard and cached.
func (s *Shard) prove(ctx context.Context, key string) kube.Result {
	s.mu.Lock()
	member := s.member
	s.mu.Unlock()
	if member == nil || !member(key) {
		s.mu.Lock()
		delete(s.held, key)
		s.mu.Unlock()
		return kube.Result{}
	}
	retry, err := s.check(ctx, key)
	s.mu.Lock()
	s.held[key] = err
	s.mu.Unlock()
	if err != nil {
		return kube.Result{After: retry}
	}
	return kube.Result{After: s.opts.Recheck + rand.N(s.opts.Recheck/10+1)}
}

// check lists every cached kind's objects of Cluster key and compares them
// with the shard's label and the caches.
func (s *Shard) check(ctx context.Context, key string) (time.Duration, error) {
	ns, name, err := record.SplitKey("cluster", key)
	if err != nil {
		return shardMovingRetry, err
	}
	// The link model names the label (a path under metadata.labels).
	label := s.opts.Syncer.inv.Model().ClusterLabel
	var foreign, missing []string
	for _, k := range s.opts.Syncer.cachedKinds() {
		opts := metav1.ListOptions{LabelSelector: label[len(label)-1] + "=" + name, Limit: 500}
		for {
			list, err := s.opts.Client.Resource(k.resource).Namespace(ns).List(ctx, opts)
			if err != nil {
				return shardMovingRetry, fmt.Errorf("Cluster %s: cannot prove this nodeguard holds its objects: list %s: %w", key,
					k.resource.Resource, err)
			}
			for i := range list.Items {
				o := &list.Items[i]
				what := fmt.Sprintf("%s %s/%s", o.GetKind(), ns, o.GetName())
				if v := o.GetLabels()[kube.WatchFilterLabel]; v != s.opts.Value {
					foreign = append(foreign, fmt.Sprintf("%s (%s=%q)", what, kube.WatchFilterLabel, v))
					continue
				}
				have, ok, _ := k.store.GetByKey(cache.MetaObjectToName(o).String())
				if r, isRecord := have.(*record.Record); !ok || !isRecord || r.UID() != o.GetUID() {
					missing = append(missing, what)
				}
			}
			if opts.Continue = list.GetContinue(); opts.Continue == "" {
				break
			}
		}
	}
	switch {
	case len(foreign) > 0:
		return shardMovingRetry, fmt.Errorf("Cluster %s is moving between nodeguard shards: %s still labelled for another; until "+
			"every object of the Cluster carries %s=%s this nodeguard cannot prove what links to its Nodes", key, some(foreign),
			kube.WatchFilterLabel, s.opts.Value)
	case len(missing) > 0:
		return shardCatchUpRetry, fmt.Errorf("Cluster %s: this nodeguard's caches have not caught up with %s yet", key, some(missing))
	}
	return 0, nil
}

// some names up to three of what, and how many more.
func some(what []string) string {
	if len(what) <= 3 {
		return strings.Join(what, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(what[:3], ", "), len(what)-3)
}

// cachedKind is one watched kind's resource and cache.
type cachedKind struct {
	resource schema.GroupVersionResource
	store    cache.Store
}

// cachedKinds are the kinds the Syncer watches now.
func (s *Syncer) cachedKinds() []cachedKind {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]cachedKind, 0, len(s.informers))
	for _, t := range s.informers {
		out = append(out, cachedKind{resource: t.resource, store: t.informer.GetStore()})
	}
	return out
}
