package monitoring

import (
	"bytes"
	_ "embed"
	"fmt"
	"strings"
	"text/template"
)

//go:embed prometheusrule.yaml.tmpl
var rulesTemplate string

// Param is a setting of the alerts: a chart value under
// monitoring.prometheusRule (Key is its path there), and in the kustomize
// component its Default, written in place.
type Param struct {
	Key     string
	Default string
	Doc     string
}

// Params are the alerts' settings, in the order docs/operate.md lists them.
func Params() []Param {
	return []Param{
		{"selector", `job="nodeguard-metrics"`, "label matchers selecting nodeguard's series (the ServiceMonitor's job is its Service's name)"},
		{"runbookURL", "https://github.com/nodeguard/nodeguard/blob/main/docs/runbook.md", "where each alert's runbook_url points (an anchor per alert is appended)"},
		{"thresholds.unavailableFor", "1m", "NodeguardUnavailable: how long without a ready replica"},
		{"thresholds.notReadyFor", "10m", "NodeguardReplicaNotReady: how long one replica stays not ready"},
		{"thresholds.freshReadFailuresFor", "10m", "NodeguardFreshReadsFailing: how long fresh-read-failed denials keep coming"},
		{"thresholds.unjudgedDenialsPerSecond", "0.1", "NodeguardDenyingWithoutJudging: denials/s for fresh-read-failed, not-ready, cache-recovering, not-held, busy or error, per reason"},
		{"thresholds.unjudgedDenialsFor", "5m", "NodeguardDenyingWithoutJudging: for how long"},
		{"thresholds.rejectedRequestsPerSecond", "0.1", "NodeguardRejectingRequests: requests/s answered with an HTTP error, per reason"},
		{"thresholds.rejectedRequestsFor", "10m", "NodeguardRejectingRequests: for how long"},
		{"thresholds.decisionP99Seconds", "2.5", "NodeguardDecisionsNearTimeout: p99 decision time in seconds (the webhook's timeout is 5 s, the review deadline 4 s)"},
		{"thresholds.decisionLatencyFor", "10m", "NodeguardDecisionsNearTimeout: for how long"},
		{"thresholds.policyReloadErrorWindow", "1h", "NodeguardPolicyReloadFailing: fires while a refused bundle update is this recent"},
		{"thresholds.orphanNodesFor", "30m", "NodeguardOrphanNodes: how long orphans may stay (the reaper's grace is 5m)"},
		{"thresholds.orphansDeletedWindow", "1h", "NodeguardOrphanNodesDeleted: fires while a deletion is this recent"},
		{"thresholds.workloadClusterUnguardedFor", "10m", "NodeguardWorkloadClusterUnguarded: how long a workload cluster stays unproven (two proof periods at the default 5m)"},
		{"thresholds.releaseWritesFailingFor", "5m", "NodeguardReleasesNotWritten: how long every write of a verdict on a cluster's Nodes fails (a failed write is tried again with a backoff of up to 30 s)"},
		{"thresholds.constraintReloadErrorWindow", "1h", "NodeguardConstraintRefused: fires while a refused Constraint edit is this recent"},
	}
}

// renderRules renders the PrometheusRule: for the chart (helm), with a value
// reference for each parameter and Prometheus' own templates escaped; for
// kustomize, with the defaults.
func renderRules(helm bool, header string) ([]byte, error) {
	params := map[string]Param{}
	for _, p := range Params() {
		params[p.Key] = p
	}
	value := func(key string) (string, error) {
		p, ok := params[key]
		if !ok {
			return "", fmt.Errorf("no parameter %q", key)
		}
		if helm {
			return "{{ .Values.monitoring.prometheusRule." + key + " }}", nil
		}
		return p.Default, nil
	}
	funcs := template.FuncMap{
		"p": value,
		// sel is the selector of nodeguard's series, plus more matchers.
		// The chart writes its brace as a string: "{{{" would open an action.
		"sel": func(more string) (string, error) {
			v, err := value("selector")
			if more != "" {
				v += ", " + more
			}
			if helm {
				return `{{ "{" }}` + v + "}", err
			}
			return "{" + v + "}", err
		},
		"window": func(key string) (string, error) {
			v, err := value(key)
			return "[" + v + "]", err
		},
		// Prometheus expands {{ ... }} in annotations; Helm would too, so
		// the chart carries them as Go template string literals.
		"prom": func(expr string) string {
			if helm {
				return "{{`{{ " + expr + " }}`}}"
			}
			return "{{ " + expr + " }}"
		},
		"runbook": func(alert string) (string, error) {
			base, err := value("runbookURL")
			return base + "#" + strings.ToLower(alert), err
		},
	}
	t, err := template.New("prometheusrule").Delims("[[", "]]").Funcs(funcs).Option("missingkey=error").Parse(rulesTemplate)
	if err != nil {
		return nil, fmt.Errorf("parse the rules template: %w", err)
	}
	var b bytes.Buffer
	if err := t.Execute(&b, struct {
		Helm   bool
		Header string
	}{helm, header}); err != nil {
		return nil, fmt.Errorf("render the rules: %w", err)
	}
	return b.Bytes(), nil
}
