// This file says what a nodeguard binary is: its version and commit
// (from the Go build's VCS stamp, or -ldflags at release), and which policy
// it runs; also as the Prometheus gauges nodeguard_build_info and
// nodeguard_policy_info.

package rule

import (
	"cmp"
	"fmt"
	"io"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodeguard/nodeguard/enforcer/metrics"
)

// Set at link time by `make build`/`make image` (-ldflags -X, see the
// Makefile), which works where the Go build's VCS stamp does not
// (-buildvcs=false, a tarball of the source); written by the linker only.
var (
	linkVersion string
	linkCommit  string
)

// Binary is what was built.
type Binary struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	Modified  bool   `json:"modified"` // built from a work tree with uncommitted changes
	GoVersion string `json:"goVersion"`
}

// ReadBinary returns the binary's version and commit.
func ReadBinary() Binary {
	var b Binary
	if info, ok := debug.ReadBuildInfo(); ok {
		b.GoVersion, b.Version = info.GoVersion, info.Main.Version
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Commit = s.Value
			case "vcs.modified":
				b.Modified = s.Value == "true"
			}
		}
	}
	b.Version, b.Commit = cmp.Or(linkVersion, b.Version, "(devel)"), cmp.Or(linkCommit, b.Commit, "unknown")
	return b
}

// VersionReport is what `nodeguard version -o json` prints.
type VersionReport struct {
	Binary
	Policy Policy `json:"policy"`
}

// Write prints r for people.
func (r VersionReport) Write(w io.Writer) error {
	commit := r.Commit
	if r.Modified {
		commit += " (modified)"
	}
	policy := "embedded, K8sNodeGuard template " + r.Policy.Version
	if r.Policy.Source == SourceBundle {
		policy = fmt.Sprintf("bundle, revision %q", r.Policy.Revision)
	}
	_, err := fmt.Fprintf(w, "nodeguard %s\ncommit:  %s\ngo:      %s\npolicy:  %s\n", r.Version, commit, r.GoVersion, policy)
	if err != nil {
		return fmt.Errorf("write version: %w", err)
	}
	return nil
}

// VersionMetrics are the build and policy gauges and the reload error counter.
type VersionMetrics struct {
	ReloadErrors prometheus.Counter
}

// RegisterVersion adds nodeguard_build_info, nodeguard_policy_info (read from
// policy at each scrape, so a reloaded bundle shows) and
// nodeguard_policy_reload_errors_total to reg.
func RegisterVersion(reg prometheus.Registerer, policy func() Policy) (*VersionMetrics, error) {
	b := ReadBinary()
	r := metrics.New(reg)
	r.Info("nodeguard_build_info", "Always 1; the labels say which nodeguard binary runs.",
		prometheus.Labels{"version": b.Version, "commit": b.Commit, "goversion": b.GoVersion})
	r.Collector(policyInfo{policy: policy, desc: prometheus.NewDesc("nodeguard_policy_info",
		"Always 1; the labels say which policy decides: source (embedded or bundle), template version, bundle revision.",
		[]string{"source", "version", "revision"}, nil)})
	m := &VersionMetrics{ReloadErrors: r.Counter("nodeguard_policy_reload_errors_total",
		"Bundle updates refused (bad signature, does not compile, ...); the last good policy kept running.")}
	return m, r.Err("version metrics")
}

type policyInfo struct {
	policy func() Policy
	desc   *prometheus.Desc
}

func (p policyInfo) Describe(ch chan<- *prometheus.Desc) { ch <- p.desc }

func (p policyInfo) Collect(ch chan<- prometheus.Metric) {
	pol := p.policy()
	ch <- prometheus.MustNewConstMetric(p.desc, prometheus.GaugeValue, 1, pol.Source, pol.Version, pol.Revision)
}
