#!/usr/bin/env bash
# What each failed test of a `go test -v` log said, without the API servers'
# klog lines that bury it; the assertions last, since CI shows a log's tail.
# Usage: failures.sh build/e2e.log
set -euo pipefail
log=$1
failed=$(grep -oE -- '--- FAIL: [A-Za-z0-9_/]+' "$log" | awk '{print $3}' | sort -u || true)
klog='^[[:space:]]*[IWE][0-9]{4} |^[[:space:]]+\{"level":"'
if [ -z "$failed" ]; then
	# No test failed: a build error, a panic or a timeout ended the run.
	grep -vE "$klog" "$log" | grep -E -A30 -- '^panic:|^FAIL|cannot|error' | cut -c1-400 | tail -60
	exit 0
fi
for t in $failed; do
	echo "== $t: its own lines, last 60 (whole log: $log)"
	awk -v t="$t" '$0 ~ "=== RUN   "t"$" {on=1} on {print} $0 ~ "--- FAIL: "t" " {on=0}' "$log" |
		grep -vE "$klog" | cut -c1-400 | tail -60
done
echo "== what failed:"
for t in $failed; do
	awk -v t="$t" '$0 ~ "=== RUN   "t"$" {on=1} on {print} $0 ~ "--- FAIL: "t" " {on=0}' "$log" |
		grep -vE "$klog" | awk '/Error Trace:/ {on=1} on {print} /Messages:/ {on=0}' | cut -c1-300 | tail -16
	echo "--- FAIL: $t"
done
