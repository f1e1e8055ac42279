#!/usr/bin/env bash
# Builds the local control plane from the Go module proxy into a cache outside the repo, only
# what is missing. Usage: hack/build-bins.sh [component...]
# Components: kube etcd kwok sched-plugins kubelet coredns (the control plane and the real nodes'
# kubelet and DNS: "default", or no argument; kubelet and coredns not when REAL_NODES=0), and on
# request kueue, volcano, e2e (upstream's end-to-end suite), helm (the chart's tests) and
# mpi-operator (the benchmark peer).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.sh
source "$here/versions.sh"

CACHE=${MPIJOB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mpijob-operator}
# Go's build and module caches inside the project's, unless set (hack/common.py go_env does the
# same): removing the project's cache starts every build from nothing, as on a new machine.
# -modcacherw: Go makes downloaded modules read-only, which would refuse a user's rm -rf.
# -dwarf=false: no debug information compiled that -ldflags "-s -w" would strip at the link
# (15 % less CPU for etcd's build from nothing).
own_gocache=${GOCACHE:+no}
export GOCACHE=${GOCACHE:-$CACHE/go-build} GOMODCACHE=${GOMODCACHE:-$CACHE/go-mod}
export GOFLAGS="-trimpath -buildvcs=false -modcacherw -gcflags=all=-dwarf=false" CGO_ENABLED=0
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}

# [build] lines go to fd 3, the caller's stderr, also from a build whose output goes to its log.
exec 3>&2
say() { printf '\033[1m[build]\033[0m %s\n' "$*" >&3; }
die() { printf '[build] error: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "Go is not installed. Install Go >= 1.26 (https://go.dev/doc/install, or 'apt-get install golang-go' if new enough) and re-run."
gover=$(go env GOVERSION | sed 's/^go//')
case "$gover" in 1.2[6-9]*|1.[3-9]*) ;; *) die "Go $gover is too old: kwok v$KWOK_VERSION needs Go >= 1.26.";; esac

kube_dir=$CACHE/bin/kubernetes-v$KUBE_VERSION
etcd_dir=$CACHE/bin/etcd-v$ETCD_VERSION
kwok_dir=$CACHE/bin/kwok-v$KWOK_VERSION
sp_dir=$CACHE/bin/scheduler-plugins-v$SCHED_PLUGINS_VERSION-k8s-v$KUBE_VERSION
mpi_dir=$CACHE/bin/mpi-operator-v$MPI_OPERATOR_VERSION
e2e_dir=$CACHE/bin/mpi-operator-e2e-v$MPI_OPERATOR_VERSION
kueue_dir=$CACHE/bin/kueue-v$KUEUE_VERSION
kubelet_dir=$CACHE/bin/kubelet-v$KUBE_VERSION
coredns_dir=$CACHE/bin/coredns-v$COREDNS_VERSION
helm_dir=$CACHE/bin/helm-v$HELM_VERSION
volcano_dir=$CACHE/bin/volcano-v$VOLCANO_VERSION

# A throwaway wrapper module per component: k8s.io/kubernetes, etcd/server and
# scheduler-plugins carry replace directives, which `go install pkg@v` refuses.
wrapper() {
  local dir=$CACHE/go-work/$1
  rm -rf "$dir"; mkdir -p "$dir"
  printf 'module local/%s\n\ngo 1.24.0\n\ngodebug default=go1.24\n' "$1" > "$dir/go.mod"
  echo "$dir"
}

have() { local d=$1; shift; for b in "$@"; do [ -x "$d/$b" ] || return 1; done; }

kube_ldflags() {
  local minor; minor=$(echo "$KUBE_VERSION" | cut -d. -f2)
  local ld="-s -w"
  for p in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    ld="$ld -X $p.gitVersion=v$KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$ld"
}

# The module proxy may lack a staging module at the exact patch release (a mirror with holes).
# Use the exact version when it downloads, else the nearest 0.<minor>.x that does, and say so:
# patch releases of one minor share their APIs. With "older" as 4th argument, earlier patches are
# tried first (kube_wrapper says when).
pick_staging() {
  local mod=$1 minor=$2 patch=$3 order=${4:-near} d p
  local steps="0 1 -1 2 -2 3 -3 4 -4 5 -5 6 -6"
  [ "$order" = older ] && steps="0 -1 -2 -3 -4 -5 -6 1 2 3 4 5 6"
  for d in $steps; do
    p=$((patch + d)); [ "$p" -ge 0 ] || continue
    if go mod download "$mod@v0.$minor.$p" >/dev/null 2>&1; then
      # Into the component's log: a hole in the mirror is no news to the person waiting.
      [ "$d" -eq 0 ] || echo "  $mod: v0.$minor.$patch is not on the module proxy; using v0.$minor.$p" >&2
      echo "v0.$minor.$p"; return 0
    fi
  done
  return 1
}

check_proxy() {
  go mod download -json "k8s.io/kubernetes@v$KUBE_VERSION" >/dev/null 2>&1 \
    || die "cannot download k8s.io/kubernetes@v$KUBE_VERSION from the Go module proxy ($(go env GOPROXY)). Check network access to the proxy or set GOPROXY."
}

# The wrapper module of a build on k8s.io/kubernetes ($1: its name): the control plane, the
# scheduler (scheduler-plugins, whose go.mod pins every staging module at KUBE_VERSION too) and
# the kubelet. They require both modules and replace each staging module alike, so they resolve
# one module graph and build in one go build (build_kubernetes); with their own go.mods, each
# recompiled nearly all of Kubernetes. A staging module the proxy lacks at KUBE_VERSION is taken
# at the nearest patch it serves; cri-api, and cri-client built on it, at an earlier patch first
# (a later cri-api patch changed a field's Go type that kubelet v$KUBE_VERSION uses). Leaves the
# shell in the wrapper.
kube_wrapper() {
  check_proxy
  local w; w=$(wrapper "$1"); cd "$w"
  local gomod; gomod=$(go mod download -json "k8s.io/kubernetes@v$KUBE_VERSION" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
  local minor patch m v order; minor=$(echo "$KUBE_VERSION" | cut -d. -f2); patch=$(echo "$KUBE_VERSION" | cut -d. -f3)
  for m in $(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$gomod"); do
    case "$m" in k8s.io/sample-*|k8s.io/code-generator) continue;; esac  # not linked into any binary
    order=near
    case "$m" in k8s.io/cri-api|k8s.io/cri-client) order=older;; esac
    v=$(pick_staging "$m" "$minor" "$patch" "$order") \
      || die "no v0.$minor.x of $m near v0.$minor.$patch on the module proxy ($(go env GOPROXY))"
    go mod edit -replace="$m=$m@$v"
  done
  go mod edit -require="k8s.io/kubernetes@v$KUBE_VERSION" \
    -require="sigs.k8s.io/scheduler-plugins@v$SCHED_PLUGINS_VERSION" \
    -replace="sigs.k8s.io/controller-runtime=sigs.k8s.io/controller-runtime@v$CONTROLLER_RUNTIME_VERSION"
  sched_plugins_source "$minor"
  mkdir -p cmd/kube-scheduler
  cp "$here/scheduler/main.go" cmd/kube-scheduler/
}

# scheduler-plugins is released for one Kubernetes minor; built on another, with the
# controller-runtime made for that minor (CONTROLLER_RUNTIME_VERSION), the patches of
# hack/patches/scheduler-plugins/1.<minor>/ carry it across the scheduler framework's changes:
# the module's source is copied next to the wrapper, patched, and replaces the module.
sched_plugins_source() {
  local patches=$here/patches/scheduler-plugins/1.$1 p
  compgen -G "$patches/*.patch" >/dev/null || return 0
  local src; src=$(go mod download -json "sigs.k8s.io/scheduler-plugins@v$SCHED_PLUGINS_VERSION" | python3 -c 'import json,sys;print(json.load(sys.stdin)["Dir"])')
  cp -r "$src" scheduler-plugins; chmod -R u+w scheduler-plugins
  for p in "$patches"/*.patch; do
    echo "  scheduler-plugins v$SCHED_PLUGINS_VERSION: applying ${p#"$here"/}" >&2
    # git apply (git is there: this is a checkout) works outside a repository too, and fails
    # whole rather than leaving half a patch.
    (cd scheduler-plugins && git apply -p1 "$p") || die "${p#"$here"/} does not apply to scheduler-plugins v$SCHED_PLUGINS_VERSION"
  done
  go mod edit -replace="sigs.k8s.io/scheduler-plugins=./scheduler-plugins"
}

# The members of that family and their binaries: "kube" the control plane's, "sched-plugins" the
# cluster's scheduler (hack/scheduler/main.go: kube-scheduler with Coscheduling) and the PodGroup
# controller, "kubelet" the real nodes'.
member_dir() {
  case $1 in kube) echo "$kube_dir";; sched-plugins) echo "$sp_dir";; kubelet) echo "$kubelet_dir";; esac
}
member_bins() {
  case $1 in
    kube) echo kube-apiserver kube-controller-manager kubectl;;
    sched-plugins) echo kube-scheduler sched-plugins-controller;;
    kubelet) echo kubelet;;
  esac
}
# A binary's package, and the name `go build -o dir/` gives it (its last element).
bin_pkg() {
  case $1 in
    kube-scheduler) echo "./cmd/kube-scheduler";;
    sched-plugins-controller) echo "sigs.k8s.io/scheduler-plugins/cmd/controller@v$SCHED_PLUGINS_VERSION";;
    *) echo "k8s.io/kubernetes/cmd/$1@v$KUBE_VERSION";;
  esac
}

# The family's missing members ($kin, from the command line) in one go build: Go compiles each
# package once and keeps both cores busy across all of them, where builds one after another left
# one idle at every link and every package few others wait on.
build_kubernetes() {
  local todo=() m b
  for m in "${kin[@]}"; do
    # shellcheck disable=SC2046  # a list of words
    have "$(member_dir "$m")" $(member_bins "$m") || todo+=("$m")
  done
  [ ${#todo[@]} -gt 0 ] || return 0
  local bins; bins=$(for m in "${todo[@]}"; do member_bins "$m"; done | xargs)
  say "Kubernetes v$KUBE_VERSION and scheduler-plugins v$SCHED_PLUGINS_VERSION in one build: $bins (the longest step: 7 to 8 min from nothing on 2 cores, beside the other builds)"
  kube_wrapper kubernetes
  local pkgs=() tools=() p
  for b in $bins; do pkgs+=("$(bin_pkg "$b")"); done
  for p in "${pkgs[@]}"; do [[ $p == ./* ]] || tools+=("$p"); done
  [ ${#tools[@]} -eq 0 ] || go get -tool "${tools[@]}"
  # The scheduler's main is the wrapper's own package: its imports' modules, resolved alike.
  case " ${pkgs[*]} " in *" ./cmd/kube-scheduler "*) go get ./cmd/kube-scheduler;; esac
  local out=$CACHE/bin/.kubernetes.tmp
  rm -rf "$out"; mkdir -p "$out"
  go build -ldflags "$(kube_ldflags)" -o "$out/" "${pkgs[@]%@*}"
  mv "$out/controller" "$out/sched-plugins-controller" 2>/dev/null || true
  for m in "${todo[@]}"; do
    local d; d=$(member_dir "$m")
    mkdir -p "$d.tmp"
    for b in $(member_bins "$m"); do mv "$out/$b" "$d.tmp/$b"; done
    rm -rf "$d"; mv "$d.tmp" "$d"
  done
  rm -rf "$out"
}

# CoreDNS serves cluster.local to the real node's pods, built with the plugins the node's
# Corefile uses (hack/realnode.py corefile) as CoreDNS documents for a build of chosen plugins:
# its own main links every plugin, and the cloud providers' SDKs were most of its build.
build_coredns() {
  have "$coredns_dir" coredns && return
  say "CoreDNS v$COREDNS_VERSION with its plugins bind, errors, health and kubernetes (the real node's cluster DNS)"
  local w; w=$(wrapper coredns); cd "$w"
  cat > main.go <<'GO'
package main

import (
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"

	"github.com/coredns/coredns/coremain"
)

func main() { coremain.Run() }
GO
  # Not `go get`: it would fetch what CoreDNS's own main imports, every plugin's modules.
  go mod edit -require="github.com/coredns/coredns@v$COREDNS_VERSION"
  go mod tidy
  mkdir -p "$coredns_dir.tmp"
  go build -ldflags "-s -w" -o "$coredns_dir.tmp/coredns" .
  rm -rf "$coredns_dir"; mv "$coredns_dir.tmp" "$coredns_dir"
}

build_helm() {
  have "$helm_dir" helm && return
  say "Helm v$HELM_VERSION (the chart's lint, template and install tests)"
  # As Helm's Makefile: the Kubernetes version helm template and lint assume is that of the
  # client-go it is built with (client-go v0.N -> Kubernetes 1.N), not the library default 1.20.
  local gomod minor
  gomod=$(go mod download -json "helm.sh/helm/v3@v$HELM_VERSION" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
  minor=$(sed -n 's#^[[:space:]]*k8s.io/client-go v0\.\([0-9]*\)\..*#\1#p' "$gomod")
  [ -n "$minor" ] || die "cannot read k8s.io/client-go's version from helm's go.mod"
  local ld="-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION"
  for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    ld="$ld -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$minor"
  done
  mkdir -p "$helm_dir.tmp"
  GOBIN="$helm_dir.tmp" go install -ldflags "$ld" "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION"
  rm -rf "$helm_dir"; mv "$helm_dir.tmp" "$helm_dir"
}

build_etcd() {
  have "$etcd_dir" etcd && return
  say "etcd v$ETCD_VERSION"
  local w; w=$(wrapper etcd); cd "$w"
  go get -tool "go.etcd.io/etcd/server/v3@v$ETCD_VERSION"
  mkdir -p "$etcd_dir.tmp"
  go build -ldflags "-s -w" -o "$etcd_dir.tmp/etcd" go.etcd.io/etcd/server/v3
  rm -rf "$etcd_dir"; mv "$etcd_dir.tmp" "$etcd_dir"
}

build_kwok() {
  have "$kwok_dir" kwok && return
  say "kwok v$KWOK_VERSION"
  mkdir -p "$kwok_dir.tmp"
  GOBIN="$kwok_dir.tmp" go install -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION"
  rm -rf "$kwok_dir"; mv "$kwok_dir.tmp" "$kwok_dir"
}

build_kueue() {
  have "$kueue_dir" kueue && return
  say "kueue v$KUEUE_VERSION: the manager (hack/kueue.py runs it on request)"
  local w; w=$(wrapper kueue); cd "$w"
  go mod edit -dropgodebug=default  # Kueue's own go.mod sets no godebug: build it as released
  go get -tool "sigs.k8s.io/kueue/cmd/kueue@v$KUEUE_VERSION"
  mkdir -p "$kueue_dir.tmp"
  go build -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=v$KUEUE_VERSION" \
    -o "$kueue_dir.tmp/kueue" sigs.k8s.io/kueue/cmd/kueue
  rm -rf "$kueue_dir"; mv "$kueue_dir.tmp" "$kueue_dir"
}

# Volcano's scheduler and controller manager, on request (hack/volcano.py runs them for the tests
# and with VOLCANO=1 make cluster; docs/compatibility.md).
# Its go.mod replaces volcano.sh/apis with a directory of its repository that the module zip
# leaves out: the published volcano.sh/apis of VOLCANO_APIS_VERSION stands in. Its k8s.io
# pins are kept, each at the nearest patch the proxy serves; pins of modules the proxy has no
# 0.<minor>.x of (legacy-cloud-providers, node-api) are outside the build graph and dropped.
build_volcano() {
  have "$volcano_dir" vc-scheduler vc-controller-manager && return
  say "Volcano v$VOLCANO_VERSION: vc-scheduler and vc-controller-manager"
  local w; w=$(wrapper volcano); cd "$w"
  local gomod; gomod=$(go mod download -json "volcano.sh/volcano@v$VOLCANO_VERSION" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
  sed -n 's#^[[:space:]]*\([a-z0-9./-]*\) => \([a-z0-9./-]*\) \(v[0-9A-Za-z.+-]*\)$#\1=\2@\3#p' "$gomod" \
    | while read -r r; do
        local target=${r#*=} mod ver
        mod=${target%@*}; ver=${target#*@}
        if [[ "$mod" == k8s.io/* && "$ver" =~ ^v0\.([0-9]+)\.([0-9]+)$ ]]; then
          ver=$(pick_staging "$mod" "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}") \
            || { echo "  $mod: no usable version on the module proxy; dropping its pin" >&2; continue; }
        fi
        go mod edit -replace="${r%%=*}=$mod@$ver"
      done
  go mod edit -replace="volcano.sh/apis=volcano.sh/apis@v$VOLCANO_APIS_VERSION"
  go get "volcano.sh/volcano/cmd/scheduler@v$VOLCANO_VERSION" "volcano.sh/volcano/cmd/controller-manager@v$VOLCANO_VERSION"
  mkdir -p "$volcano_dir.tmp"
  go build -ldflags "-s -w" -o "$volcano_dir.tmp/" volcano.sh/volcano/cmd/scheduler \
    volcano.sh/volcano/cmd/controller-manager
  mv "$volcano_dir.tmp/scheduler" "$volcano_dir.tmp/vc-scheduler"
  mv "$volcano_dir.tmp/controller-manager" "$volcano_dir.tmp/vc-controller-manager"
  rm -rf "$volcano_dir"; mv "$volcano_dir.tmp" "$volcano_dir"
}

build_mpi_operator() {
  have "$mpi_dir" mpi-operator && return
  say "upstream mpi-operator v$MPI_OPERATOR_VERSION (benchmark peer)"
  # `go install pkg@v` asks the proxy for the module's version list, which a mirror may refuse;
  # a wrapper module only fetches the exact version.
  local w; w=$(wrapper mpi-operator); cd "$w"
  go get -tool "github.com/kubeflow/mpi-operator/cmd/mpi-operator@v$MPI_OPERATOR_VERSION"
  mkdir -p "$mpi_dir.tmp"
  go build -ldflags "-s -w" -o "$mpi_dir.tmp/mpi-operator" github.com/kubeflow/mpi-operator/cmd/mpi-operator
  rm -rf "$mpi_dir"; mv "$mpi_dir.tmp" "$mpi_dir"
}

# Upstream's own end-to-end suite (test/e2e), compiled unmodified as a test binary; run against
# this operator by tests/integration/test_upstream_e2e.py. `go test -c` builds a dependency's
# package as well as one of the main module's: `go get -t` records its test-only imports.
build_e2e() {
  have "$e2e_dir" e2e.test && return
  say "upstream mpi-operator v$MPI_OPERATOR_VERSION: its end-to-end suite (test/e2e)"
  local w; w=$(wrapper mpi-operator-e2e); cd "$w"
  go mod edit -dropgodebug=default  # build the suite as its own go.mod says
  go get -t "github.com/kubeflow/mpi-operator/test/e2e@v$MPI_OPERATOR_VERSION"
  mkdir -p "$e2e_dir.tmp"
  go test -c -ldflags "-s -w" -o "$e2e_dir.tmp/e2e.test" github.com/kubeflow/mpi-operator/test/e2e
  rm -rf "$e2e_dir"; mv "$e2e_dir.tmp" "$e2e_dir"
}

# Every component builds in a subshell of its own, its Go output in $logs/<component>.log and its
# [build] lines here; two at a time, longest first, since one Go build leaves a core idle while
# it downloads modules or links. The builds on k8s.io/kubernetes are one (build_kubernetes).
# "default" stands for the control plane (and the real nodes' kubelet and CoreDNS unless
# REAL_NODES=0).
family=(kube sched-plugins kubelet)
order=(volcano kueue e2e coredns helm mpi-operator kwok etcd)
[ $# -gt 0 ] || set -- default
requested=()
for c in "$@"; do
  if [ "$c" = default ]; then
    requested+=(etcd kwok kube sched-plugins)
    [ "${REAL_NODES:-1}" = 0 ] || requested+=(kubelet coredns)
  else
    requested+=("$c")
  fi
done
for c in "${requested[@]}"; do
  case " ${family[*]} ${order[*]} " in *" $c "*) ;; *)
    die "unknown component '$c' (default ${family[*]} ${order[*]})";;
  esac
done
wants() { case " ${requested[*]} " in *" $1 "*) return 0;; esac; return 1; }
chains=() kin=()
for c in "${family[@]}"; do wants "$c" && kin+=("$c"); done
[ ${#kin[@]} -eq 0 ] || chains+=(kubernetes)
for c in "${order[@]}"; do wants "$c" && chains+=("$c"); done

logs=$CACHE/logs
mkdir -p "$logs"
# Never called where its status is tested (`build_one c || ...`): bash would then ignore errexit
# in everything it runs, and a failed step would not end its build.
build_one() {
  local c=$1 t=$SECONDS
  ( "build_${c//-/_}" ) >"$logs/$c.log" 2>&1 &
  if wait $!; then
    say "$c ready ($((SECONDS - t)) s)"
  else
    say "$c failed after $((SECONDS - t)) s; the end of $logs/$c.log:"
    tail -n 25 "$logs/$c.log" >&3
    exit 1
  fi
}

start=$SECONDS running=0 failed=0
for chain in "${chains[@]}"; do
  if [ $running -ge 2 ]; then wait -n || failed=1; running=$((running - 1)); fi
  # shellcheck disable=SC2086  # a chain is a list of words
  ( for c in $chain; do build_one "$c"; done ) &
  running=$((running + 1))
done
while [ $running -gt 0 ]; do wait -n || failed=1; running=$((running - 1)); done
[ $failed -eq 0 ] || die "a build failed (above); the rest are kept, and a re-run builds only what is missing"
# Built once, the binaries are the cache: Go's compiled packages (12 GB after the control plane
# and the real nodes' builds) are not kept, unless GOCACHE was set (then they are the user's).
# The downloaded modules are: a version bump reuses most of them.
[ -n "$own_gocache" ] || rm -rf "$GOCACHE"
say "all ready in $((SECONDS - start)) s under $CACHE/bin"
