#!/usr/bin/env bash
# Builds the test bed's components from the Go module proxy into a cache keyed by version.
# Idempotent: a component whose directory holds .complete is not rebuilt. Nothing lands in the
# work tree; the build modules are generated in a temporary directory.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.7.3}"            # the newest served (k8s v1.37.2 requires the v3.7 client)
CONTAINERD_VERSION="${CONTAINERD_VERSION:-v2.4.2}"
CRITOOLS_VERSION="${CRITOOLS_VERSION:-v1.37.0}"
RUNC_VERSION="${RUNC_VERSION:-v1.5.2}"           # Debian's 1.1.5 cannot start containers here
CACHE="${CNIDRA_CACHE:-$HOME/.cache/cnidra}"

export GOFLAGS="-buildvcs=false -trimpath" CGO_ENABLED=0

log() { printf '[build %s] %s\n' "$(date +%T)" "$*" >&2; }

done_or_build() {  # done_or_build <dir> <function>
  local dir="$1" fn="$2"
  [[ -f "$dir/.complete" ]] && return 0
  local start=$SECONDS
  rm -rf "$dir.tmp"; mkdir -p "$dir.tmp"
  "$fn" "$dir.tmp"
  touch "$dir.tmp/.complete"
  rm -rf "$dir"; mv "$dir.tmp" "$dir"
  log "$(basename "$dir") built in $((SECONDS - start))s"
}

BUILD_TMP="$(mktemp -d /tmp/cnidra-build.XXXXXX)"
trap 'rm -rf "$BUILD_TMP"' EXIT

scratch_module() {  # prints a fresh module directory
  local d; d="$(mktemp -d "$BUILD_TMP/mod.XXXXXX")"
  (cd "$d" && go mod init cnidra.local/build >/dev/null 2>&1)
  echo "$d"
}

build_kubernetes() {
  local out="$1" mod modfile minor
  mod="$(scratch_module)"
  modfile="$(cd "$mod" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
  # k8s.io/kubernetes replaces every k8s.io/* staging module with a local path; a module that
  # depends on it must pin each one to the matching published v0.X.Y instead.
  local staging="v0.${K8S_VERSION#v1.}"
  {
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo "replace ("
    sed -n 's|^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/src/.*|\t\1 => \1 '"$staging"'|p' "$modfile"
    echo ")"
  } >> "$mod/go.mod"
  minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local ver_pkg=k8s.io/component-base/version
  local ldflags="-s -w -X $ver_pkg.gitVersion=$K8S_VERSION -X $ver_pkg.gitMajor=1 -X $ver_pkg.gitMinor=$minor -X $ver_pkg.gitTreeState=clean -X $ver_pkg.buildDate=1970-01-01T00:00:00Z"
  ldflags="$ldflags -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  (cd "$mod"
   for cmd in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do
     log "go build $cmd"
     go build -mod=mod -ldflags "$ldflags" -o "$out/$cmd" "k8s.io/kubernetes/cmd/$cmd"
   done)
}

build_etcd() {
  local out="$1" mod
  mod="$(scratch_module)"
  # etcd's own main module carries replace directives, so `go install` refuses it; its entry
  # point is one call into etcdmain, which this generated main makes.
  cat > "$mod/main.go" <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  (cd "$mod" && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null 2>&1 && go mod tidy >/dev/null 2>&1 \
     && log "go build etcd" && go build -ldflags "-s -w" -o "$out/etcd" .)
}

build_containerd() {
  local out="$1"
  log "go install containerd, ctr, containerd-shim-runc-v2"
  GOBIN="$out" go install -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
    -tags "no_btrfs no_devmapper no_zfs" \
    "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"
}

build_crictl() {
  local out="$1" mod
  mod="$(scratch_module)"
  # The proxy answers 403 for cri-tools' version list, which `go install pkg@version` reads for
  # its deprecation check; requiring the exact version in a scratch module needs no list.
  echo "require sigs.k8s.io/cri-tools $CRITOOLS_VERSION" >> "$mod/go.mod"
  log "go build crictl"
  (cd "$mod" && go build -mod=mod -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRITOOLS_VERSION" \
     -o "$out/crictl" sigs.k8s.io/cri-tools/cmd/crictl)
}

build_runc() {
  local out="$1"
  log "go install runc (cgo, seccomp)"
  GOBIN="$out" CGO_ENABLED=1 go install -tags seccomp \
    -ldflags "-s -w -X main.version=${RUNC_VERSION#v}" "github.com/opencontainers/runc@$RUNC_VERSION"
}

debian_packages() {
  local missing=()
  dpkg -s libseccomp-dev >/dev/null 2>&1 || missing+=(libseccomp-dev pkg-config)
  [[ -x /bin/busybox ]] || missing+=(busybox-static)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v openssl >/dev/null || missing+=(openssl)
  command -v conntrack >/dev/null || missing+=(conntrack)
  command -v mount >/dev/null || missing+=(mount)
  if ((${#missing[@]})); then
    log "apt-get install ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null; }
  fi
}

main() {
  local start=$SECONDS
  debian_packages
  "$(dirname "$0")/../hack/install-cni.sh"
  done_or_build "$CACHE/etcd-$ETCD_VERSION" build_etcd
  done_or_build "$CACHE/containerd-$CONTAINERD_VERSION" build_containerd
  done_or_build "$CACHE/crictl-$CRITOOLS_VERSION" build_crictl
  done_or_build "$CACHE/runc-$RUNC_VERSION" build_runc
  done_or_build "$CACHE/kubernetes-$K8S_VERSION" build_kubernetes
  log "all components ready in $((SECONDS - start))s; cache $(du -sh "$CACHE" | cut -f1)"
}

if [[ "${1:-}" == paths ]]; then
  echo "K8S_BIN=$CACHE/kubernetes-$K8S_VERSION"
  echo "ETCD_BIN=$CACHE/etcd-$ETCD_VERSION"
  echo "CONTAINERD_BIN=$CACHE/containerd-$CONTAINERD_VERSION"
  echo "CRICTL_BIN=$CACHE/crictl-$CRITOOLS_VERSION"
  echo "RUNC_BIN=$CACHE/runc-$RUNC_VERSION"
  exit 0
fi
main
