#!/usr/bin/env bash
# Build the local test cluster from pinned Go modules:
#   - etcd, kube-apiserver, kube-controller-manager, kube-scheduler, Kueue, kwok,
#     promtool, kstatus and helm from go.mod here (k8s.io/kubernetes, sigs.k8s.io/kueue,
#     sigs.k8s.io/kwok, github.com/prometheus/prometheus, helm.sh/helm/v4; cmd/kstatus
#     around sigs.k8s.io/cli-utils), in one `go build`: one module graph, so the k8s.io
#     libraries, gRPC and the rest that they share compile once;
#   - the KubeRay operator from its own module (`go install module@version`:
#     it needs k8s.io v0.35 and controller-runtime v0.22);
#   - SeaweedFS's weed (the test world's S3 server, s3.py) from seaweedfs/ here, a module of
#     its own (it shares nothing to speak of with Kubernetes), rebuilt when that module changes;
#   - the manifests the harness installs from those modules: KubeRay's CRDs
#     and RBAC, Kueue's CRDs, RBAC and webhooks (`kustomize build
#     config/default` of each), kwok's Stage CRD and stock stages.
#
# Output (.cluster/bin):
#   etcd kube-apiserver kube-controller-manager kube-scheduler
#   kwok kuberay-operator kueue kustomize promtool kstatus helm weed
#   crds/ray.io_*.yaml  manifests/{kuberay,kueue,kwok}.yaml
# The build is skipped when the stamp (hash of go.mod, go.sum, the wrapper
# sources, this script) matches and every output exists; weed has a stamp of
# its own (hash of seaweedfs/'s files).
# Env: CLUSTER_BIN_DIR overrides the output folder; FORCE=1 rebuilds.
set -euo pipefail

export GOFLAGS=-buildvcs=false
export CGO_ENABLED=0

# The KubeRay the world runs: the newest the Go module proxy serves (v1.7.0's zip is refused), the one
# Kueue v0.19.2 is built against. The renderer targets v1.5.1, the oldest supported
# (rocmtrain.api.contract.KUBERAY_VERSION); rayjob_schema checks every render against both and v1.7.0,
# and names this version (WORLD).
KUBERAY_MODULE=github.com/ray-project/kuberay/ray-operator
KUBERAY_VERSION=v1.6.2
KUBERAY_CRDS=(ray.io_rayjobs.yaml ray.io_rayclusters.yaml ray.io_rayservices.yaml)
KWOK_MODULE=sigs.k8s.io/kwok
# kwok's stock stages the harness starts from (kwok.py adds its own).
KWOK_STAGES=(node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
  pod/fast/pod-ready.yaml pod/fast/pod-delete.yaml)
KUEUE_MODULE=sigs.k8s.io/kueue
HELM_MODULE=helm.sh/helm/v4
KUSTOMIZE_VERSION=v5.8.2

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)" # the checkout (this is tests/testworld/rocmtrain_testworld)
bin="${CLUSTER_BIN_DIR:-$root/.cluster/bin}"
stamp="$bin/.stamp"
kube_binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kueue kwok promtool kstatus helm)
module_binaries=(kuberay-operator)
manifests=(kuberay.yaml kueue.yaml kwok.yaml)

cd "$here"
weed_stamp="$bin/.stamp-weed"
weed_key="$(cat seaweedfs/go.mod seaweedfs/go.sum seaweedfs/tools.go | sha256sum | cut -d' ' -f1)"
key="$(
  {
    cat go.mod go.sum build.sh
    find cmd -type f -name '*.go' | LC_ALL=C sort | xargs cat
  } | sha256sum | cut -d' ' -f1
)"

up_to_date() {
  [[ "${FORCE:-0}" != 1 && -f "$stamp" && "$(cat "$stamp")" == "$key" ]] || return 1
  local f
  for f in "${kube_binaries[@]}" "${module_binaries[@]}"; do [[ -x "$bin/$f" ]] || return 1; done
  for f in "${KUBERAY_CRDS[@]}"; do [[ -f "$bin/crds/$f" ]] || return 1; done
  for f in "${manifests[@]}"; do [[ -f "$bin/manifests/$f" ]] || return 1; done
}

# The build is bound by CPU on two cores (its wall time is its CPU time over both cores, the
# downloads 25 s: see docs/benchmarks.md), so the Go compiler runs without its garbage collector
# below a 3 GiB heap: a quarter less CPU (kwok cold: 185 s against 247 s) for about 1 GiB per
# compile at most.
export GOGC=off
export GOMEMLIMIT=3GiB
# No DWARF from the compiler either (the linker's -s -w drops it anyway): kwok cold, 4% less CPU.
export GOFLAGS="$GOFLAGS -gcflags=all=-dwarf=false"

# Times one step into $tmp/times (shown at the end).
timed() {
  local name="$1" start=$SECONDS
  shift
  "$@"
  echo "$name $((SECONDS - start))s" >> "$tmp/times"
}

# kustomize renders the KubeRay and Kueue manifests below; tests/operator uses it too.
build_kustomize() {
  GOBIN="$bin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION"
}

go_mod_version() { awk -v m="$1" '$1 == m { print $2; exit }' go.mod; }
kube_version="$(go_mod_version k8s.io/kubernetes)"
KUEUE_VERSION="$(go_mod_version "$KUEUE_MODULE")"
KWOK_VERSION="$(go_mod_version "$KWOK_MODULE")"
HELM_VERSION="$(go_mod_version "$HELM_MODULE")"
kube_minor="$(echo "$kube_version" | cut -d. -f2)"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=1"
  ldflags+=" -X $pkg.gitMinor=$kube_minor -X $pkg.gitTreeState=clean"
done

build_kube() {
  # One `go build` for all nine so that shared packages are compiled once (of the Go source that
  # Kueue's build alone compiles, 22% is not shared with Kubernetes; of kwok's, 10%; of promtool's,
  # 24%; helm brings 258 packages of its own and shares 779). promtool is used for `check rules` /
  # `test rules` only, so it is built without the service-discovery plugins (tag remove_all_sd: a
  # much smaller build; the other binaries have no code under that tag).
  go build -trimpath -tags remove_all_sd \
    -ldflags "$ldflags -X $KUEUE_MODULE/pkg/version.GitVersion=$KUEUE_VERSION -X $HELM_MODULE/internal/version.version=$HELM_VERSION" \
    -o "$tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    ./cmd/etcd \
    "$KUEUE_MODULE/cmd/kueue" \
    "$KWOK_MODULE/cmd/kwok" \
    github.com/prometheus/prometheus/cmd/promtool \
    "$HELM_MODULE/cmd/helm" \
    ./cmd/kstatus
}

# Renamed into place, so a test session starting meanwhile sees the old binary or the new one.
build_weed() {
  (cd seaweedfs && go build -trimpath -ldflags "-s -w" -o "$tmp/weed" github.com/seaweedfs/seaweedfs/weed)
  mv -f "$tmp/weed" "$bin/weed"
  echo "$weed_key" > "$weed_stamp"
}

install_module() { # name package@version
  mkdir -p "$tmp/gobin-$1"
  GOBIN="$tmp/gobin-$1" go install -trimpath -ldflags "-s -w" "$2"
  mv "$tmp/gobin-$1"/* "$tmp/$1"
}

# Everything but the Kubernetes build, one after another: the second of the two streams. On two
# cores each go build already uses both; more streams only add contention (all seven at once took
# longer, 441 s of system time).
build_the_rest() { # main (1 when the main stamp is stale)
  if [[ "$("$bin/kustomize" version 2>/dev/null || true)" != "$KUSTOMIZE_VERSION" ]]; then
    echo "building kustomize $KUSTOMIZE_VERSION into $bin"
    timed kustomize build_kustomize
  fi
  if [[ "$1" == 1 ]]; then
    timed kuberay-operator install_module kuberay-operator "$KUBERAY_MODULE@$KUBERAY_VERSION"
  fi
  if [[ "${FORCE:-0}" == 1 || ! -x "$bin/weed" || "$(cat "$weed_stamp" 2>/dev/null)" != "$weed_key" ]]; then
    echo "building weed (SeaweedFS $(awk '$2 == "github.com/seaweedfs/seaweedfs" { print $3; exit }' seaweedfs/go.mod)) into $bin"
    timed weed build_weed
  fi
}

# The source folder of module@version in the module cache (downloaded if needed).
# Runs outside any module so that nothing touches go.mod.
module_dir() {
  local json dir
  json="$(cd "$tmp" && GO111MODULE=on go mod download -json "$1")"
  dir="$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  if [[ -z "$dir" || ! -d "$dir" ]]; then
    printf 'go mod download %s failed:\n%s\n' "$1" "$json" >&2
    return 1
  fi
  echo "$dir"
}

write_manifests() {
  local kuberay kueue kwok f
  kuberay="$(module_dir "$KUBERAY_MODULE@$KUBERAY_VERSION")"
  kueue="$(module_dir "$KUEUE_MODULE@$KUEUE_VERSION")"
  kwok="$(module_dir "$KWOK_MODULE@$KWOK_VERSION")"
  mkdir -p "$tmp/crds" "$tmp/manifests"
  for f in "${KUBERAY_CRDS[@]}"; do cp "$kuberay/config/crd/bases/$f" "$tmp/crds/$f"; done
  "$bin/kustomize" build "$kuberay/config/default" > "$tmp/manifests/kuberay.yaml"
  "$bin/kustomize" build "$kueue/config/default" > "$tmp/manifests/kueue.yaml"
  {
    cat "$kwok/kustomize/crd/bases/kwok.x-k8s.io_stages.yaml"
    for f in "${KWOK_STAGES[@]}"; do
      printf -- '---\n'
      cat "$kwok/kustomize/stage/$f"
    done
  } > "$tmp/manifests/kwok.yaml"
  chmod -R u+w "$tmp/crds" "$tmp/manifests"
}

start=$SECONDS
mkdir -p "$bin"
tmp="$(mktemp -d "$bin/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
: > "$tmp/times"

if up_to_date; then
  build_the_rest 0
  [[ ! -s "$tmp/times" ]] || echo "built (wall): $(tr '\n' ' ' < "$tmp/times")"
  echo "cluster binaries up to date in $bin"
  exit 0
fi

echo "building ${kube_binaries[*]} ($kube_version) and ${module_binaries[*]} into $bin"
timed kube build_kube > "$tmp/kube.log" 2>&1 &
kube_pid=$!
build_the_rest 1
write_manifests
if ! wait "$kube_pid"; then
  cat "$tmp/kube.log" >&2
  exit 1
fi

# Renames only, so a test session starting meanwhile sees old or new files.
mkdir -p "$bin/crds" "$bin/manifests"
for f in "${KUBERAY_CRDS[@]}"; do mv -f "$tmp/crds/$f" "$bin/crds/$f"; done
for f in "$bin"/crds/*.yaml; do
  [[ " ${KUBERAY_CRDS[*]} " == *" $(basename "$f") "* ]] || rm -f "$f"
done
for f in "${manifests[@]}"; do mv -f "$tmp/manifests/$f" "$bin/manifests/$f"; done
for f in "${kube_binaries[@]}" "${module_binaries[@]}"; do mv -f "$tmp/$f" "$bin/$f"; done
echo "$key" > "$stamp"
echo "per step (wall, the kube build runs beside the others): $(tr '\n' ' ' < "$tmp/times")"
echo "cluster binaries built in $((SECONDS - start))s"
