// This file publishes, for each workload cluster in mode
// admission-policy, the Nodes the rule releases (the rule judged for
// anyone lets them be deleted) into the ConfigMap its
// ValidatingAdmissionPolicy reads (admission.PolicyParams, admission.BuildPolicy). The orphan
// scan's triggers drive it: every change of a Node, or of anything that
// could link one, has the Node judged again (Judge).
//
// A Node is released only when fresh reads of everything the rule reads for
// it confirm the caches' verdict; a release is revoked on the first verdict
// that does not release, from the caches alone. While the management
// cluster's caches are not ready nothing new is released. Writes are
// batched per cluster (Flush), and a cluster is written only once every
// one of its Nodes was judged (Synced), so a restart never publishes a
// partial list over a whole one.

package nodes

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/guard"
)

// PublisherOptions configure a Publisher.
type PublisherOptions struct {
	// Judge is the rule's release verdict for Nodes of a cluster, from the
	// caches or, with fresh, from fresh reads (guard.Finder.Releases).
	Judge func(ctx context.Context, nodes []*unstructured.Unstructured, cluster string, fresh bool) ([]guard.Release, error)
	// Ready is nil once the management cluster's caches can be trusted
	// (synced, not recovering).
	Ready func() error
	// Rejudge, when set, asks for every Node of a cluster to be judged
	// again (Scanner.JudgeCluster): an enrolled cluster's
	// releases are written only after that.
	Rejudge func(cluster string)
	// Leading, when set, says whether this replica writes: a replica that
	// does not lead judges as the leader does but writes nothing, so when it
	// starts leading it writes every cluster at once (the fleet's Lease).
	Leading func() bool
	// Limit bounds the published data (default admission.MaxParamsBytes).
	Limit int
	Log   *slog.Logger
	// Metrics, when set, counts the writes and what they listed.
	Metrics *ReleaseMetrics
}

// WriteReleases stores the released Nodes in one workload cluster.
type WriteReleases func(ctx context.Context, cm *corev1.ConfigMap) error

// Publisher keeps the released Nodes of the clusters enrolled; safe for
// concurrent use.
type Publisher struct {
	opts PublisherOptions

	mu       sync.Mutex
	clusters map[string]*releaseCluster
	leading  bool // as last flushed
}

type releaseCluster struct {
	write    WriteReleases
	verdicts map[string]admission.ReleaseVerdict // by Node name
	synced   bool                                // every Node judged once
	dirty    bool
}

// NewPublisher returns a Publisher with no cluster enrolled.
func NewPublisher(opts PublisherOptions) (*Publisher, error) {
	if opts.Judge == nil || opts.Ready == nil {
		return nil, fmt.Errorf("releases: a Judge and the caches' readiness are required")
	}
	if opts.Limit <= 0 {
		opts.Limit = admission.MaxParamsBytes
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	return &Publisher{opts: opts, clusters: map[string]*releaseCluster{}}, nil
}

// Enroll publishes the releases of a cluster with write, from scratch: its
// Nodes are judged again before anything is written.
func (p *Publisher) Enroll(name string, write WriteReleases) {
	p.mu.Lock()
	p.clusters[name] = &releaseCluster{write: write, verdicts: map[string]admission.ReleaseVerdict{}}
	p.mu.Unlock()
	if p.opts.Rejudge != nil {
		p.opts.Rejudge(name)
	}
}

// Remove stops publishing for a cluster (what it published stays: the
// fleet removes the policy and its ConfigMap together).
func (p *Publisher) Remove(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.clusters, name)
	p.opts.Metrics.forget(name)
}

// Enrolled says whether a cluster's releases are published.
func (p *Publisher) Enrolled(name string) bool {
	return p.with(name, func(*releaseCluster) {})
}

// with calls f, under the lock, with an enrolled cluster; it says whether
// the cluster is enrolled.
func (p *Publisher) with(name string, f func(c *releaseCluster)) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.clusters[name]
	if c != nil {
		f(c)
	}
	return c != nil
}

// Judge judges one Node of an enrolled cluster again (a no-op for others).
func (p *Publisher) Judge(ctx context.Context, name string, node *unstructured.Unstructured) error {
	if !p.Enrolled(name) {
		return nil
	}
	nodes := []*unstructured.Unstructured{node}
	rs, err := p.opts.Judge(ctx, nodes, name, false)
	if err != nil {
		p.revoke(name, node.GetName())
		return fmt.Errorf("judge the release of Node %q: %w", node.GetName(), err)
	}
	v := admission.ReleaseVerdict{Node: node.GetName(), UID: string(rs[0].UID), Released: rs[0].Released, Blocker: rs[0].Blocker}
	if v.Released && !p.holds(name, v) {
		// New: confirm on fresh reads, and only while the caches are sound.
		if err := p.opts.Ready(); err != nil {
			p.revoke(name, v.Node)
			return nil
		}
		fresh, err := p.opts.Judge(ctx, nodes, name, true)
		if err != nil {
			p.revoke(name, v.Node)
			return fmt.Errorf("confirm the release of Node %q: %w", v.Node, err)
		}
		v.Released, v.Blocker = fresh[0].Released, fresh[0].Blocker
	}
	p.set(name, v)
	return nil
}

// holds says whether v's Node is released already, for its UID.
func (p *Publisher) holds(name string, v admission.ReleaseVerdict) (held bool) {
	p.with(name, func(c *releaseCluster) {
		have, ok := c.verdicts[v.Node]
		held = ok && have.Released && have.UID == v.UID
	})
	return held
}

func (p *Publisher) set(name string, v admission.ReleaseVerdict) {
	p.with(name, func(c *releaseCluster) {
		if have, ok := c.verdicts[v.Node]; !ok || have != v {
			c.verdicts[v.Node], c.dirty = v, true
		}
	})
}

// revoke records a Node as not released.
func (p *Publisher) revoke(name, node string) { p.set(name, admission.ReleaseVerdict{Node: node}) }

// Forget drops a Node that is gone.
func (p *Publisher) Forget(name, node string) {
	p.with(name, func(c *releaseCluster) {
		if _, ok := c.verdicts[node]; ok {
			delete(c.verdicts, node)
			c.dirty = true
		}
	})
}

// Synced says every Node of a cluster has been judged once: from now on
// its releases are written.
func (p *Publisher) Synced(name string) {
	p.with(name, func(c *releaseCluster) {
		c.dirty = c.dirty || !c.synced
		c.synced = true
	})
}

// Rewrite has a cluster's releases written again at the next Flush (the
// ConfigMap was deleted or edited there).
func (p *Publisher) Rewrite(name string) {
	p.with(name, func(c *releaseCluster) { c.dirty = true })
}

// Flush writes every synced cluster whose releases changed since its last
// write; a failed write is tried again at the next Flush.
func (p *Publisher) Flush(ctx context.Context) {
	type job struct {
		name     string
		c        *releaseCluster
		verdicts []admission.ReleaseVerdict
	}
	var jobs []job
	leading := p.opts.Leading == nil || p.opts.Leading()
	p.mu.Lock()
	if !leading {
		p.leading = false
		p.mu.Unlock()
		return
	}
	if !p.leading {
		// Another replica wrote meanwhile: write what this one judged.
		for _, c := range p.clusters {
			c.dirty = true
		}
		p.leading = true
	}
	for name, c := range p.clusters {
		if c.synced && c.dirty {
			c.dirty = false
			jobs = append(jobs, job{name: name, c: c, verdicts: valuesOf(c.verdicts)})
		}
	}
	p.mu.Unlock()
	for _, j := range jobs {
		cm, omitted, err := admission.PolicyParams(j.verdicts, p.opts.Limit)
		if err == nil {
			err = j.c.write(ctx, cm)
		}
		p.opts.Metrics.wrote(j.name, released(cm), omitted, err)
		if err != nil {
			p.mu.Lock()
			j.c.dirty = true
			p.mu.Unlock()
			p.opts.Log.Error("releases: cannot publish the released Nodes; trying again", "cluster", j.name, "error", err.Error())
			continue
		}
		if omitted > 0 {
			p.opts.Log.Warn("releases: too many released Nodes for one ConfigMap; those left out stay denied", "cluster", j.name, "omitted", omitted)
		}
	}
}

// released counts the Nodes a ConfigMap lists as released.
func released(cm *corev1.ConfigMap) int {
	if cm == nil {
		return 0
	}
	n := 0
	for k := range cm.Data {
		if !strings.HasPrefix(k, admission.BlockerPrefix) {
			n++
		}
	}
	return n
}

func valuesOf(m map[string]admission.ReleaseVerdict) []admission.ReleaseVerdict {
	out := make([]admission.ReleaseVerdict, 0, len(m))
	for v := range maps.Values(m) {
		out = append(out, v)
	}
	return out
}

// Run flushes every interval until ctx is done: the bound on the write rate
// per cluster, and on how long a verdict waits to be published.
func (p *Publisher) Run(ctx context.Context, interval time.Duration) {
	wait.UntilWithContext(ctx, p.Flush, interval)
}
