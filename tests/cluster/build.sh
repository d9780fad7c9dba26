#!/usr/bin/env bash
# Build the local test control plane (etcd, kube-apiserver,
# kube-controller-manager) from the pinned Go modules in tests/cluster/go.mod
# and fetch KubeRay's CRDs from its Go module.
#
# Output: .cluster/bin/{etcd,kube-apiserver,kube-controller-manager}
#         .cluster/bin/crds/ray.io_*.yaml
#         .cluster/bin/{kustomize,promtool,kstatus} (each with its own stamp)
# The build is skipped when the stamp (hash of go.mod, go.sum, the wrapper
# sources, this script) matches and every output exists.
# Env: CLUSTER_BIN_DIR overrides the output folder; FORCE=1 rebuilds.
set -euo pipefail

export GOFLAGS=-buildvcs=false
export CGO_ENABLED=0

# KubeRay ray-operator module whose CRDs (config/crd/bases) the tests install;
# keep in step with the renderer's KubeRay pin.
KUBERAY_MODULE=github.com/ray-project/kuberay/ray-operator
KUBERAY_VERSION=v1.5.1
KUBERAY_CRDS=(ray.io_rayjobs.yaml ray.io_rayclusters.yaml ray.io_rayservices.yaml)

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${CLUSTER_BIN_DIR:-$root/.cluster/bin}"
stamp="$bin/.stamp"
binaries=(etcd kube-apiserver kube-controller-manager)

cd "$here"
key="$(
  {
    cat go.mod go.sum build.sh
    find cmd -type f -name '*.go' | LC_ALL=C sort | xargs cat
    echo "kuberay=$KUBERAY_MODULE@$KUBERAY_VERSION"
  } | sha256sum | cut -d' ' -f1
)"

up_to_date() {
  [[ "${FORCE:-0}" != 1 && -f "$stamp" && "$(cat "$stamp")" == "$key" ]] || return 1
  local f
  for f in "${binaries[@]}"; do [[ -x "$bin/$f" ]] || return 1; done
  for f in "${KUBERAY_CRDS[@]}"; do [[ -f "$bin/crds/$f" ]] || return 1; done
}

# --- kustomize, for `kustomize build manifests/` in tests/operator (operator issue) ---
KUSTOMIZE_VERSION=v5.8.2
if [[ "$("$bin/kustomize" version 2>/dev/null || true)" != "$KUSTOMIZE_VERSION" ]]; then
  echo "building kustomize $KUSTOMIZE_VERSION into $bin"
  GOBIN="$bin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION"
fi
# --- end kustomize ---

# --- promtool and kstatus, for tests/monitoring and the status tests (observability issue) ---
# promtool from the Prometheus Go module, without the service-discovery plugins it does not
# need for `check rules` / `test rules` (build tag remove_all_sd: a much smaller build);
# kstatus: tests/kstatus, a small command around sigs.k8s.io/cli-utils' kstatus (Flux's).
PROMETHEUS_MODULE_VERSION=v0.316.0
mkdir -p "$bin"
tool_stamp() { [[ "${FORCE:-0}" != 1 && -x "$bin/$1" && "$(cat "$bin/.$1.stamp" 2>/dev/null)" == "$2" ]]; }
if ! tool_stamp promtool "$PROMETHEUS_MODULE_VERSION"; then
  echo "building promtool ($PROMETHEUS_MODULE_VERSION) into $bin"
  GOBIN="$bin" go install -trimpath -tags remove_all_sd -ldflags "-s -w" \
    "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_MODULE_VERSION"
  echo "$PROMETHEUS_MODULE_VERSION" > "$bin/.promtool.stamp"
fi
kstatus_key="$(cat "$here/../kstatus/go.mod" "$here/../kstatus/go.sum" "$here/../kstatus/main.go" | sha256sum | cut -d' ' -f1)"
if ! tool_stamp kstatus "$kstatus_key"; then
  echo "building kstatus (sigs.k8s.io/cli-utils) into $bin"
  (cd "$here/../kstatus" && go build -trimpath -ldflags "-s -w" -o "$bin/kstatus" .)
  echo "$kstatus_key" > "$bin/.kstatus.stamp"
fi
# --- end promtool and kstatus ---

if up_to_date; then
  echo "cluster binaries up to date in $bin"
  exit 0
fi

start=$SECONDS
kube_version="$(awk '$1 == "k8s.io/kubernetes" { print $2; exit }' go.mod)"
kube_minor="$(echo "$kube_version" | cut -d. -f2)"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=1"
  ldflags+=" -X $pkg.gitMinor=$kube_minor -X $pkg.gitTreeState=clean"
done

mkdir -p "$bin"
tmp="$(mktemp -d "$bin/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

echo "building etcd, kube-apiserver, kube-controller-manager ($kube_version) into $bin"
# One `go build` for all three so shared packages are compiled once.
go build -trimpath -ldflags "$ldflags" -o "$tmp/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  ./cmd/etcd

echo "fetching $KUBERAY_MODULE@$KUBERAY_VERSION CRDs"
# Run outside this module so the download does not touch go.mod.
json="$(cd "$tmp" && GO111MODULE=on go mod download -json "$KUBERAY_MODULE@$KUBERAY_VERSION")"
moddir="$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
if [[ -z "$moddir" || ! -d "$moddir/config/crd/bases" ]]; then
  printf 'go mod download failed:\n%s\n' "$json" >&2
  exit 1
fi
mkdir -p "$tmp/crds"
for f in "${KUBERAY_CRDS[@]}"; do
  cp "$moddir/config/crd/bases/$f" "$tmp/crds/$f"
done
chmod -R u+w "$tmp/crds"

# Renames only, so a test session starting meanwhile sees old or new files.
mkdir -p "$bin/crds"
for f in "${KUBERAY_CRDS[@]}"; do mv -f "$tmp/crds/$f" "$bin/crds/$f"; done
for f in "$bin"/crds/*.yaml; do
  [[ " ${KUBERAY_CRDS[*]} " == *" $(basename "$f") "* ]] || rm -f "$f"
done
for f in "${binaries[@]}"; do mv -f "$tmp/$f" "$bin/$f"; done
echo "$key" > "$stamp"
echo "cluster binaries built in $((SECONDS - start))s"
