#!/usr/bin/env bash
# Builds the e2e suite's kube-apiserver, etcd and kubectl from this tools module into
# the user cache directory, keyed by the module's pins and the Go version, so
# fresh clones reuse them. Prints the directory holding both binaries.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${NODEGUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodeguard}
key=$( (cat "$here/go.mod" "$here/go.sum" "$here/etcd/main.go" "$0"; go version) | sha256sum | cut -c1-16)
# Built from the module, the binary would call itself v0.0.0-master; the API
# server derives its emulation version from this, so stamp the real one.
k8s_version=v1.36.3
ldflags="-X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36"
dir="$cache/e2e-bin/$key"
if [ -x "$dir/kube-apiserver" ] && [ -x "$dir/etcd" ] && [ -x "$dir/kubectl" ]; then
	echo "$dir"
	exit 0
fi
echo "e2e tools: building kube-apiserver and kubectl $k8s_version and etcd v3.6.8 into $dir" >&2
echo "e2e tools: a cold build compiles most of Kubernetes (~8 min on 2 cores); later runs reuse it" >&2
tmp=$(mktemp -d "$cache/e2e-bin/.build.XXXXXX" 2>/dev/null || { mkdir -p "$cache/e2e-bin" && mktemp -d "$cache/e2e-bin/.build.XXXXXX"; })
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
(cd "$here" && go build -o "$tmp/etcd" ./etcd)
echo "e2e tools: etcd built in $((SECONDS - start)) s" >&2
start=$SECONDS
(cd "$here" && go build -ldflags "$ldflags" -o "$tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver)
echo "e2e tools: kube-apiserver built in $((SECONDS - start)) s" >&2
start=$SECONDS
(cd "$here" && go build -ldflags "$ldflags" -o "$tmp/kubectl" k8s.io/kubernetes/cmd/kubectl)
echo "e2e tools: kubectl built in $((SECONDS - start)) s" >&2
mkdir -p "$(dirname "$dir")"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "$dir"
