// Package differential checks that the enforcer, deciding on the few
// candidates its indexes pick from stripped objects, agrees with Gatekeeper's
// own engine deciding on the full inventory of full objects.
package differential

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/open-policy-agent/frameworks/constraint/pkg/apis/externaldata/unversioned"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/internal/gatekeeper"
	"github.com/nodeguard/nodeguard/internal/testpki"
	"github.com/nodeguard/nodeguard/policies"
)

var (
	scenarios = flag.Int("scenarios", 2000, "randomized scenarios per constraint variant")
	seed      = flag.Uint64("seed", 20261129, "random seed")
)

// variant is one Constraint: the committed one, and edits of its parameters.
type variant struct {
	name  string
	patch map[string]any
}

var variants = []variant{
	{name: "default"},
	{name: "scoped", patch: map[string]any{"clusterName": "c1", "clusterNamespace": "ns-a"}},
	{name: "allow-unverified", patch: map[string]any{"allowUnverifiedKinds": true}},
	{name: "exempt", patch: map[string]any{"exemptUsers": []any{"root"}, "exemptGroups": []any{"ops"}}},
}

func TestEnforcerAgreesWithGatekeeper(t *testing.T) {
	ctx := context.Background()
	tmpl, err := os.ReadFile("../../constraints/template.yaml")
	require.NoError(t, err)
	base, err := os.ReadFile("../../constraints/constraint.yaml")
	require.NoError(t, err)

	eval, err := rule.NewEngine(ctx)
	require.NoError(t, err)
	total := map[string]int{}
	for _, v := range variants {
		constraint, params := patchConstraint(t, base, v.patch)
		engine, err := gatekeeper.NewEngine(ctx, tmpl, constraint)
		require.NoError(t, err)
		rng := rand.New(rand.NewPCG(*seed, uint64(len(v.name))))
		for i := range *scenarios {
			s := generate(rng)
			gk := gatekeeperDecision(t, ctx, engine, s)
			ng := enforcerDecision(t, ctx, eval, params, s)
			if gk.allowed != ng.allowed || gk.blockers != ng.blockers || gk.unverified != ng.unverified {
				dump, _ := json.MarshalIndent(s, "", "  ")
				t.Fatalf("variant %s, scenario %d (seed %d) disagrees:\ngatekeeper: %+v\nenforcer:   %+v\nscenario: %s",
					v.name, i, *seed, gk, ng, dump)
			}
			total[v.name]++
			if gk.allowed {
				total["allowed"]++
			} else {
				total["denied"]++
			}
		}
	}
	fmt.Printf("differential: %d scenarios x %d constraint variants agree (%d allowed, %d denied), seed %d\n",
		*scenarios, len(variants), total["allowed"], total["denied"], *seed)
	// A generator that only ever allows (or denies) would prove nothing.
	require.Greater(t, total["allowed"], *scenarios/10)
	require.Greater(t, total["denied"], *scenarios/10)
}

// outcome is a decision reduced to what both engines must agree on.
type outcome struct {
	allowed    bool
	blockers   string // sorted, canonical JSON
	unverified string
}

func gatekeeperDecision(t *testing.T, ctx context.Context, engine *gatekeeper.Engine, s scenario) outcome {
	t.Helper()
	for _, o := range s.Objects {
		require.NoError(t, engine.AddObject(ctx, o))
	}
	defer func() {
		for _, o := range s.Objects {
			require.NoError(t, engine.RemoveObject(ctx, o))
		}
	}()
	violations, err := engine.ReviewDelete(ctx, s.Node, s.User)
	require.NoError(t, err)
	return outcomeOf(t, violations)
}

func enforcerDecision(t *testing.T, ctx context.Context, eval *rule.Engine, params map[string]any, s scenario) outcome {
	t.Helper()
	inv, err := facts.FromObjects(eval.Model(), s.Objects, groupKinds(params["infraMachineKinds"]), groupKinds(params["infraMachinePoolKinds"]))
	require.NoError(t, err)
	g, err := guard.New(ctx, inv, guard.Options{Parameters: params, Engine: eval})
	require.NoError(t, err)
	d, err := g.Decide(ctx, guard.Request{Node: s.Node, UserInfo: s.User})
	require.NoError(t, err)
	var blockers, unverified []any
	if !d.Allowed {
		// Gatekeeper reports blockers only as violations, i.e. when denied.
		blockers, unverified = asAny(t, d.Blockers), asAny(t, d.Unverified)
	}
	return outcome{allowed: d.Allowed, blockers: canonical(t, blockers), unverified: canonical(t, unverified)}
}

func asAny[T rule.Blocker | rule.Unverified](t *testing.T, items []T) []any {
	t.Helper()
	var out []any
	for _, item := range items {
		b, err := json.Marshal(item)
		require.NoError(t, err)
		var v any
		require.NoError(t, json.Unmarshal(b, &v))
		out = append(out, v)
	}
	return out
}

func canonical(t *testing.T, items []any) string {
	t.Helper()
	var keys []string
	for _, item := range items {
		b, err := json.Marshal(item) // map keys are sorted
		require.NoError(t, err)
		keys = append(keys, string(b))
	}
	sort.Strings(keys)
	b, err := json.Marshal(keys)
	require.NoError(t, err)
	return string(b)
}

func groupKinds(v any) []schema.GroupKind {
	var out []schema.GroupKind
	list, _ := v.([]any)
	for _, item := range list {
		m, _ := item.(map[string]any)
		g, _ := m["group"].(string)
		k, _ := m["kind"].(string)
		out = append(out, schema.GroupKind{Group: g, Kind: k})
	}
	return out
}

func patchConstraint(t *testing.T, base []byte, patch map[string]any) ([]byte, map[string]any) {
	t.Helper()
	var c map[string]any
	require.NoError(t, yaml.Unmarshal(base, &c))
	params := c["spec"].(map[string]any)["parameters"].(map[string]any)
	for k, v := range patch {
		params[k] = v
	}
	out, err := yaml.Marshal(c)
	require.NoError(t, err)
	return out, params
}

// --- Scenario generator -------------------------------------------------------

type scenario struct {
	Node    *unstructured.Unstructured   `json:"node"`
	User    authenticationv1.UserInfo    `json:"user"`
	Objects []*unstructured.Unstructured `json:"objects"`
}

type infraKind struct {
	group, version, kind string
}

var (
	namespaces = []string{"ns-a", "ns-b"}
	clusters   = []string{"c1", "c2"}
	nodeNames  = []string{"n0", "n1", "n2", "n3"} // few, so names collide across clusters
	infraKinds = []infraKind{
		{"infrastructure.cluster.x-k8s.io", "v1beta2", "DockerMachine"},
		{"infrastructure.cluster.x-k8s.io", "v1beta2", "AWSMachine"},
		{"vmware.infrastructure.cluster.x-k8s.io", "v1beta1", "VSphereMachine"},
		{"infrastructure.example.com", "v1", "FooMachine"}, // not in the default kinds: unverified
	}
	poolKinds = []infraKind{
		{"infrastructure.cluster.x-k8s.io", "v1beta2", "DockerMachinePool"},
		{"infrastructure.cluster.x-k8s.io", "v1beta2", "AWSManagedMachinePool"},
		{"infrastructure.example.com", "v1", "FooMachinePool"}, // not in the default kinds: unverified
	}
	poolNames = []string{"mp0", "mp1"}
)

func pick[T any](rng *rand.Rand, xs []T) T { return xs[rng.IntN(len(xs))] }

func providerID(rng *rand.Rand) string {
	if rng.IntN(4) == 0 {
		return ""
	}
	return fmt.Sprintf("docker:////%s", pick(rng, nodeNames))
}

func newObject(apiVersion, kind, ns, name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": apiVersion, "kind": kind,
		"metadata": map[string]any{"namespace": ns, "name": name, "uid": fmt.Sprintf("%s-%s-%s", kind, ns, name)},
	}}
}

func generate(rng *rand.Rand) scenario {
	var objs []*unstructured.Unstructured
	var machineNames [][2]string
	for i := range rng.IntN(6) {
		ns, cluster, name := pick(rng, namespaces), pick(rng, clusters), fmt.Sprintf("m%d", i)
		kind := pick(rng, infraKinds)
		infraName := name
		if rng.IntN(5) == 0 {
			infraName = fmt.Sprintf("i%d", rng.IntN(3))
		}
		v1beta1 := rng.IntN(2) == 0
		m := newObject("cluster.x-k8s.io/v1beta2", "Machine", ns, name)
		ref := map[string]any{"apiGroup": kind.group, "kind": kind.kind, "name": infraName}
		if v1beta1 {
			m.SetAPIVersion("cluster.x-k8s.io/v1beta1")
			ref = map[string]any{"apiVersion": kind.group + "/" + kind.version, "kind": kind.kind, "name": infraName, "namespace": ns}
			if rng.IntN(4) == 0 {
				delete(ref, "namespace")
			}
		}
		spec := map[string]any{"clusterName": cluster, "infrastructureRef": ref, "bootstrap": map[string]any{"dataSecretName": "x"}}
		if pid := providerID(rng); pid != "" {
			spec["providerID"] = pid
		}
		m.Object["spec"] = spec
		if rng.IntN(3) > 0 {
			nodeRef := map[string]any{"name": pick(rng, nodeNames)}
			if v1beta1 {
				nodeRef["apiVersion"], nodeRef["kind"] = "v1", "Node"
			}
			m.Object["status"] = map[string]any{"nodeRef": nodeRef, "phase": "Running"}
		}
		if rng.IntN(2) == 0 {
			m.SetLabels(map[string]string{"cluster.x-k8s.io/cluster-name": cluster, "unrelated": "x"})
		}
		if rng.IntN(4) == 0 { // a MachinePool Machine
			labels := m.GetLabels()
			if labels == nil {
				labels = map[string]string{}
			}
			labels["cluster.x-k8s.io/pool-name"] = pick(rng, poolNames)
			m.SetLabels(labels)
		}
		objs = append(objs, m)
		machineNames = append(machineNames, [2]string{ns, name})
		if rng.IntN(5) < 3 { // the InfraMachine still exists
			objs = append(objs, infra(rng, kind, ns, infraName, cluster))
		}
	}
	for i := range rng.IntN(3) { // orphans, linked by providerID at most
		objs = append(objs, infra(rng, pick(rng, infraKinds), pick(rng, namespaces), fmt.Sprintf("orphan%d", i), pick(rng, clusters)))
	}
	providerIDs := func() []any {
		var ids []any
		for range rng.IntN(3) {
			ids = append(ids, providerID(rng))
		}
		return ids
	}
	for _, name := range poolNames[:rng.IntN(len(poolNames)+1)] {
		ns, cluster, kind := pick(rng, namespaces), pick(rng, clusters), pick(rng, poolKinds)
		if rng.IntN(3) > 0 { // a MachinePool naming the pool, listing what it lists or lagging it
			mp := newObject("cluster.x-k8s.io/v1beta2", "MachinePool", ns, name)
			ref := map[string]any{"apiGroup": kind.group, "kind": kind.kind, "name": name}
			if rng.IntN(2) == 0 {
				mp.SetAPIVersion("cluster.x-k8s.io/v1beta1")
				ref = map[string]any{"apiVersion": kind.group + "/" + kind.version, "kind": kind.kind, "name": name, "namespace": ns}
			}
			mp.Object["spec"] = map[string]any{"clusterName": cluster, "providerIDList": providerIDs(),
				"template": map[string]any{"spec": map[string]any{"clusterName": cluster, "infrastructureRef": ref}}}
			labelCluster(rng, mp, cluster)
			objs = append(objs, mp)
		}
		if rng.IntN(3) > 0 { // the pool still exists
			p := newObject(kind.group+"/"+kind.version, kind.kind, ns, name)
			p.Object["spec"] = map[string]any{"providerIDList": providerIDs()}
			labelCluster(rng, p, cluster)
			objs = append(objs, p)
		}
	}
	objs = dedupe(objs)

	node := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": pick(rng, nodeNames)},
		"spec":     map[string]any{"providerID": providerID(rng)},
	}}
	if len(machineNames) > 0 && rng.IntN(2) == 0 {
		target := pick(rng, machineNames)
		ann := map[string]string{"cluster.x-k8s.io/cluster-namespace": target[0], "cluster.x-k8s.io/machine": target[1]}
		switch rng.IntN(4) {
		case 0: // tampered: points at a Machine that does not exist
			ann["cluster.x-k8s.io/machine"] = "ghost"
		case 1: // half removed
			delete(ann, "cluster.x-k8s.io/cluster-namespace")
		}
		node.SetAnnotations(ann)
	}
	user := authenticationv1.UserInfo{Username: pick(rng, []string{"alice", "root", "system:serviceaccount:capi-system:capi-controller-manager"}),
		Groups: []string{pick(rng, []string{"system:authenticated", "ops", "system:masters"})}}
	return scenario{Node: node, User: user, Objects: objs}
}

func infra(rng *rand.Rand, kind infraKind, ns, name, cluster string) *unstructured.Unstructured {
	o := newObject(kind.group+"/"+kind.version, kind.kind, ns, name)
	spec := map[string]any{"instanceType": "m6i.large"}
	if pid := providerID(rng); pid != "" {
		spec["providerID"] = pid
	}
	o.Object["spec"] = spec
	if rng.IntN(3) == 0 {
		o.SetFinalizers([]string{"infra.example/finalizer"})
		o.Object["metadata"].(map[string]any)["deletionTimestamp"] = "2026-11-29T10:00:00Z"
	}
	labelCluster(rng, o, cluster)
	return o
}

func labelCluster(rng *rand.Rand, o *unstructured.Unstructured, cluster string) {
	switch rng.IntN(3) {
	case 0:
		o.SetLabels(map[string]string{"cluster.x-k8s.io/cluster-name": cluster})
	case 1:
		o.SetLabels(map[string]string{"cluster.x-k8s.io/cluster-name": pick(rng, clusters)})
	}
}

// dedupe keeps the last object of each kind/namespace/name, as a cluster would.
func dedupe(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	idx := map[string]int{}
	var out []*unstructured.Unstructured
	for _, o := range objs {
		k := o.GetAPIVersion() + "/" + o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName()
		if i, ok := idx[k]; ok {
			out[i] = o
			continue
		}
		idx[k] = len(out)
		out = append(out, o)
	}
	return out
}

// --- Gatekeeper with nodeguard as external data provider ----------------------

// TestProviderAgreesWithTheEnforcer runs the K8sNodeGuardExternal template in
// Gatekeeper's engine, with external data enabled, against nodeguard's real
// provider routes over mTLS, answering from the scenario's objects: it must
// decide as the enforcer does, objects being deleted included (which
// Gatekeeper's sync would drop).
func TestProviderAgreesWithTheEnforcer(t *testing.T) {
	ctx := context.Background()
	tmpl, err := os.ReadFile("../../constraints/external-data/template.yaml")
	require.NoError(t, err)
	base, err := os.ReadFile("../../constraints/external-data/constraint.yaml")
	require.NoError(t, err)
	enforcerBase, err := os.ReadFile("../../constraints/constraint.yaml")
	require.NoError(t, err)
	eval, err := rule.NewEngine(ctx)
	require.NoError(t, err)
	compiled, err := policies.Compile()
	require.NoError(t, err)
	provided, err := policies.ProvidedParameters(ctx, compiled)
	require.NoError(t, err)
	facts := &scenarioFacts{}
	srv := startProvider(t, facts)

	total := map[string]int{}
	for _, v := range variants {
		_, params := patchConstraint(t, enforcerBase, v.patch)
		// What nodeguard is configured with, and what Gatekeeper's Constraint
		// holds: nodeguard's answer sets the provided parameters. A cluster
		// scope comes from the Provider's route, as for a workload cluster.
		ngParams, gkPatch, route := maps.Clone(params), map[string]any{}, "/externaldata"
		for k, val := range v.patch {
			if !slices.Contains(provided, k) {
				gkPatch[k] = val
			}
		}
		if ns, name := params["clusterNamespace"], params["clusterName"]; name != "" {
			route = fmt.Sprintf("/externaldata/clusters/%s/%s", ns, name)
			delete(ngParams, "clusterNamespace")
			delete(ngParams, "clusterName")
		}
		constraint, _ := patchConstraint(t, base, gkPatch)
		engine, err := gatekeeper.NewEngine(ctx, tmpl, constraint, gatekeeper.ExternalData(&unversioned.Provider{
			ObjectMeta: metav1.ObjectMeta{Name: "nodeguard"},
			Spec:       unversioned.ProviderSpec{URL: srv.url + route, Timeout: 5, CABundle: base64.StdEncoding.EncodeToString(srv.caPEM)},
		}, srv.clientCert, srv.clientKey))
		require.NoError(t, err)
		rng := rand.New(rand.NewPCG(*seed, uint64(len(v.name))))
		for i := range *scenarios {
			s := generate(rng)
			facts.set(providerGuard(t, ctx, eval, ngParams, s))
			violations, err := engine.ReviewDelete(ctx, s.Node, s.User)
			require.NoError(t, err)
			gk := outcomeOf(t, violations)
			ng := enforcerDecision(t, ctx, eval, params, s)
			if gk.allowed != ng.allowed || gk.blockers != ng.blockers || gk.unverified != ng.unverified {
				dump, _ := json.MarshalIndent(s, "", "  ")
				t.Fatalf("variant %s, scenario %d (seed %d) disagrees:\ngatekeeper+provider: %+v\nenforcer:   %+v\nviolations: %+v\nscenario: %s",
					v.name, i, *seed, gk, ng, violations, dump)
			}
			total[v.name]++
			if deleting(s) && !gk.allowed {
				total["denied with an object being deleted"]++
			}
			if gk.allowed {
				total["allowed"]++
			} else {
				total["denied"]++
			}
		}
	}
	fmt.Printf("differential: Gatekeeper with the provider agrees with the enforcer on %d scenarios x %d variants (%d allowed, %d denied, %d of them with an object being deleted), seed %d\n",
		*scenarios, len(variants), total["allowed"], total["denied"], total["denied with an object being deleted"], *seed)
	require.Greater(t, total["allowed"], *scenarios/10)
	require.Greater(t, total["denied"], *scenarios/10)
	require.Positive(t, total["denied with an object being deleted"], "the teardown window must be exercised")
}

func outcomeOf(t *testing.T, violations []gatekeeper.Violation) outcome {
	t.Helper()
	var blockers, unverified []any
	for _, v := range violations {
		require.NotContains(t, v.Details, "provider", "nodeguard failed to answer: %s", v.Msg)
		if b, ok := v.Details["blocker"]; ok {
			blockers = append(blockers, b)
		}
		if u, ok := v.Details["unverified"]; ok {
			unverified = append(unverified, u)
		}
	}
	return outcome{allowed: len(violations) == 0, blockers: canonical(t, blockers), unverified: canonical(t, unverified)}
}

func deleting(s scenario) bool {
	for _, o := range s.Objects {
		if o.GetDeletionTimestamp() != nil {
			return true
		}
	}
	return false
}

// providerGuard is the Guard nodeguard serve would have over the scenario's
// objects with params as its --constraint.
func providerGuard(t *testing.T, ctx context.Context, eval *rule.Engine, params map[string]any, s scenario) *guard.Guard {
	t.Helper()
	inv, err := facts.FromObjects(eval.Model(), s.Objects, groupKinds(params["infraMachineKinds"]), groupKinds(params["infraMachinePoolKinds"]))
	require.NoError(t, err)
	g, err := guard.New(ctx, inv, guard.Options{Parameters: params, Engine: eval})
	require.NoError(t, err)
	return g
}

// scenarioFacts answers from the current scenario's Guard.
type scenarioFacts struct {
	current atomic.Pointer[guard.Guard]
}

func (f *scenarioFacts) set(g *guard.Guard) { f.current.Store(g) }

func (f *scenarioFacts) Objects(ctx context.Context, node *unstructured.Unstructured, fresh bool) ([]*unstructured.Unstructured, error) {
	return f.current.Load().Objects(ctx, node, fresh)
}

func (f *scenarioFacts) RouteParameters(cluster string) (rule.Parameters, error) {
	return f.current.Load().RouteParameters(cluster)
}

func (f *scenarioFacts) Ready() error { return f.current.Load().Ready() }

func (f *scenarioFacts) Recovering() error { return f.current.Load().Recovering() }

func (f *scenarioFacts) Model() *rule.Model { return f.current.Load().Model() }

type providerServer struct {
	url                   string
	caPEM                 []byte
	clientCert, clientKey string
}

// startProvider serves nodeguard's provider routes over TLS, for clients
// with a certificate of their own CA, as nodeguard serve does for Gatekeeper.
func startProvider(t *testing.T, facts admission.ProviderFacts) providerServer {
	t.Helper()
	serving, gatekeeperCA := testpki.New(t), testpki.New(t)
	h, err := admission.NewProvider(admission.ProviderOptions{Facts: facts, ClientCAs: gatekeeperCA.Pool(), Intake: admission.NewIntake(admission.IntakeOptions{Timeout: 5 * time.Second})})
	require.NoError(t, err)
	url, _ := serving.Serve(t, h, admission.TLSOptions{ClientCAFiles: []string{gatekeeperCA.CAFile(t)}})
	dir := t.TempDir()
	certPEM, keyPEM := gatekeeperCA.Issue(t, 3, x509.ExtKeyUsageClientAuth)
	out := providerServer{url: url, clientCert: filepath.Join(dir, "tls.crt"), clientKey: filepath.Join(dir, "tls.key")}
	require.NoError(t, os.WriteFile(out.clientCert, certPEM, 0o600))
	require.NoError(t, os.WriteFile(out.clientKey, keyPEM, 0o600))
	out.caPEM, err = os.ReadFile(serving.CAFile(t))
	require.NoError(t, err)
	return out
}
