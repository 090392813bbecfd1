package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCoverageAboveMinimum(t *testing.T) {
	var out bytes.Buffer
	in := `{"files": {
		"b.rego": {"covered_lines": 100, "coverage": 100},
		"a.rego": {"covered_lines": 93, "not_covered_lines": 7, "coverage": 93},
		"a_test.rego": {"covered_lines": 1, "not_covered_lines": 99, "coverage": 1}
	}}`
	require.NoError(t, run(strings.NewReader(in), &out, 95))
	assert.Equal(t, "   93.00%  a.rego\n  100.00%  b.rego\nRego coverage: 96.50% of 200 policy lines (minimum 95%)\n", out.String())
}

func TestCoverageBelowMinimumFails(t *testing.T) {
	var out bytes.Buffer
	err := run(strings.NewReader(`{"files": {"a.rego": {"covered_lines": 94, "not_covered_lines": 6, "coverage": 94}}}`), &out, 95)
	require.ErrorContains(t, err, "94.00% is below 95%")
	assert.Contains(t, out.String(), "Rego coverage: 94.00%")
}

func TestCoverageRejectsEmptyOrBadReports(t *testing.T) {
	assert.Error(t, run(strings.NewReader(`{"coverage": 100}`), &bytes.Buffer{}, 95))
	assert.Error(t, run(strings.NewReader(`{"files": {"a_test.rego": {"covered_lines": 5}}}`), &bytes.Buffer{}, 95))
	assert.Error(t, run(strings.NewReader(`not json`), &bytes.Buffer{}, 95))
}
