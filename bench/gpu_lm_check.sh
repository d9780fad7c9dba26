#!/usr/bin/env bash
# The language-model GPU check, run ON the lent GPU machine from the repository root (docs/benchmarks.md#gpus):
# reports what the machine has, installs .gpu-carry/ (made here by bench/gpu_lm_carry.sh) into /tmp/site, and
# runs `bench/gpu_throughput.py --lm`, writing into $OUT: env.txt (what it found), lm.json (the results, rewritten
# after every case) and log.txt (everything printed). A case not started within LM_BUDGET_S seconds of the bench's
# start is skipped; the bench is stopped after LM_TIMEOUT_S. Given a script and its arguments, runs that in place of
# the language-model case, under the same limit, its output also in $OUT/check.jsonl. env.txt says which kernel
# packages the machine has (flash-attn, liger-kernel, triton): without flash-attn, the varlen arms run SDPA's masked
# path; without liger-kernel, the arms that need Liger are skipped, each with the reason in lm.json.
#     bash bench/gpu_lm_check.sh                   # needs $OUT; LM_SIZES=1b LM_MODES=lora LM_VARIANTS=none,fsdp for less
#     LM_SIZES=3b LM_MODES=full LM_REFERENCES= LM_TRL=varlen LM_VARIANTS=varlen+chunked,varlen+tokens16k+fused+gc \
#         bash bench/gpu_lm_check.sh               # the issue's goals alone (LM_REFERENCES= runs no reference arm)
#     bash bench/gpu_lm_check.sh bench/gpu_fsdp_check.py --plan
set -uo pipefail
OUT=${OUT:?set OUT to the folder for the results}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

{
    echo "== machine"; date -u; nproc; free -g | head -2; df -h /tmp | tail -1
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || echo "no nvidia-smi"
    command -v rocm-smi >/dev/null && rocm-smi --showproductname 2>&1 | head -5
    echo "== python"; command -v "$PYTHON"; "$PYTHON" -V
    "$PYTHON" -c "import torch; c = torch.cuda.is_available(); print('torch', torch.__version__, 'cuda', \
torch.version.cuda, 'hip', torch.version.hip, 'available', c, torch.cuda.get_device_name(0) if c else '')" 2>&1
    "$PYTHON" -m pip list 2>/dev/null | grep -iE "^(torch|transformers|peft|accelerate|tokenizers|ray|pydantic|\
pyarrow|numpy|huggingface.hub|safetensors|jsonschema|tensorboardx|trl|datasets|flash.attn|liger.kernel|triton) " || true
} | tee "$OUT/env.txt"

echo "== install"
SITE=/tmp/site
if [ -d .gpu-carry ]; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        .gpu-carry/*.whl || exit 1
    "$PYTHON" -c "import tarfile; tarfile.open('.gpu-carry/ray.tar.xz').extractall('$SITE', filter='tar')" || exit 1
else
    echo "no .gpu-carry/ (make it with bench/gpu_lm_carry.sh and carry it): using what the machine has"
fi
export PYTHONPATH="$SITE:$PWD/operator:$PWD/training_image:$PWD/bench"
"$PYTHON" -c "import ray, transformers, peft, pydantic, rocmtrain_train.trainer.torch_trainer; \
print('ray', ray.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, \
'pydantic', pydantic.__version__)" 2>&1 | tee -a "$OUT/env.txt" || exit 1
"$PYTHON" -c "import gpu_lm, trl; print('trl', trl.__version__, 'kernels', gpu_lm.installed_kernels())" 2>&1 \
    | tee -a "$OUT/env.txt"

if [ $# -gt 0 ]; then
    echo "== $*"
    timeout "${LM_TIMEOUT_S:-360}" "$PYTHON" "$@" | tee "$OUT/check.jsonl"
    exit "${PIPESTATUS[0]}"
fi

echo "== the language-model case"
args=(--lm --out "$OUT/lm.json" --budget-s "${LM_BUDGET_S:-270}")
[ -n "${LM_SIZES:-}" ] && args+=(--sizes "$LM_SIZES")
[ -n "${LM_MODES:-}" ] && args+=(--modes "$LM_MODES")
[ -n "${LM_VARIANTS:-}" ] && args+=(--variants "$LM_VARIANTS")
[ -n "${LM_REFERENCES+set}" ] && args+=(--references "$LM_REFERENCES")
[ -n "${LM_TRL+set}" ] && args+=(--trl "$LM_TRL")
timeout "${LM_TIMEOUT_S:-360}" "$PYTHON" bench/gpu_throughput.py "${args[@]}"
