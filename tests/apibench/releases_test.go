//go:build e2e

package apibench

import (
	"context"
	"flag"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/fleet"
	"github.com/nodeguard/nodeguard/internal/localcluster"
)

var (
	releaseNodes = flag.Int("release-nodes", 200, "Machines of the workload cluster whose InfraMachines BenchmarkReleaseLatency deletes (a MachineDeployment scaled to 0)")
	releaseRate  = flag.Int("release-rate", 0, "InfraMachine deletes per second (0: all at once, as a MachineSet scaled to 0 deletes its Machines)")
	revokeNodes  = flag.Int("revoke-nodes", 50, "released Nodes whose InfraMachine is then created again, for the revocation window")
)

// BenchmarkReleaseLatency is mode admission-policy under a MachineDeployment
// scaled to 0: a management and a workload kube-apiserver, `nodeguard serve
// --fleet --fleet-admission-policy` as its own process, Cluster default/dev
// in the mode with -release-nodes Machines, DockerMachines and Nodes. The
// DockerMachines are deleted; each Node's release latency runs from its
// DockerMachine's delete returning to the Nodes watched in the workload
// cluster showing its release (the annotation holding its UID); every change
// of a Node's verdict is one write. Then -revoke-nodes DockerMachines come
// back: the revocation window runs from the create returning to the Node's
// release gone.
func BenchmarkReleaseLatency(b *testing.B) {
	if *binDir == "" {
		b.Skip("no kube-apiserver/etcd: run `make bench-apiserver` (it builds them with tests/e2e/tools/build.sh)")
	}
	ctx := context.Background()
	bin := buildNodeguard(b)
	mgmtEnv, mgmtCfg := apiServer(b)
	wEnv, wCfg := apiServer(b)
	mgmt, err := kubernetes.NewForConfig(mgmtCfg)
	require.NoError(b, err)
	dyn, err := dynamic.NewForConfig(mgmtCfg)
	require.NoError(b, err)
	workload, err := kubernetes.NewForConfig(wCfg)
	require.NoError(b, err)
	n := *releaseNodes
	start := time.Now()
	workloadCluster(b, dyn, mgmt, wEnv, n)
	nodes(b, workload, n)
	fmt.Printf("release latency: %d Machines, DockerMachines and Nodes created in %s\n", n, time.Since(start).Round(time.Second))

	ng := startNodeguard(b, mgmtEnv, mgmt, bin, strings.Fields(*nodeguardArgs), asFleet)
	defer ng.stop()
	info, err := admission.LoadPolicyInfo()
	require.NoError(b, err)
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		err = workload.CoreV1().Nodes().Delete(ctx, nodeName(0), metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+info.Name+"'"), nil
	})
	require.NoError(b, err, "the workload cluster never guarded by the policy")

	seen := watchReleases(b, workload, info)
	infra := localcluster.Current().GVR("infrastructure.cluster.x-k8s.io", "dockermachines")
	deleted := each(b, n, *releaseRate, func(i int) error {
		return dyn.Resource(infra).Namespace("default").Delete(ctx, nodeName(i), metav1.DeleteOptions{})
	})
	released := seen.wait(b, n, true, 2*time.Minute)
	lat := latencies(deleted, released)
	writes, busiest := seen.writes(deleted[0].at, lastOf(released))
	window := lastOf(released).Sub(deleted[0].at)

	k := min(*revokeNodes, n)
	created := each(b, k, *releaseRate, func(i int) error {
		_, d := fleetObjects(i)
		_, err := localcluster.Apply(ctx, dyn, infra, d)
		return err
	})
	revoked := seen.wait(b, k, false, time.Minute)
	rev := latencies(created, revoked)

	// The scale-down runs once, here: a parent benchmark with a
	// sub-benchmark runs once, whatever -benchtime says.
	b.Run(fmt.Sprintf("nodes=%d/rate=%d", n, *releaseRate), func(b *testing.B) {
		b.ReportMetric(ms(percentile(lat, 50)), "release-p50-ms")
		b.ReportMetric(ms(percentile(lat, 99)), "release-p99-ms")
		b.ReportMetric(float64(writes)/window.Seconds(), "writes/s")
		b.ReportMetric(float64(busiest), "busiest-s-writes")
		b.ReportMetric(ms(percentile(rev, 50)), "revoke-p50-ms")
		b.ReportMetric(ms(percentile(rev, 99)), "revoke-p99-ms")
	})
	fmt.Printf("release latency: %d InfraMachines deleted (rate %d/s, 0: at once): released p50 %.0f ms, p99 %.0f ms, max %.0f ms; "+
		"%d verdicts written in %s (%.1f/s, at most %d in one second); %d created again: revoked p50 %.0f ms, p99 %.0f ms\n",
		n, *releaseRate, ms(percentile(lat, 50)), ms(percentile(lat, 99)), ms(percentile(lat, 100)),
		writes, window.Round(time.Millisecond), float64(writes)/window.Seconds(), busiest,
		k, ms(percentile(rev, 50)), ms(percentile(rev, 99)))
}

func nodeName(i int) string { return fmt.Sprintf("md-0-%06d", i) }

// fleetObjects are Machine i and its DockerMachine (see objects) in
// Cluster default/dev.
func fleetObjects(i int) (machine, docker map[string]any) {
	machine, docker = objects(i)
	for _, o := range []map[string]any{machine, docker} {
		meta := o["metadata"].(map[string]any)
		meta["namespace"] = "default"
		meta["labels"].(map[string]any)["cluster.x-k8s.io/cluster-name"] = "dev"
	}
	machine["spec"].(map[string]any)["clusterName"] = "dev"
	return machine, docker
}

// workloadCluster creates Cluster default/dev in mode admission-policy
// (paused: no CAPI manager runs here), its kubeconfig Secret for the
// workload API server, and n Machines with their DockerMachines.
func workloadCluster(b *testing.B, dyn dynamic.Interface, mgmt kubernetes.Interface, wEnv *envtest.Environment, n int) {
	ctx := context.Background()
	r := localcluster.Current()
	_, err := localcluster.Apply(ctx, dyn, r.GVR("cluster.x-k8s.io", "clusters"), map[string]any{
		"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
		"metadata": map[string]any{"namespace": "default", "name": "dev", "annotations": map[string]any{fleet.ModeAnnotation: fleet.ModeAdmissionPolicy}},
		"spec":     map[string]any{"paused": true}})
	require.NoError(b, err)
	user, err := wEnv.AddUser(envtest.User{Name: "kubernetes-admin", Groups: []string{"system:masters"}}, nil)
	require.NoError(b, err)
	kubeconfig, err := user.KubeConfig()
	require.NoError(b, err)
	_, err = mgmt.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "dev-kubeconfig", Labels: map[string]string{"cluster.x-k8s.io/cluster-name": "dev"}},
		Data:       map[string][]byte{"value": kubeconfig}}, metav1.CreateOptions{})
	require.NoError(b, err)
	machines, infra := r.GVR("cluster.x-k8s.io", "machines"), r.GVR("infrastructure.cluster.x-k8s.io", "dockermachines")
	each(b, n, 0, func(i int) error {
		m, d := fleetObjects(i)
		if _, err := localcluster.Apply(ctx, dyn, infra, d); err != nil {
			return err
		}
		_, err := localcluster.Apply(ctx, dyn, machines, m)
		return err
	})
}

// nodes creates the n Nodes of the workload cluster, as CAPI leaves them:
// annotated with their Machine, with its providerID.
func nodes(b *testing.B, workload kubernetes.Interface, n int) {
	each(b, n, 0, func(i int) error {
		_, err := workload.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName(i),
			Annotations: map[string]string{"cluster.x-k8s.io/cluster-name": "dev", "cluster.x-k8s.io/cluster-namespace": "default", "cluster.x-k8s.io/machine": nodeName(i)}},
			Spec: corev1.NodeSpec{ProviderID: "docker:////" + nodeName(i)}}, metav1.CreateOptions{})
		return err
	})
}

// done is when one of each's calls returned.
type done struct {
	node string
	at   time.Time
}

// each calls f for 0..n-1, rate a second (0: 16 at a time, at once), and
// returns when each call returned, in order of i; it fails b on the first
// error.
func each(b *testing.B, n, rate int, f func(i int) error) []done {
	out := make([]done, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 16)
	var tick <-chan time.Time
	if rate > 0 {
		t := time.NewTicker(time.Second / time.Duration(rate))
		defer t.Stop()
		tick = t.C
	}
	for i := range n {
		if tick != nil {
			<-tick
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := f(i); err != nil {
				errs <- fmt.Errorf("%s: %w", nodeName(i), err)
				return
			}
			out[i] = done{node: nodeName(i), at: time.Now()}
		}()
	}
	wg.Wait()
	close(errs)
	require.NoError(b, <-errs)
	return out
}

// releases follows the verdicts on the workload cluster's Nodes through a
// watch: when each Node was first seen released and first seen not released
// after that, and when each write (a change of a Node's verdict) arrived.
type releases struct {
	mu       sync.Mutex
	listed   map[string]time.Time
	unlisted map[string]time.Time
	verdicts map[string]admission.ReleaseVerdict
	events   []time.Time
}

func watchReleases(b *testing.B, workload kubernetes.Interface, info admission.PolicyInfo) *releases {
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	w, err := workload.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{})
	require.NoError(b, err)
	r := &releases{listed: map[string]time.Time{}, unlisted: map[string]time.Time{}, verdicts: map[string]admission.ReleaseVerdict{}}
	go func() {
		for ev := range w.ResultChan() {
			n, ok := ev.Object.(*corev1.Node)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			now := time.Now()
			v := admission.VerdictOf(info, n.Annotations)
			r.mu.Lock()
			if before, ok := r.verdicts[n.Name]; ok && before != v {
				r.events = append(r.events, now)
			}
			r.verdicts[n.Name] = v
			_, listed := r.listed[n.Name]
			switch released := v.UID == string(n.UID); {
			case released && !listed:
				r.listed[n.Name] = now
			case !released && listed:
				if _, ok := r.unlisted[n.Name]; !ok {
					r.unlisted[n.Name] = now
				}
			}
			r.mu.Unlock()
		}
	}()
	return r
}

// wait waits until the first n Nodes are listed (or, !listed, unlisted
// again) and returns when each was.
func (r *releases) wait(b *testing.B, n int, listed bool, timeout time.Duration) []done {
	var out []done
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		m := r.listed
		if !listed {
			m = r.unlisted
		}
		out = out[:0]
		for i := range n {
			at, ok := m[nodeName(i)]
			if !ok {
				return false, nil
			}
			out = append(out, done{node: nodeName(i), at: at})
		}
		return true, nil
	})
	require.NoError(b, err, "%d Nodes never all seen (listed %v)", n, listed)
	return out
}

// writes counts the writes from from to to, and the most in one second.
func (r *releases) writes(from, to time.Time) (total, busiest int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var in []time.Time
	for _, t := range r.events {
		if !t.Before(from) && !t.After(to) {
			in = append(in, t)
		}
	}
	for i := range in {
		j := sort.Search(len(in), func(j int) bool { return in[j].Sub(in[i]) >= time.Second })
		busiest = max(busiest, j-i)
	}
	return len(in), busiest
}

// latencies pairs each action with when its effect was seen.
func latencies(actions, seen []done) []time.Duration {
	out := make([]time.Duration, len(actions))
	for i := range actions {
		out[i] = seen[i].at.Sub(actions[i].at)
	}
	return out
}

func lastOf(ds []done) time.Time {
	var last time.Time
	for _, d := range ds {
		if d.at.After(last) {
			last = d.at
		}
	}
	return last
}
