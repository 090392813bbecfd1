// Command coverage reads `opa test --coverage` JSON on stdin, prints the
// coverage of each policy file and the total over the policies (tests do not
// count: they would inflate the figure), and fails below -min percent.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

type report struct {
	Files map[string]struct {
		CoveredLines    int     `json:"covered_lines"`
		NotCoveredLines int     `json:"not_covered_lines"`
		Coverage        float64 `json:"coverage"`
	} `json:"files"`
}

func main() {
	min := flag.Float64("min", 95, "minimum total coverage, percent")
	flag.Parse()
	if err := run(os.Stdin, os.Stdout, *min); err != nil {
		fmt.Fprintln(os.Stderr, "coverage:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer, min float64) error {
	var r report
	if err := json.NewDecoder(in).Decode(&r); err != nil {
		return fmt.Errorf("decode opa coverage report: %w", err)
	}
	if len(r.Files) == 0 {
		return fmt.Errorf("coverage report lists no files")
	}
	var names []string
	for name := range r.Files {
		if !strings.HasSuffix(name, "_test.rego") {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	covered, lines := 0, 0
	for _, name := range names {
		f := r.Files[name]
		covered += f.CoveredLines
		lines += f.CoveredLines + f.NotCoveredLines
		fmt.Fprintf(out, "  %6.2f%%  %s\n", f.Coverage, name)
	}
	if lines == 0 {
		return fmt.Errorf("coverage report has no policy lines")
	}
	total := 100 * float64(covered) / float64(lines)
	fmt.Fprintf(out, "Rego coverage: %.2f%% of %d policy lines (minimum %.0f%%)\n", total, lines, min)
	if total < min {
		return fmt.Errorf("Rego coverage %.2f%% is below %.0f%%", total, min)
	}
	return nil
}
