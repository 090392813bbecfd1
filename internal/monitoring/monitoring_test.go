package monitoring_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/events"
	"github.com/nodeguard/nodeguard/enforcer/fleet"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/enforcer/serve"
	"github.com/nodeguard/nodeguard/internal/monitoring"
)

const root = "../.."

// alertRule is one alerting rule of the kustomize component's PrometheusRule.
type alertRule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

type ruleGroup struct {
	Name  string      `json:"name"`
	Rules []alertRule `json:"rules"`
}

// groups reads the rule groups of the PrometheusRule kustomize ships (the
// chart's renders the same: charts/chart_test.go).
func groups(t *testing.T) []ruleGroup {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, monitoring.KustomizeRulesPath))
	require.NoError(t, err)
	var pr struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Metadata   map[string]any `json:"metadata"`
		Spec       struct {
			Groups []ruleGroup `json:"groups"`
		} `json:"spec"`
	}
	require.NoError(t, yaml.UnmarshalStrict(raw, &pr))
	require.Equal(t, "monitoring.coreos.com/v1/PrometheusRule", pr.APIVersion+"/"+pr.Kind)
	require.NotEmpty(t, pr.Spec.Groups)
	return pr.Spec.Groups
}

func alerts(t *testing.T) []alertRule {
	t.Helper()
	var out []alertRule
	for _, g := range groups(t) {
		out = append(out, g.Rules...)
	}
	return out
}

// tool runs a command from the repository root and returns its stdout.
func tool(t *testing.T, stdin []byte, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = root
	// As the Makefile's PROMTOOL: Prometheus' build tag that leaves out service
	// discovery (half of promtool's build); the same flags share one build.
	cmd.Env = append(os.Environ(), "GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -tags=remove_all_sd"))
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "%s %v:\n%s%s", name, args, stdout.String(), stderr.String())
	return stdout.Bytes()
}

// The alerts pass `promtool check rules` and their unit tests
// (testdata/rules_test.yaml) with the pinned promtool (tools/promtool).
func TestAlertRules(t *testing.T) {
	dir := t.TempDir()
	out, err := yaml.Marshal(map[string]any{"groups": groups(t)})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "rules.yaml"), out, 0o600))
	tests, err := os.ReadFile("testdata/rules_test.yaml")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "rules_test.yaml"), tests, 0o600))
	promtool := []string{"tool", "-modfile=tools/promtool/go.mod", "promtool"}
	t.Log(string(tool(t, nil, "go", append(promtool, "check", "rules", "--lint-fatal", filepath.Join(dir, "rules.yaml"))...)))
	t.Log(string(tool(t, nil, "go", append(promtool, "test", "rules", filepath.Join(dir, "rules_test.yaml"))...)))
}

// Every alert has, in testdata/rules_test.yaml, a case where it fires and one
// where it stays silent; no case names an alert that does not exist.
func TestEveryAlertIsTested(t *testing.T) {
	raw, err := os.ReadFile("testdata/rules_test.yaml")
	require.NoError(t, err)
	var file struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string           `json:"alertname"`
				ExpAlerts []map[string]any `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &file))
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range file.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				silent[a.Alertname] = true
			}
		}
	}
	names := map[string]bool{}
	for _, a := range alerts(t) {
		names[a.Alert] = true
		assert.True(t, fires[a.Alert], "%s has no case where it fires", a.Alert)
		assert.True(t, silent[a.Alert], "%s has no case where it stays silent", a.Alert)
	}
	for name := range fires {
		assert.True(t, names[name], "a case tests %s, which is no alert", name)
	}
	for name := range silent {
		assert.True(t, names[name], "a case tests %s, which is no alert", name)
	}
}

// Every alert links its section of docs/runbook.md, and every section says
// what the alert means, what is affected, and the first three commands.
func TestRunbookHasASectionPerAlert(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(root, "docs/runbook.md"))
	require.NoError(t, err)
	sections := map[string]string{}
	for _, part := range strings.Split(string(raw), "\n## ")[1:] {
		title, body, _ := strings.Cut(part, "\n")
		sections[strings.TrimSpace(title)] = body
	}
	commands := regexp.MustCompile("(?s)\\*\\*First three commands\\.\\*\\*\\s*```sh\n(.*?)```")
	for _, a := range alerts(t) {
		body, ok := sections[a.Alert]
		if !assert.True(t, ok, "docs/runbook.md has no section ## %s", a.Alert) {
			continue
		}
		assert.Equal(t, "https://github.com/nodeguard/nodeguard/blob/main/docs/runbook.md#"+strings.ToLower(a.Alert), a.Annotations["runbook_url"])
		assert.NotEmpty(t, a.Labels["severity"], a.Alert)
		assert.NotEmpty(t, a.Annotations["summary"], a.Alert)
		assert.Contains(t, body, "**What it means.**", a.Alert)
		assert.Contains(t, body, "**What is affected.**", a.Alert)
		m := commands.FindStringSubmatch(body)
		if !assert.NotNil(t, m, "%s: no **First three commands.** block", a.Alert) {
			continue
		}
		var lines []string
		for _, l := range strings.Split(m[1], "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				lines = append(lines, l)
			}
		}
		assert.Len(t, lines, 3, "%s: three commands", a.Alert)
	}
}

// describing collects the names of every metric registered through it.
type describing struct {
	prometheus.Registerer
	names map[string]bool
}

// Desc has no accessor for its name; its String() is documented to carry it.
var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (d *describing) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 128)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		if m := fqName.FindStringSubmatch(desc.String()); m != nil {
			d.names[m[1]] = true
		}
	}
	return d.Registerer.Register(c)
}

func (d *describing) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := d.Register(c); err != nil {
			panic(err)
		}
	}
}

// exported returns the metrics nodeguard serve exports, registered as serve
// registers them, and the type of those that have series already.
func exported(t *testing.T) (map[string]bool, map[string]dto.MetricType, map[string]bool) {
	t.Helper()
	reg := prometheus.NewRegistry()
	d := &describing{Registerer: reg, names: map[string]bool{}}
	_, err := serve.Register(d, serve.Sources{
		Policy: func() rule.Policy { return rule.Policy{Source: rule.SourceEmbedded} },
		Cached: func() map[schema.GroupVersionKind]int {
			return map[schema.GroupVersionKind]int{{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "Machine"}: 1}
		},
		Ready: func() error { return nil },
	})
	require.NoError(t, err)
	families, err := reg.Gather()
	require.NoError(t, err)
	types, deprecated := map[string]dto.MetricType{}, map[string]bool{}
	for _, f := range families {
		types[f.GetName()] = f.GetType()
		deprecated[f.GetName()] = strings.HasPrefix(f.GetHelp(), "(Deprecated")
	}
	return d.names, types, deprecated
}

// selected is what promqlnames (tools/promtool) says one expression selects.
type selected struct {
	Expr      string `json:"expr"`
	Error     string `json:"error"`
	Selectors []struct {
		Metric   string `json:"metric"`
		Matchers []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Value string `json:"value"`
		} `json:"matchers"`
	} `json:"selectors"`
}

// dashboardQueries are the PromQL expressions of the dashboard: its panels'
// targets and its query variables (label_values(SELECTOR, LABEL)), with
// Grafana's variables replaced by values Prometheus would see.
func dashboardQueries(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, monitoring.KustomizeDashboard))
	require.NoError(t, err)
	var d struct {
		Panels []struct {
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	require.NoError(t, json.Unmarshal(raw, &d))
	grafana := strings.NewReplacer("$__rate_interval", "5m", "$__range", "1h", "$webhook_timeout", "5")
	var out []string
	for _, p := range d.Panels {
		for _, target := range p.Targets {
			out = append(out, grafana.Replace(target.Expr))
		}
	}
	labelValues := regexp.MustCompile(`^label_values\((.+),\s*\w+\)$`)
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(string); ok && v.Type == "query" {
			m := labelValues.FindStringSubmatch(q)
			require.NotNil(t, m, "variable query %q: only label_values(SELECTOR, LABEL) is checked", q)
			out = append(out, m[1])
		}
	}
	return out
}

// Every metric the alerts and the dashboard read is one nodeguard serve
// exports (a renamed metric fails here), and every reason they select is one
// nodeguard counts.
func TestQueriesReadExportedMetrics(t *testing.T) {
	var exprs []string
	for _, a := range alerts(t) {
		exprs = append(exprs, a.Expr)
	}
	fromRules := len(exprs)
	exprs = append(exprs, dashboardQueries(t)...)
	require.Greater(t, len(exprs), fromRules, "the dashboard has queries")
	in, err := json.Marshal(exprs)
	require.NoError(t, err)
	var results []selected
	require.NoError(t, json.Unmarshal(tool(t, in, "go", "-C", "tools/promtool", "run", "./promqlnames"), &results))
	require.Len(t, results, len(exprs))

	names, types, deprecated := exported(t)
	exportedName := func(m string) bool {
		if names[m] {
			return true
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			base, ok := strings.CutSuffix(m, suffix)
			if ok && (types[base] == dto.MetricType_HISTOGRAM || types[base] == dto.MetricType_SUMMARY) {
				return true
			}
		}
		return false
	}
	reasons := map[string][]string{
		"nodeguard_decisions_total": {rule.ReasonNoLink, rule.ReasonExempt, rule.ReasonNotJudged, rule.ReasonBlocked,
			rule.ReasonUnverified, rule.ReasonMisrouted, rule.ReasonUnjudgeable, rule.ReasonNotReady, rule.ReasonCacheRecovering, rule.ReasonNotHeld, rule.ReasonFreshReadFailed,
			rule.ReasonError, rule.ReasonBusy, rule.ReasonBadRequest},
		"nodeguard_rejected_requests_total": {admission.RejectMethod, admission.RejectClientCert, admission.RejectContentType, admission.RejectTooLarge,
			admission.RejectNoLength, admission.RejectRead, admission.RejectBusy, admission.RejectMalformed, admission.RejectNotReview,
			admission.RejectNoRequest, admission.RejectNoUID, admission.RejectBadOldObject, admission.RejectMalformedProvider, admission.RejectNotRequest,
			admission.RejectKeys},
		"nodeguard_workload_cluster_unguarded_reason": fleet.Reasons(),
		"nodeguard_events_dropped_total":              {events.DropQueueFull, events.DropPerObject, events.DropSeries, events.DropWriteFailed},
	}
	used := map[string]bool{}
	for _, r := range results {
		if !assert.Empty(t, r.Error, r.Expr) {
			continue
		}
		if !strings.HasPrefix(r.Expr, "vector(") { // the dashboard's constant lines
			assert.NotEmpty(t, r.Selectors, "%s reads no metric", r.Expr)
		}
		for _, s := range r.Selectors {
			used[s.Metric] = true
			assert.True(t, exportedName(s.Metric), "%s reads %s, which nodeguard serve does not export", r.Expr, s.Metric)
			assert.False(t, deprecated[s.Metric], "%s reads %s, kept under its old name for a release only", r.Expr, s.Metric)
			for _, m := range s.Matchers {
				if m.Name != "reason" {
					continue
				}
				known, ok := reasons[s.Metric]
				require.True(t, ok, "%s selects a reason of %s, whose reasons the test does not know", r.Expr, s.Metric)
				for _, v := range strings.Split(m.Value, "|") {
					assert.Contains(t, known, v, "%s: %s has no reason %q", r.Expr, s.Metric, v)
				}
			}
		}
	}
	t.Logf("alerts and dashboard read %d of the %d metrics nodeguard serve exports", len(used), len(names))
	for _, m := range []string{"nodeguard_ready", "nodeguard_decisions_total", "nodeguard_decision_duration_seconds_bucket",
		"nodeguard_rejected_requests_total", "nodeguard_cached_objects", "nodeguard_orphan_nodes", "nodeguard_policy_info"} {
		assert.True(t, used[m], "the alerts or dashboard read %s", m)
	}
	assert.False(t, slices.Contains(exprs, ""), "no empty query")
}

// The generated files are what Render makes now (make generate-check does
// the same for the whole repository).
func TestRenderedFilesAreCommitted(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(root, monitoring.OperateDocPath))
	require.NoError(t, err)
	files, err := monitoring.Render(doc)
	require.NoError(t, err)
	for path, want := range files {
		have, err := os.ReadFile(filepath.Join(root, path))
		require.NoError(t, err)
		assert.Equal(t, string(want), string(have), "%s is stale: run make generate", path)
	}
}
