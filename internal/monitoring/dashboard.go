package monitoring

import (
	"encoding/json"
	"fmt"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/table"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// DashboardUID is the dashboard's stable uid, so links to it survive updates.
const DashboardUID = "nodeguard"

// sel restricts a query to the namespace chosen on the dashboard.
const sel = `namespace=~"$namespace"`

// renderDashboard builds the Grafana dashboard as JSON.
func renderDashboard() ([]byte, error) {
	ds := common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}
	query := func(expr, legend string) *prometheus.DataqueryBuilder {
		return prometheus.NewDataqueryBuilder().Expr(expr).LegendFormat(legend).Datasource(ds)
	}
	series := func(title, unit, description string, queries ...*prometheus.DataqueryBuilder) *timeseries.PanelBuilder {
		p := timeseries.NewPanelBuilder().Title(title).Description(description).Unit(unit).Datasource(ds).
			Height(8).Span(12).Min(0).
			Legend(common.NewVizLegendOptionsBuilder().DisplayMode(common.LegendDisplayModeTable).Placement(common.LegendPlacementBottom).ShowLegend(true))
		for _, q := range queries {
			p = p.WithTarget(q)
		}
		return p
	}

	b := dashboard.NewDashboardBuilder("nodeguard").
		Uid(DashboardUID).
		Description("nodeguard serve: Node-delete decisions, their latency beside the webhook timeout, fresh reads, rejected requests, caches, policy, orphan and ghost Nodes and denial Events. Alerts and runbooks: docs/runbook.md.").
		Tags([]string{"nodeguard", "cluster-api"}).
		Refresh("30s").
		Time("now-6h", "now").
		Timezone(common.TimeZoneBrowser).
		WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").Label("Data source").Type("prometheus")).
		WithVariable(dashboard.NewQueryVariableBuilder("namespace").Label("Namespace").Datasource(ds).
			Query(dashboard.StringOrMap{String: cog.ToPtr("label_values(nodeguard_build_info, namespace)")}).
			Refresh(dashboard.VariableRefreshOnTimeRangeChanged).IncludeAll(true).Multi(true)).
		WithVariable(dashboard.NewTextBoxVariableBuilder("webhook_timeout").Label("Webhook timeoutSeconds").
			Description("The timeoutSeconds of nodeguard's ValidatingWebhookConfiguration (nodeguard webhook-config writes 5).").
			DefaultValue(dashboard.StringOrMap{String: cog.ToPtr("5")})).
		WithRow(dashboard.NewRowBuilder("Decisions")).
		WithPanel(stat.NewPanelBuilder().Title("Ready replicas").Datasource(ds).Height(8).Span(4).
			Description("Replicas whose caches have synced (nodeguard_ready). None ready: every Node delete sent to the webhook is denied.").
			WithTarget(query(`sum(nodeguard_ready{`+sel+`})`, "ready")).
			Thresholds(dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModeAbsolute).Steps([]dashboard.Threshold{
				{Color: "red"}, {Value: cog.ToPtr(1.0), Color: "green"}}))).
		WithPanel(stat.NewPanelBuilder().Title("Policy reload errors (window)").Datasource(ds).Height(8).Span(4).
			Description("Bundle updates refused in the dashboard's time range; the last good policy kept deciding.").
			WithTarget(query(`sum(increase(nodeguard_policy_reload_errors_total{`+sel+`}[$__range]))`, "refused")).
			Thresholds(dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModeAbsolute).Steps([]dashboard.Threshold{
				{Color: "green"}, {Value: cog.ToPtr(1.0), Color: "red"}}))).
		WithPanel(table.NewPanelBuilder().Title("Policy and build").Datasource(ds).Height(8).Span(16).
			Description("Which policy decides (nodeguard_policy_info: embedded template version or bundle revision) and which binary runs (nodeguard_build_info), per replica.").
			WithTarget(query(`max by (pod, source, version, revision) (nodeguard_policy_info{`+sel+`})`, "").Instant().Format(prometheus.PromQueryFormatTable)).
			WithTarget(query(`max by (pod, version, commit) (nodeguard_build_info{`+sel+`})`, "").Instant().Format(prometheus.PromQueryFormatTable))).
		WithPanel(series("Decisions by result and reason", "reqps",
			"Reviews answered per second. Denied with reason blocked/unverified/unjudgeable: the rule's verdict. fresh-read-failed, not-ready, cache-recovering, not-held, busy, error: denied without judging.",
			query(`sum by (result, reason) (rate(nodeguard_decisions_total{`+sel+`}[$__rate_interval]))`, "{{result}} {{reason}}"))).
		WithPanel(series("Decision latency beside the webhook timeout", "s",
			"Time to answer a review, fresh reads included, by route; the webhook's timeoutSeconds and the 4 s review deadline for scale.",
			query(`histogram_quantile(0.5, sum by (le, route) (rate(nodeguard_decision_duration_seconds_bucket{`+sel+`}[$__rate_interval])))`, "p50 {{route}}"),
			query(`histogram_quantile(0.9, sum by (le, route) (rate(nodeguard_decision_duration_seconds_bucket{`+sel+`}[$__rate_interval])))`, "p90 {{route}}"),
			query(`histogram_quantile(0.99, sum by (le, route) (rate(nodeguard_decision_duration_seconds_bucket{`+sel+`}[$__rate_interval])))`, "p99 {{route}}"),
			query(`vector($webhook_timeout)`, "webhook timeout"),
			query(`vector(4)`, "review deadline (--request-timeout default)")).
			OverrideByName("webhook timeout", []dashboard.DynamicConfigValue{{Id: "custom.lineStyle", Value: map[string]any{"fill": "dash", "dash": []int{10, 10}}}, {Id: "color", Value: map[string]any{"mode": "fixed", "fixedColor": "red"}}}).
			OverrideByName("review deadline (--request-timeout default)", []dashboard.DynamicConfigValue{{Id: "custom.lineStyle", Value: map[string]any{"fill": "dash", "dash": []int{10, 10}}}, {Id: "color", Value: map[string]any{"mode": "fixed", "fixedColor": "orange"}}})).
		WithPanel(series("Fresh-read failures", "reqps",
			"Node deletes denied because the API server could not be re-read within --fresh-read-timeout.",
			query(`sum by (route) (rate(nodeguard_decisions_total{`+sel+`, reason="fresh-read-failed"}[$__rate_interval]))`, "{{route}}"))).
		WithPanel(series("Rejected requests by reason", "reqps",
			"Requests answered with an HTTP error before any decision; from an API server they are denied by failurePolicy Fail.",
			query(`sum by (reason) (rate(nodeguard_rejected_requests_total{`+sel+`}[$__rate_interval]))`, "{{reason}}"))).
		WithRow(dashboard.NewRowBuilder("Caches, orphans and Events")).
		WithPanel(series("Cached objects by kind", "short",
			"Objects in the informer caches (Machines, InfraMachines, pools), per kind; the largest replica.",
			query(`max by (group, kind) (nodeguard_cached_objects{`+sel+`})`, "{{kind}}.{{group}}"))).
		WithPanel(series("Workload clusters guarded", "short",
			`Workload clusters the fleet reconciler proved guarded and those it did not, by reason (nodeguard clusters lists them).`,
			query(`sum(max by (cluster_namespace, cluster_name) (nodeguard_workload_cluster_guarded{`+sel+`}))`, `guarded`),
			query(`sum by (reason) (max by (cluster_namespace, cluster_name, reason) (nodeguard_workload_cluster_unguarded_reason{`+sel+`}))`, `unguarded: {{reason}}`))).
		WithPanel(series("Orphan Nodes by cluster", "short",
			`Nodes Cluster API managed whose Machine and InfraMachine are gone, by cluster ("" is the one nodeguard runs in), and those deleted by the reaper.`,
			query(`max by (cluster) (nodeguard_orphan_nodes{`+sel+`})`, `orphans "{{cluster}}"`),
			query(`sum by (cluster) (increase(nodeguard_orphan_nodes_deleted_total{`+sel+`}[$__rate_interval]))`, `deleted "{{cluster}}"`))).
		WithPanel(series("Ghost Nodes and tombstones", "short",
			`Ghost Nodes by cluster (alive again with the providerID of a Machine, InfraMachine or pool membership that went away: their hosts were not destroyed; nodeguard ghosts names them), and the providerIDs tombstoned.`,
			query(`max by (cluster) (nodeguard_ghost_nodes{`+sel+`})`, `ghosts "{{cluster}}"`),
			query(`max(nodeguard_tombstones{`+sel+`})`, `tombstones`))).
		WithPanel(series("NodeDeleteDenied Events", "ops",
			"Event writes (create, series patch) for denied Node deletes, and denials not written as Events (rate limits, queue full); every denial is still in nodeguard_decisions_total and the log.",
			query(`sum by (operation, result) (rate(nodeguard_event_writes_total{`+sel+`}[$__rate_interval]))`, "{{operation}} {{result}}"),
			query(`sum by (reason) (rate(nodeguard_events_dropped_total{`+sel+`}[$__rate_interval]))`, "dropped: {{reason}}")))
	d, err := b.Build()
	if err != nil {
		return nil, fmt.Errorf("build the dashboard: %w", err)
	}
	out, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode the dashboard: %w", err)
	}
	return append(out, '\n'), nil
}
