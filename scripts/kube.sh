#!/usr/bin/env bash
# Builds a real Kubernetes API server (kube-apiserver) and etcd from their Go modules, for
# the integration tests that talk to the Kubernetes API (tests/it/kube/mod.rs): discovery =
# "kubernetes" is tested against the real API, never a stand-in for it. No binary is
# downloaded: both are compiled from source fetched through the Go module proxy, with the
# local Go toolchain only (GOTOOLCHAIN=local; Kubernetes 1.37 needs Go >= 1.26.0).
#
#   scripts/kube.sh            prints the directory holding both binaries on its last line:
#                              dir=$(scripts/kube.sh | tail -1)
#
# The binaries are cached outside the repository, keyed by version:
#   ${TOLLGATE_KUBE_CACHE:-$HOME/.cache/tollgate}/kube-<K8S_VERSION>-etcd-<ETCD_VERSION>/
# When both are there it does nothing but print that directory. The Go module and build
# caches live under ${TOLLGATE_KUBE_CACHE}/go/ (not the user's defaults: a cold run is the
# same on every machine, and the whole thing goes with `rm -rf ~/.cache/tollgate`), shared
# by every version so a version bump rebuilds only what changed.
#
# Cold (empty cache: module downloads and both builds), measured twice on a 2-core machine
# shared with other builds (load 11 to 16): 24 and 30 minutes, 14 minutes of CPU time
# (etcd is 2 of them); 3.7 GB under the cache dir. Warm (binaries present): instant; with
# the Go caches warm and a binary missing: under half a minute.
set -euo pipefail

K8S_VERSION=${TOLLGATE_K8S_VERSION:-1.37.2}
ETCD_VERSION=${TOLLGATE_ETCD_VERSION:-3.7.4}
CACHE=${TOLLGATE_KUBE_CACHE:-$HOME/.cache/tollgate}
DIR=$CACHE/kube-$K8S_VERSION-etcd-$ETCD_VERSION

if [ -x "$DIR/kube-apiserver" ] && [ -x "$DIR/etcd" ]; then
  echo "$DIR"
  exit 0
fi

say() { printf 'kube: %s\n' "$*" >&2; }
die() { printf 'kube: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null 2>&1 || die "go not found: the API server and etcd are built from source (Go >= 1.26.0)"
mkdir -p "$DIR"
# Two test runs at once build once.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$DIR.lock"
  flock 9
  if [ -x "$DIR/kube-apiserver" ] && [ -x "$DIR/etcd" ]; then
    echo "$DIR"
    exit 0
  fi
fi

export GOMODCACHE=$CACHE/go/mod GOCACHE=$CACHE/go/build
export GOTOOLCHAIN=local GOWORK=off GOFLAGS="-mod=mod -modcacherw -buildvcs=false" CGO_ENABLED=0
BUILD=$DIR/build
started=$SECONDS
say "building kube-apiserver v$K8S_VERSION and etcd v$ETCD_VERSION into $DIR ($(go version | cut -d' ' -f3))"

# etcd: a main package calling etcdmain, as etcd's own server/main.go does.
build_etcd() {
  mkdir -p "$BUILD/etcd"
  cd "$BUILD/etcd"
  cat >go.mod <<EOF
module tollgate.test/etcd

go 1.26.0

require go.etcd.io/etcd/server/v3 v$ETCD_VERSION
EOF
  cat >main.go <<'EOF'
// etcd, as etcd's own server/main.go starts it.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
EOF
  say "etcd: downloading modules and building"
  go build -trimpath -ldflags='-s -w' -o "$DIR/etcd.part" .
  mv "$DIR/etcd.part" "$DIR/etcd"
  say "etcd: done after $((SECONDS - started)) s"
}

# kube-apiserver: k8s.io/kubernetes requires its staging modules (k8s.io/api, apimachinery,
# apiserver, client-go, ...) as v0.0.0, replaced by directories of its own repository; from
# the module proxy each is published as v0.<minor>.<patch>, so the wrapper replaces each
# with that version. The main package is Kubernetes' own cmd/kube-apiserver.
build_apiserver() {
  mkdir -p "$BUILD/kube-apiserver"
  cd "$BUILD/kube-apiserver"
  say "kube-apiserver: reading k8s.io/kubernetes v$K8S_VERSION's go.mod"
  local gomod staging minor ldflags
  gomod=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
  [ -f "$gomod" ] || die "could not download k8s.io/kubernetes v$K8S_VERSION"
  staging=$(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" { print $1 }' "$gomod" | sort -u)
  [ -n "$staging" ] || die "no staging modules found in $gomod"
  {
    printf 'module tollgate.test/kube-apiserver\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes v%s\n\nreplace (\n' "$K8S_VERSION"
    for m in $staging; do printf '\t%s => %s v0.%s\n' "$m" "$m" "${K8S_VERSION#1.}"; done
    printf ')\n'
  } >go.mod
  rm -f go.sum
  # The version the server reports (/version), as Kubernetes' own build stamps it.
  minor=${K8S_VERSION#*.}
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$K8S_VERSION"
  ldflags+=" -X k8s.io/component-base/version.gitMajor=${K8S_VERSION%%.*}"
  ldflags+=" -X k8s.io/component-base/version.gitMinor=${minor%%.*}"
  say "kube-apiserver: downloading modules and building ($(echo "$staging" | wc -l) staging modules pinned)"
  go build -trimpath -ldflags="$ldflags" -o "$DIR/kube-apiserver.part" k8s.io/kubernetes/cmd/kube-apiserver
  mv "$DIR/kube-apiserver.part" "$DIR/kube-apiserver"
  say "kube-apiserver: done after $((SECONDS - started)) s"
}

[ -x "$DIR/etcd" ] || build_etcd
[ -x "$DIR/kube-apiserver" ] || build_apiserver
"$DIR/kube-apiserver" --version >&2
echo "$DIR"
