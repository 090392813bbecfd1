package guard_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/policies"
)

// With no grace given, the Finder judges with the policy's default_grace,
// read from the Rego, not a copy of it.
func TestTheDefaultGraceIsThePolicys(t *testing.T) {
	ctx := context.Background()
	c, err := policies.Compile()
	require.NoError(t, err)
	rs, err := rego.New(rego.Query("data.nodeguard.orphans.default_grace"), rego.Compiler(c)).Eval(ctx)
	require.NoError(t, err)
	require.Len(t, rs, 1)
	want, err := time.ParseDuration(rs[0].Expressions[0].Value.(string))
	require.NoError(t, err)
	e, err := rule.NewEngine(ctx)
	require.NoError(t, err)
	assert.Equal(t, want, e.DefaultGrace())
	inv, err := facts.FromObjects(rule.MustEmbeddedModel(), nil, nil, nil)
	require.NoError(t, err)
	g, err := guard.New(ctx, inv, guard.Options{Engine: e})
	require.NoError(t, err)
	f, err := guard.NewFinder(guard.FinderOptions{Guard: g, Inventory: inv})
	require.NoError(t, err)
	assert.Equal(t, want, f.Grace())
	f, err = guard.NewFinder(guard.FinderOptions{Guard: g, Inventory: inv, Grace: time.Hour})
	require.NoError(t, err)
	assert.Equal(t, time.Hour, f.Grace(), "a grace given wins")
}

func TestTheCriteriaReadEveryInput(t *testing.T) {
	ctx := context.Background()
	e, err := rule.NewEngine(ctx)
	require.NoError(t, err)
	orphan := func(in guard.CriteriaInput) (guard.OrphanVerdict, error) {
		return rule.Run[guard.OrphanVerdict](ctx, e, rule.OrphanEntry, in.Fields())
	}
	node := map[string]any{
		"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": "n", "annotations": map[string]any{
			"cluster.x-k8s.io/cluster-name": "dev", "cluster.x-k8s.io/cluster-namespace": "default", "cluster.x-k8s.io/machine": "m",
		}},
		"spec":   map[string]any{"providerID": "docker:////n"},
		"status": map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": "Unknown", "lastTransitionTime": "2026-11-30T11:00:00Z"}}},
	}
	// A DockerMachine of another host: the cluster uses docker:// providerIDs.
	inv := map[string]any{"namespace": map[string]any{"default": map[string]any{"infrastructure.cluster.x-k8s.io/v1beta2": map[string]any{
		"DockerMachine": map[string]any{"other": map[string]any{"metadata": map[string]any{"name": "other"}, "spec": map[string]any{"providerID": "docker:////other"}}},
	}}}}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	v, err := orphan(guard.CriteriaInput{Node: node, Inventory: inv, Now: now, Grace: 59 * time.Minute})
	require.NoError(t, err)
	assert.True(t, v.Orphan)
	assert.Equal(t, "default/m", v.Machine)
	assert.Equal(t, "default/dev", v.Cluster)
	assert.Empty(t, v.Kept)
	v, err = orphan(guard.CriteriaInput{Node: node, Inventory: inv, Now: now, Grace: 61 * time.Minute})
	require.NoError(t, err)
	assert.False(t, v.Orphan)
	// Without the evidence, the absence of a DockerMachine proves nothing.
	v, err = orphan(guard.CriteriaInput{Node: node, Now: now, Grace: 59 * time.Minute})
	require.NoError(t, err)
	assert.False(t, v.Orphan)
	// A clock an hour behind sees the Node NotReady for no time at all.
	v, err = orphan(guard.CriteriaInput{Node: node, Inventory: inv, Now: now.Add(-time.Hour), Grace: time.Second})
	require.NoError(t, err)
	assert.False(t, v.Orphan)
}

// finderOver is a Finder over testdata/ whose Guard decides with eval.
func finderOver(t *testing.T, eval *rule.Engine) (*guard.Finder, []*unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	objs, err := facts.LoadManifests("testdata")
	require.NoError(t, err)
	var nodes []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "Node" {
			nodes = append(nodes, o)
		}
	}
	infra, pools, err := eval.Kinds(nil)
	require.NoError(t, err)
	inv, err := facts.FromObjects(eval.Model(), objs, infra, pools)
	require.NoError(t, err)
	g, err := guard.New(ctx, inv, guard.Options{Engine: eval})
	require.NoError(t, err)
	f, err := guard.NewFinder(guard.FinderOptions{Guard: g, Inventory: inv})
	require.NoError(t, err)
	return f, nodes
}

// embeddedFinder is finderOver the embedded policy, that policy, and the
// time testdata/'s Nodes are judged at.
func embeddedFinder(t *testing.T) (*rule.Engine, *guard.Finder, []*unstructured.Unstructured, time.Time) {
	t.Helper()
	embedded, err := rule.NewEngine(context.Background())
	require.NoError(t, err)
	f, nodes := finderOver(t, embedded)
	return embedded, f, nodes, time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
}

func orphanNames(vs []guard.OrphanVerdict) []string {
	var out []string
	for _, v := range vs {
		if v.Orphan {
			out = append(out, v.Node)
		}
	}
	return out
}

// everyNodeAnOrphan compiles a copy of the policies whose verdict calls
// every Node an orphan: a policy no one would ship, but one the Finder must
// follow, as it follows a bundle.
func everyNodeAnOrphan(t *testing.T) *rule.Engine {
	t.Helper()
	files, err := policies.All()
	require.NoError(t, err)
	modules := sources(files)
	src := modules["nodeguard/orphans/orphans.rego"]
	require.Contains(t, src, `"orphan": count(kept) == 0,`)
	modules["nodeguard/orphans/orphans.rego"] = strings.Replace(src, `"orphan": count(kept) == 0,`, `"orphan": true,`, 1)
	return bundleOf(t, modules)
}

func sources(files []policies.File) map[string]string {
	modules := map[string]string{}
	for _, f := range files {
		modules[f.Path] = f.Source
	}
	return modules
}

// bundleOf compiles Rego sources as a bundle's policy is.
func bundleOf(t *testing.T, modules map[string]string) *rule.Engine {
	t.Helper()
	compiled, err := ast.CompileModulesWithOpt(modules, ast.CompileOpts{ParserOptions: ast.ParserOptions{RegoVersion: ast.RegoV1}})
	require.NoError(t, err)
	eval, err := rule.CompileEngine(context.Background(), compiled, nil, rule.Policy{Source: rule.SourceBundle, Revision: "test"})
	require.NoError(t, err, "the webhook runs on it")
	return eval
}

// The orphan criteria run on the Guard's policy: a bundle's, and after a
// hot reload the new one's, never a copy of the embedded rule.
func TestFinderJudgesWithTheGuardsPolicy(t *testing.T) {
	ctx := context.Background()
	embedded, f, nodes, now := embeddedFinder(t)
	vs, err := f.Scan(ctx, nodes, "", now)
	require.NoError(t, err)
	assert.Equal(t, []string{"dev-md-0-left"}, orphanNames(vs))

	bundle, _ := finderOver(t, everyNodeAnOrphan(t))
	vs, err = bundle.Scan(ctx, nodes, "", now)
	require.NoError(t, err)
	assert.Len(t, orphanNames(vs), len(nodes), "the bundle's criteria, not the embedded ones")

	require.NoError(t, embedded.Replace(everyNodeAnOrphan(t)))
	vs, err = f.Scan(ctx, nodes, "", now)
	require.NoError(t, err)
	assert.Len(t, orphanNames(vs), len(nodes), "a reloaded policy is followed at once")
}

// A policy without the orphan entry points (a bundle of an older release)
// cannot run the scan: said at start, not per Node.
func TestAPolicyWithoutOrphanCriteriaIsRefused(t *testing.T) {
	files, err := policies.Library()
	require.NoError(t, err)
	entry, err := policies.Read(policies.EnforcerEntry)
	require.NoError(t, err)
	eval := bundleOf(t, sources(append(files, entry)))
	inv, err := facts.FromObjects(eval.Model(), nil, nil, nil)
	require.NoError(t, err)
	g, err := guard.New(context.Background(), inv, guard.Options{Engine: eval})
	require.NoError(t, err)
	_, err = guard.NewFinder(guard.FinderOptions{Guard: g, Inventory: inv})
	assert.ErrorContains(t, err, "has no orphan criteria")
	embedded, err := rule.NewEngine(context.Background())
	require.NoError(t, err)
	assert.ErrorContains(t, embedded.Replace(eval), "orphan criteria", "a reload may not drop what the scan runs on")
}

func TestScreenSaysWhatTheNodeAloneDecides(t *testing.T) {
	ctx := context.Background()
	_, f, nodes, now := embeddedFinder(t)
	byName := map[string]*unstructured.Unstructured{}
	for _, n := range nodes {
		byName[n.GetName()] = n
	}
	r, err := f.Route("")
	require.NoError(t, err)
	s, err := f.Screen(ctx, r, byName["dev-md-0-ready"], now)
	require.NoError(t, err)
	assert.Equal(t, guard.Screen{}, s, "Ready: kept, until it changes")
	// Not Ready since 11:58: the grace alone keeps it, until 12:03.
	s, err = f.Screen(ctx, r, byName["dev-md-0-recent"], now)
	require.NoError(t, err)
	assert.Equal(t, guard.Screen{RecheckAt: time.Date(2026, 11, 30, 12, 3, 0, 0, time.UTC)}, s)
	// Passes; its Machine keeps it, which only the full criteria see.
	s, err = f.Screen(ctx, r, byName["dev-md-0-deleting"], now)
	require.NoError(t, err)
	assert.Equal(t, guard.Screen{Passes: true}, s)
	// Judged for another Cluster, it is not that Cluster's.
	other, err := f.Route("default/other")
	require.NoError(t, err)
	s, err = f.Screen(ctx, other, byName["dev-md-0-deleting"], now)
	require.NoError(t, err)
	assert.False(t, s.Passes)
}

// A Node is released exactly when the rule lets anyone delete it, with the
// rule's text for one in teardown; on the Guard's policy, as orphans are.
func TestReleasesAreTheRulesVerdictForAnyone(t *testing.T) {
	ctx := context.Background()
	_, f, nodes, _ := embeddedFinder(t)
	rs, err := f.Releases(ctx, nodes, "", false)
	require.NoError(t, err)
	got := map[string]guard.Release{}
	for i, n := range nodes {
		got[n.GetName()] = rs[i]
		assert.Equal(t, n.GetUID(), rs[i].UID)
	}
	assert.True(t, got["dev-md-0-left"].Released, "nothing linked is left")
	assert.False(t, got["dev-md-0-infra"].Released, "its DockerMachine exists")
	assert.Empty(t, got["dev-md-0-infra"].Blocker, "a running Node publishes no text")
	assert.False(t, got["dev-md-0-deleting"].Released)
	assert.Contains(t, got["dev-md-0-deleting"].Blocker, "DockerMachine default/dev-md-0-deleting")
}

// With a tombstone of its providerID, a Node alive since what carried it
// went is a ghost, never an orphan; a registration with it is refused unless
// something links it again. The Finder passes the tombstone to every entry
// point and evaluates none of the ghost's without one.
func TestTheFinderJudgesGhostsAndRegistrationsWithTheTombstones(t *testing.T) {
	ctx := context.Background()
	embedded, _, nodes, now := embeddedFinder(t)
	byName := map[string]*unstructured.Unstructured{}
	for _, n := range nodes {
		byName[n.GetName()] = n
	}
	objs, err := facts.LoadManifests("testdata")
	require.NoError(t, err)
	infra, pools, err := embedded.Kinds(nil)
	require.NoError(t, err)
	inv, err := facts.FromObjects(embedded.Model(), objs, infra, pools)
	require.NoError(t, err)
	g, err := guard.New(ctx, inv, guard.Options{Engine: embedded})
	require.NoError(t, err)
	store := facts.NewTombstones(facts.TombstoneOptions{Window: 7 * 24 * time.Hour, Clock: clocktesting.NewFakeClock(now)})
	f, err := guard.NewFinder(guard.FinderOptions{Guard: g, Inventory: inv, Tombstones: store})
	require.NoError(t, err)
	route, err := f.Route("")
	require.NoError(t, err)
	left := byName["dev-md-0-left"] // created 2026-11-29T08:00, NotReady since 11:00 today

	gh, err := f.Ghost(ctx, route, left, now, false)
	require.NoError(t, err)
	assert.False(t, gh.Ghost)
	assert.Nil(t, gh.Tombstone, "no tombstone: no evaluation")

	// Gone at 11:30, after the Node last changed: the Node left behind, an orphan.
	store.Record(facts.Tombstone{ProviderID: "docker:////dev-md-0-left", Object: "DockerMachine default/dev-md-0-left",
		DeletedAt: now.Add(-30 * time.Minute)})
	gh, err = f.Ghost(ctx, route, left, now, false)
	require.NoError(t, err)
	assert.False(t, gh.Ghost)
	assert.Equal(t, []string{"it was not created after the tombstone and has not turned Ready since"}, gh.Kept)
	vs, err := f.Scan(ctx, []*unstructured.Unstructured{left}, "", now)
	require.NoError(t, err)
	assert.True(t, vs[0].Orphan)

	// Gone the day before the Node was created: it registered again.
	store.End("docker:////dev-md-0-left")
	store.Record(facts.Tombstone{ProviderID: "docker:////dev-md-0-left", Object: "DockerMachine default/dev-md-0-left",
		DeletedAt: time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)})
	gh, err = f.Ghost(ctx, route, left, now, true)
	require.NoError(t, err)
	assert.True(t, gh.Ghost)
	assert.Contains(t, gh.Reason, "its host was not destroyed")
	vs, err = f.Judge(ctx, []*unstructured.Unstructured{left}, "", now)
	require.NoError(t, err)
	assert.False(t, vs[0].Orphan, "a ghost is never an orphan")
	assert.Contains(t, strings.Join(vs[0].Kept, " "), "it is a ghost")

	reg, err := f.Registration(ctx, "", "CREATE", left, nil, now)
	require.NoError(t, err)
	assert.False(t, reg.Allowed)
	assert.Contains(t, reg.Message, `may not register: providerID "docker:////dev-md-0-left" was carried by DockerMachine default/dev-md-0-left`)
	reg, err = f.Registration(ctx, "", "UPDATE", left, left, now)
	require.NoError(t, err)
	assert.True(t, reg.Allowed, "an update that does not set the providerID registers nothing")

	// Its DockerMachine exists: a tombstone of its providerID blocks nothing.
	store.Record(facts.Tombstone{ProviderID: "docker:////dev-md-0-infra", Object: "Machine default/dev-md-0-infra", DeletedAt: now.Add(-time.Hour)})
	reg, err = f.Registration(ctx, "", "CREATE", byName["dev-md-0-infra"], nil, now)
	require.NoError(t, err)
	assert.True(t, reg.Allowed)
	reg, err = f.Registration(ctx, "", "CREATE", byName["dev-md-0-recent"], nil, now)
	require.NoError(t, err)
	assert.True(t, reg.Allowed, "no tombstone")
}
