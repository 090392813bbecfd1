#!/usr/bin/env bash
# Builds the e2e suite's kube-apiserver, etcd and kubectl from this tools module,
# the Gatekeeper manager from ./gatekeeper and the Cluster API core manager and
# clusterctl from ./capi, into the user cache directory,
# keyed by the modules' pins and the Go version, so fresh clones reuse them.
# Prints the directory holding the binaries.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${NODEGUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodeguard}
key=$( (cat "$here/go.mod" "$here/go.sum" "$here/etcd/main.go" "$here/gatekeeper/go.mod" "$here/gatekeeper/go.sum" "$here/capi/go.mod" "$here/capi/go.sum" "$here/kube137/go.mod" "$here/kube137/go.sum" "$0"; go version) | sha256sum | cut -c1-16)
# Built from the module, the binary would call itself v0.0.0-master; the API
# server derives its emulation version from this, so stamp the real one.
k8s_version=v1.36.3
ldflags="-X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36"
# The static-manifest tests run on 1.37 (kube137/): its kube-apiserver beside.
k8s_next=v1.37.2
ldflags_next="-X k8s.io/component-base/version.gitVersion=$k8s_next -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37"
dir="$cache/e2e-bin/$key"
gatekeeper_version=v3.23.1
capi_version=v1.14.2
if [ -x "$dir/kube-apiserver" ] && [ -x "$dir/etcd" ] && [ -x "$dir/kubectl" ] && [ -x "$dir/gatekeeper" ] && [ -x "$dir/capi-manager" ] && [ -x "$dir/kube-apiserver-1.37" ] && [ -x "$dir/clusterctl" ]; then
	echo "$dir"
	exit 0
fi
echo "e2e tools: building kube-apiserver and kubectl $k8s_version, kube-apiserver $k8s_next, etcd v3.6.8, Gatekeeper $gatekeeper_version and the Cluster API $capi_version manager and clusterctl into $dir" >&2
echo "e2e tools: a cold build compiles most of Kubernetes, Gatekeeper and Cluster API (~20 min on 2 cores); later runs reuse it" >&2
tmp=$(mktemp -d "$cache/e2e-bin/.build.XXXXXX" 2>/dev/null || { mkdir -p "$cache/e2e-bin" && mktemp -d "$cache/e2e-bin/.build.XXXXXX"; })
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
(cd "$here" && go build -o "$tmp/etcd" ./etcd)
echo "e2e tools: etcd built in $((SECONDS - start)) s" >&2
start=$SECONDS
(cd "$here" && go build -ldflags "$ldflags" -o "$tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver)
echo "e2e tools: kube-apiserver built in $((SECONDS - start)) s" >&2
start=$SECONDS
(cd "$here/kube137" && go build -ldflags "$ldflags_next" -o "$tmp/kube-apiserver-1.37" k8s.io/kubernetes/cmd/kube-apiserver)
echo "e2e tools: kube-apiserver $k8s_next built in $((SECONDS - start)) s" >&2
start=$SECONDS
(cd "$here" && go build -ldflags "$ldflags" -o "$tmp/kubectl" k8s.io/kubernetes/cmd/kubectl)
echo "e2e tools: kubectl built in $((SECONDS - start)) s" >&2
start=$SECONDS
(cd "$here/gatekeeper" && go build -o "$tmp/gatekeeper" github.com/open-policy-agent/gatekeeper/v3)
echo "e2e tools: Gatekeeper manager built in $((SECONDS - start)) s" >&2
start=$SECONDS
(cd "$here/capi" && go build -o "$tmp/capi-manager" sigs.k8s.io/cluster-api/core)
echo "e2e tools: Cluster API manager built in $((SECONDS - start)) s" >&2
start=$SECONDS
(cd "$here/capi" && go build -o "$tmp/clusterctl" sigs.k8s.io/cluster-api/cmd/clusterctl)
echo "e2e tools: clusterctl built in $((SECONDS - start)) s" >&2
mkdir -p "$(dirname "$dir")"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "$dir"
