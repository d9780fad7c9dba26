#!/usr/bin/env bash
# Fills .gpu-carry/ (git ignores it) with what the lent GPU machine lacks for `gpu_lm_check.sh`, run HERE, in the
# checkout whose working tree the device tool sends. That machine reaches no package registry; its image has
# Python 3.12, torch with CUDA, numpy, pyarrow, pandas, pyyaml, accelerate, tokenizers, safetensors and
# huggingface_hub, but not Ray, pydantic, jsonschema, tensorboardX, TRL or datasets, and other versions of
# transformers and peft than ours. So this downloads our pinned versions (constraints.txt) as CPython 3.12 x86-64
# wheels (TRL and datasets for the bench's TRL arms), Liger's kernels (pure Python over Triton, which torch's CUDA
# and ROCm builds bring; flash-attn, hundreds of MB built per torch, does not fit the carry), and Ray's
# wheel, 79 MB, as a tar.xz of about 29 MB without the parts a local Ray Train run never loads (the Java
# workers' jar, RLlib, the dashboard's web client, ray.llm): about 49 MB in all, under the tool's 64 MiB.
#     bash bench/gpu_lm_carry.sh        # about 2 minutes; then see docs/benchmarks.md#gpus for the run
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
CARRY=.gpu-carry
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")" && { grep -qxF "/$CARRY/" "$exclude" 2>/dev/null || echo "/$CARRY/" >>"$exclude"; }
rm -rf "$CARRY" && mkdir -p "$CARRY"
pinned() { grep -iE "^$1==" constraints.txt | head -1; }
WHEELS=(transformers peft pydantic pydantic_core annotated-types typing-inspection typing_extensions
    jsonschema jsonschema-specifications referencing rpds-py tensorboardX trl datasets dill multiprocess xxhash)
LIGER=liger-kernel==0.8.5  # not pinned in constraints.txt: the project does not depend on it
PYTHON=${PYTHON:-python3}
download() {
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$1" "${@:2}"
}
specs=()
for name in "${WHEELS[@]}"; do
    spec=$(pinned "$name") || { echo "no pin for $name in constraints.txt" >&2; exit 1; }
    specs+=("$spec")
done
download "$CARRY" "${specs[@]}" "$LIGER"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
download "$work" "$(pinned ray)"
mkdir "$work/ray" && (cd "$work/ray" && unzip -q ../ray-*.whl)
rm -rf "$work"/ray/ray/{jars,rllib,llm} "$work/ray/ray/dashboard/client/build"
tar -C "$work/ray" -cJf "$CARRY/ray.tar.xz" .
du -sh "$CARRY" && ls "$CARRY"
