#!/usr/bin/env bash
# The files and packages of enforcer/ one denied Node DELETE review runs
# through, from the HTTPS handler to Rego and back (a first review warms
# what runs once). Run from anywhere: bash tests/spine/measure.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
go build -cover -covermode=atomic -coverpkg=./enforcer/...,./tests/spine -o "$dir/spine" ./tests/spine
mkdir "$dir/cov"
GOCOVERDIR=$dir/cov "$dir/spine"
go tool covdata func -i "$dir/cov" | awk '$NF != "0.0%" && $1 ~ /enforcer\// {sub(/:[0-9]+:$/, "", $1); print $1}' | sort -u > "$dir/files"
echo "files ($(wc -l < "$dir/files")):"; sed 's|^github.com/nodeguard/nodeguard/|  |' "$dir/files"
sed 's|/[^/]*$||' "$dir/files" | sort -u > "$dir/packages"
echo "packages ($(wc -l < "$dir/packages")):"; sed 's|^github.com/nodeguard/nodeguard/|  |' "$dir/packages"
