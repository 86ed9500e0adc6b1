#!/usr/bin/env bash
# Builds the real control plane the `control_plane` test tier runs (docs/twin.md, "Real control plane"):
# kube-apiserver, kube-scheduler, kube-controller-manager, etcd, kwok and helm, each from the wrapper module
# beside this script (pinned go.mod/go.sum), into a cache directory outside the work tree keyed by the
# versions and the wrapper modules' hashes. A no-op when the binaries are there.
#
#   controlplane/build.sh            build what is missing, print the bin directory (last line of stdout)
#   controlplane/build.sh --dir      print the bin directory only, build nothing (exit 1 when incomplete)
#   controlplane/build.sh --tier     as the first form, for `make test`: a build that cannot happen or
#                                    fails ends with the one line "control_plane tier skipped: <why>"
#
# Exit 0: built (or already there); exit 3: cannot build here (no Go toolchain); any other exit: the
# build failed (its log named on stderr). Every compile runs under `nice -n 19`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
mode="${1:-}"
# fail CODE MESSAGE -- one line on stderr, in the tier's words when `make test` asked.
fail() {
  if [ "$mode" = "--tier" ]; then echo "control_plane tier skipped: $2" >&2; else echo "control-plane: $2" >&2; fi
  exit "$1"
}

KUBE_VERSION=v1.37.2 ETCD_VERSION=v3.7.3 KWOK_VERSION=v0.8.0 HELM_VERSION=v4.3.1
PROGRAMS=(kube-apiserver kube-scheduler kube-controller-manager etcd kwok helm)

module_hash() { cat "$here"/*/go.mod "$here"/*/go.sum "$here"/*/tools.go | sha256sum | cut -c1-12; }
key="k8s-${KUBE_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}_$(module_hash)"
root="${PF_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/powerfleet}/control-plane/$key"
bin="$root/bin"

stages="$root/kwok-stages.yaml"
complete() { for p in "${PROGRAMS[@]}"; do [ -x "$bin/$p" ] || return 1; done; [ -s "$stages" ]; }

if [ "$mode" = "--dir" ]; then complete && { echo "$bin"; exit 0; }; exit 1; fi
if complete; then echo "$bin"; exit 0; fi
if ! command -v go >/dev/null 2>&1; then
  fail 3 "no Go toolchain on PATH, so the real control plane cannot be built here (make control-plane)"
fi

mkdir -p "$bin"
log="$root/build.log"
minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
# Without these the servers report v0.0.0-master and Helm's kubeVersion checks fail (kubernetes#73916).
kube_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${KUBE_VERSION}
 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor}
 -X k8s.io/component-base/version.gitTreeState=clean
 -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"

# build MODULE_DIR PACKAGE PROGRAM LDFLAGS -- compiles into a temporary file, then moves it into place, so an
# interrupted build never leaves a half-written binary that looks complete.
build() {
  local dir="$1" pkg="$2" name="$3" ldflags="$4"
  [ -x "$bin/$name" ] && return 0
  local start=$SECONDS
  echo "control-plane: building $name ..." >&2
  ( cd "$here/$dir" && nice -n 19 go build -mod=readonly -trimpath -ldflags "$ldflags" -o "$bin/.$name.tmp" "$pkg" ) \
    >>"$log" 2>&1 || { rm -f "$bin/.$name.tmp"; fail 1 "building $name failed; see $log"; }
  mv -f "$bin/.$name.tmp" "$bin/$name"
  echo "$(date -u +%FT%TZ) $name: $((SECONDS - start)) s" >>"$root/build-times.txt"
  echo "control-plane: $name built in $((SECONDS - start)) s" >&2
}

total=$SECONDS
for dir in kube etcd kwok helm; do
  ( cd "$here/$dir" && go mod download ) >>"$log" 2>&1 \
    || fail 1 "go mod download ($dir) failed; see $log"
done
echo "$(date -u +%FT%TZ) go mod download: $((SECONDS - total)) s" >>"$root/build-times.txt"
# etcd and the API server first: they are all the tier's fixture needs to start.
build etcd go.etcd.io/etcd/server/v3 etcd "-s -w"
build kube k8s.io/kubernetes/cmd/kube-apiserver kube-apiserver "$kube_ldflags"
build kube k8s.io/kubernetes/cmd/kube-scheduler kube-scheduler "$kube_ldflags"
build kube k8s.io/kubernetes/cmd/kube-controller-manager kube-controller-manager "$kube_ldflags"
build kwok sigs.k8s.io/kwok/cmd/kwok kwok "-s -w"
# kwok's binary embeds no stages (kwokctl writes them into its config): the same defaults, node
# initialisation, heartbeat with a lease, and pods created, Ready, completed and deleted, from the module.
if [ ! -s "$stages" ]; then
  src="$(cd "$here/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage"
  for f in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
           pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
    echo "---"; cat "$src/$f.yaml"
  done >"$stages.tmp" && mv "$stages.tmp" "$stages"
fi
build helm helm.sh/helm/v4/cmd/helm helm "-s -w -X helm.sh/helm/v4/internal/version.version=${HELM_VERSION}"
echo "control-plane: ready in $((SECONDS - total)) s: $bin" >&2
echo "$bin"
