// Command promqlnames reads a JSON list of PromQL expressions on stdin and
// prints, for each, the metric names and label matchers it selects, parsed by
// Prometheus' own parser (the one promtool and Prometheus use). nodeguard's
// tests use it to check that its alerts and dashboard read only metrics
// nodeguard exports. It lives in promtool's tools module because the parser
// comes with Prometheus' dependencies.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// Matcher is one label matcher of a selector.
type Matcher struct {
	Name  string `json:"name"`
	Type  string `json:"type"` // =, !=, =~, !~
	Value string `json:"value"`
}

// Selector is one vector or matrix selector of an expression.
type Selector struct {
	Metric   string    `json:"metric"`
	Matchers []Matcher `json:"matchers"`
}

// Result is what one expression selects, or why it does not parse.
type Result struct {
	Expr      string     `json:"expr"`
	Selectors []Selector `json:"selectors"`
	Error     string     `json:"error,omitempty"`
}

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "promqlnames:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer) error {
	var exprs []string
	if err := json.NewDecoder(in).Decode(&exprs); err != nil {
		return fmt.Errorf("read a JSON list of expressions: %w", err)
	}
	p := parser.NewParser(parser.Options{})
	results := make([]Result, 0, len(exprs))
	for _, e := range exprs {
		r := Result{Expr: e, Selectors: []Selector{}}
		expr, err := p.ParseExpr(e)
		if err != nil {
			r.Error = err.Error()
			results = append(results, r)
			continue
		}
		parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
			if vs, ok := node.(*parser.VectorSelector); ok {
				r.Selectors = append(r.Selectors, selector(vs))
			}
			return nil
		})
		results = append(results, r)
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	if err := enc.Encode(results); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	return nil
}

func selector(vs *parser.VectorSelector) Selector {
	s := Selector{Metric: vs.Name, Matchers: []Matcher{}}
	for _, m := range vs.LabelMatchers {
		if m.Name == labels.MetricName {
			if s.Metric == "" && m.Type == labels.MatchEqual {
				s.Metric = m.Value
			}
			continue
		}
		s.Matchers = append(s.Matchers, Matcher{Name: m.Name, Type: m.Type.String(), Value: m.Value})
	}
	return s
}
