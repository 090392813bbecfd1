// This file writes, for each workload cluster in mode admission-policy, the
// rule's verdict on each Node as its annotations (admission.VerdictPatch),
// which the ValidatingAdmissionPolicy there compares (admission.BuildPolicies).
// The orphan scan's triggers drive it: every change of a Node, or of anything
// that could link one, has the Node judged again (Judge).
//
// A Node is released only when fresh reads of everything the rule reads for
// it confirm the caches' verdict; a release is revoked on the first verdict
// that does not release, from the caches alone. While the management
// cluster's caches are not ready nothing new is released. Confirmations and
// writes run in a pool of workers, one Node at a time each; a confirmation
// that a later verdict overtook is dropped, so it never undoes a revocation.
// A Node is written only when the verdict on it differs from what it carries
// (its annotations, as the Node cache keeps them): one PATCH a change, none a
// judgment.

package nodes

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/rule"
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
	// again (Scanner.JudgeCluster).
	Rejudge func(cluster string)
	// Leading, when set, says whether this replica writes: a replica that
	// does not lead judges as the leader does but writes nothing, so when it
	// starts leading it writes every verdict that differs at once.
	Leading func() bool
	// Info names the verdict's annotations.
	Info admission.PolicyInfo
	// Workers confirm releases and write verdicts at once (default 8): a
	// burst of releases waits for fresh reads and writes in parallel.
	Workers int
	Log     *slog.Logger
	// Metrics, when set, counts the writes and the Nodes released.
	Metrics *ReleaseMetrics
	// DecisionLog, when set, gets each verdict written (a release, a
	// revocation, a blocker's message).
	DecisionLog *rule.DecisionLog
}

// WriteVerdict writes the verdict on one Node of a workload cluster.
type WriteVerdict func(ctx context.Context, node string, v admission.ReleaseVerdict) error

// Publisher keeps the verdicts on the Nodes of the clusters enrolled; safe
// for concurrent use.
type Publisher struct {
	opts PublisherOptions
	loop *kube.Loop[nodeKey]

	mu       sync.Mutex
	clusters map[string]*releaseCluster
	leading  bool // as last looked at
}

type releaseCluster struct {
	write    WriteVerdict
	nodes    map[string]*nodeVerdict
	synced   bool // every Node judged once
	released int  // Nodes carrying a release
}

// nodeVerdict is one Node's verdict: want is what the rule says, have what
// the Node carries.
type nodeVerdict struct {
	want, have admission.ReleaseVerdict
	// gen counts the verdicts from the caches: a confirmation started at an
	// earlier one is stale.
	gen uint64
	// confirm is the Node whose release the caches found, to confirm on
	// fresh reads (nil: none).
	confirm *unstructured.Unstructured
}

// NewPublisher returns a Publisher with no cluster enrolled.
func NewPublisher(opts PublisherOptions) (*Publisher, error) {
	if opts.Judge == nil || opts.Ready == nil {
		return nil, fmt.Errorf("releases: a Judge and the caches' readiness are required")
	}
	if opts.Info.Released == "" || opts.Info.Blocker == "" {
		return nil, fmt.Errorf("releases: the verdict's annotations are required")
	}
	kube.SetDefault(&opts.Workers, 16)
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	p := &Publisher{opts: opts, clusters: map[string]*releaseCluster{}}
	p.loop = kube.NewLoop(kube.LoopOptions{Name: "releases", Workers: opts.Workers, BaseBackoff: 100 * time.Millisecond, MaxBackoff: 30 * time.Second}, p.reconcile)
	return p, nil
}

// Enroll writes the verdicts on a cluster's Nodes with write, from scratch:
// its Nodes are judged again.
func (p *Publisher) Enroll(name string, write WriteVerdict) {
	p.mu.Lock()
	p.clusters[name] = &releaseCluster{write: write, nodes: map[string]*nodeVerdict{}}
	p.mu.Unlock()
	if p.opts.Rejudge != nil {
		p.opts.Rejudge(name)
	}
}

// Remove stops writing verdicts in a cluster (those written stay: no policy
// reads them once the fleet removed it).
func (p *Publisher) Remove(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.clusters, name)
	p.opts.Metrics.forget(name)
}

// Enrolled says whether a cluster's verdicts are written.
func (p *Publisher) Enrolled(name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.clusters[name] != nil
}

// Settled says whether every Node of a cluster was judged, and none carries
// a release the rule does not (yet) confirm: the delete policy may be bound.
func (p *Publisher) Settled(name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.clusters[name]
	if c == nil || !c.synced {
		return false
	}
	for _, n := range c.nodes {
		if n.have.UID != "" && n.have.UID != n.want.UID {
			return false
		}
	}
	return true
}

// Judge judges one Node of an enrolled cluster again (a no-op for others).
func (p *Publisher) Judge(ctx context.Context, name string, node *unstructured.Unstructured) error {
	if !p.Enrolled(name) {
		return nil
	}
	rs, err := p.opts.Judge(ctx, []*unstructured.Unstructured{node}, name, false)
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.clusters[name]
	if c == nil {
		return nil
	}
	n := c.nodes[node.GetName()]
	if n == nil {
		n = &nodeVerdict{}
		c.nodes[node.GetName()] = n
	}
	c.carries(n, admission.VerdictOf(p.opts.Info, node.GetAnnotations()))
	n.gen++
	n.confirm = nil
	uid := string(node.GetUID())
	switch {
	case err != nil:
		n.want = admission.ReleaseVerdict{}
		err = fmt.Errorf("judge the release of Node %q: %w", node.GetName(), err)
	case !rs[0].Released:
		n.want = admission.Verdict(uid, false, rs[0].Blocker)
	case n.want.UID == uid:
		// Released already, for this Node.
	case p.opts.Ready() != nil:
		n.want = admission.ReleaseVerdict{}
	default:
		// New: confirmed on fresh reads before it is written.
		n.confirm = node
		if n.want.UID != "" {
			n.want = admission.ReleaseVerdict{} // an earlier Node's under this name
		}
	}
	if n.confirm != nil || n.want != n.have {
		p.loop.Add(nodeKey{name, node.GetName()})
	}
	return err
}

// Carries records what a Node of an enrolled cluster carries now, as its
// cache says, when only nodeguard's verdicts on it changed (a write of this
// replica's or the leader's): nothing judged changed, so nothing is judged
// again. A Node not carrying the verdict wanted is written again.
func (p *Publisher) Carries(name string, node *unstructured.Unstructured) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.clusters[name]
	n := c.node(node.GetName())
	if n == nil {
		return // not judged yet: its judgment reads what it carries
	}
	c.carries(n, admission.VerdictOf(p.opts.Info, node.GetAnnotations()))
	p.opts.Metrics.released(name, c.released)
	if n.confirm == nil && n.want != n.have {
		p.loop.Add(nodeKey{name, node.GetName()})
	}
}

// Verdicts are the paths of the verdicts on a Node
// (facts.NodeWatchOptions.Verdicts).
func (p *Publisher) Verdicts() []rule.Path { return p.opts.Info.VerdictPaths() }

// carries records what a Node carries, as its cache or a write says.
func (c *releaseCluster) carries(n *nodeVerdict, have admission.ReleaseVerdict) {
	if (n.have.UID != "") != (have.UID != "") {
		if have.UID != "" {
			c.released++
		} else {
			c.released--
		}
	}
	n.have = have
}

// Forget drops a Node that is gone.
func (p *Publisher) Forget(name, node string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.clusters[name]; c != nil {
		if n := c.nodes[node]; n != nil {
			c.carries(n, admission.ReleaseVerdict{})
			delete(c.nodes, node)
		}
	}
}

// Synced says every Node of a cluster has been judged once.
func (p *Publisher) Synced(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.clusters[name]; c != nil {
		c.synced = true
	}
}

// reconcile confirms a Node's release, if one waits, and writes the verdict
// on it if it differs from what it carries.
func (p *Publisher) reconcile(ctx context.Context, k nodeKey) kube.Result {
	p.mu.Lock()
	c := p.clusters[k.cluster]
	n := c.node(k.node)
	if n == nil {
		p.mu.Unlock()
		return kube.Result{}
	}
	if node, gen := n.confirm, n.gen; node != nil {
		p.mu.Unlock()
		rs, err := p.opts.Judge(ctx, []*unstructured.Unstructured{node}, k.cluster, true)
		p.mu.Lock()
		if c.node(k.node) != n || n.gen != gen {
			p.mu.Unlock()
			return kube.Result{} // overtaken: the later verdict queued the Node again
		}
		n.confirm = nil
		if err != nil {
			p.opts.Log.Error("releases: a release could not be confirmed; the Node is not released", "cluster", k.cluster, "node", k.node, "error", err.Error())
			n.want = admission.ReleaseVerdict{}
		} else {
			n.want = admission.Verdict(string(node.GetUID()), rs[0].Released, rs[0].Blocker)
		}
	}
	want, have, write := n.want, n.have, c.write
	p.mu.Unlock()
	if want == have || !p.leads() {
		return kube.Result{}
	}
	err := write(ctx, k.node, want)
	p.opts.Metrics.wrote(k.cluster, err)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			p.opts.Log.Error("releases: cannot write the verdict on a Node; trying again", "cluster", k.cluster, "node", k.node, "error", err.Error())
		}
		return kube.Result{Retry: c.node(k.node) == n}
	}
	if c.node(k.node) == n {
		c.carries(n, want)
		p.opts.Metrics.released(k.cluster, c.released)
	}
	if p.opts.DecisionLog.Enabled() {
		change := "revoked"
		if want.UID != "" {
			change = "released"
		}
		p.opts.DecisionLog.Log(rule.DecisionEvent{Path: rule.ReleaseEntry.Path(), Input: map[string]any{"cluster": k.cluster, "node": k.node},
			Result: map[string]any{"released": want.UID != "", "uid": want.UID, "blocker": want.Blocker}, Custom: map[string]any{"written": change}})
	}
	return kube.Result{}
}

// node is a Node's verdict in an enrolled cluster (nil: none; c may be nil).
func (c *releaseCluster) node(name string) *nodeVerdict {
	if c == nil {
		return nil
	}
	return c.nodes[name]
}

// leads says whether this replica writes; when it starts to, every Node
// whose verdict differs from what it carries is queued.
func (p *Publisher) leads() bool {
	leading := p.opts.Leading == nil || p.opts.Leading()
	p.mu.Lock()
	defer p.mu.Unlock()
	if leading && !p.leading {
		for name, c := range p.clusters {
			for node, n := range c.nodes {
				if n.want != n.have || n.confirm != nil {
					p.loop.Add(nodeKey{name, node})
				}
			}
		}
	}
	p.leading = leading
	return leading
}

// Run confirms and writes until ctx is done, and looks every interval
// whether this replica started leading.
func (p *Publisher) Run(ctx context.Context, interval time.Duration) {
	var wg sync.WaitGroup
	wg.Go(func() { p.loop.Run(ctx) })
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case <-t.C:
			p.leads()
		}
	}
}
