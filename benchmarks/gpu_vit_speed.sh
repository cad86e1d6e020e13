#!/usr/bin/env bash
# The ViT workloads of benchmarks/train_speed.py on one GPU (written for an H100 with 16 CPU
# cores): DINO multi-crop ViT-S/16 and ViT-B/16, MAE ViT-B/16 (and MAE ViT-S/16 when time is
# left), the engine in float32 and in bfloat16 autocast beside the bare loops of the same
# precision, within BUDGET seconds (default 450) in all; WORKERS (default 8) data-loading
# processes on both sides. A workload stopped at its limit (160 s) keeps its per-round lines.
#
#   bash benchmarks/gpu_vit_speed.sh prepare   # here, with the project's environment: copies
#                                              # the pure-Python packages the engine needs
#                                              # into .gpu_site/ (git-ignored; carry it)
#   bash benchmarks/gpu_vit_speed.sh           # on the GPU machine, in the repository root
#
# Output: one file per workload, "$OUT"/<workload>.txt (OUT defaults to
# /tmp/gpu_vit_speed), plus setup.txt, and each workload's table echoed at the end.
# A machine without network: the packages come from .gpu_site/ (torch, torchvision, numpy,
# PIL, scikit-learn, matplotlib, tensorboard are the machine's own); with network and no
# .gpu_site/, the README's set-up (a venv, torch 2.14.1, pip install -e .) is done instead.
set -u
cd "$(dirname "$0")/.."
PACKAGES="hydra omegaconf antlr4 classy_vision fairscale fvcore iopath submitit termcolor \
wcwidth yacs timm"

if [ "${1:-}" = "prepare" ]; then
    PY=${PYTHON:-python3}
    rm -rf .gpu_site && mkdir -p .gpu_site
    "$PY" - $PACKAGES <<'EOF'
import importlib, importlib.metadata as md, os, shutil, sys
for name in sys.argv[1:]:
    module = importlib.import_module(name)
    shutil.copytree(os.path.dirname(module.__file__), os.path.join(".gpu_site", name),
                    ignore=shutil.ignore_patterns("__pycache__", "tests"))
for dist in md.distributions():  # the metadata of the copied packages (versions, entry points)
    top = (dist.read_text("top_level.txt") or "").split()
    if set(top) & set(sys.argv[1:]) or dist.metadata["Name"].lower() in sys.argv[1:]:
        path = str(dist._path)
        shutil.copytree(path, os.path.join(".gpu_site", os.path.basename(path)))
EOF
    du -sh .gpu_site
    exit 0
fi

OUT=${OUT:-/tmp/gpu_vit_speed}
BUDGET=${BUDGET:-450}  # seconds for everything, the set-up included
mkdir -p "$OUT"
START=$(date +%s)
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
{
    if [ -d .gpu_site ]; then
        export PYTHONPATH="$PWD/.gpu_site:$PWD"
    else
        export PYTHONPATH="$PWD"
    fi
    if ! $PY -c "import hydra, omegaconf, classy_vision, fairscale, submitit, timm" 2>/dev/null
    then  # the README's set-up (needs the network)
        python3 -m venv .venv && . .venv/bin/activate && pip install -q -U pip \
            && pip install -q torch==2.14.1 torchvision==0.29.1 && pip install -q -e . \
            && PY=python
    fi
    nvidia-smi -L
    $PY -c "import torch, timm; print('torch', torch.__version__, 'timm', timm.__version__, \
'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0))"
    echo "set-up: $(( $(date +%s) - START )) s"
} > "$OUT/setup.txt" 2>&1
cat "$OUT/setup.txt"
export PYTHONPATH

# workload, batch (images per step), in the order they run; the last only when time is left
RUNS="dino_vit_s16:64 mae_vit_b16:64 dino_vit_b16:32 mae_vit_s16:128"
for run in $RUNS; do
    workload=${run%%:*}; batch=${run##*:}
    left=$(( BUDGET - ($(date +%s) - START) ))
    if [ "$left" -lt 60 ]; then
        echo "$workload: skipped, $left s of the budget left"; continue
    fi
    limit=$(( left < 160 ? left : 160 ))
    began=$(date +%s)
    timeout "$limit" $PY benchmarks/train_speed.py --device gpu --workload "$workload" \
        --batch "$batch" --rounds 2 --iters 12 --warmup 4 --workers "${WORKERS:-8}" \
        --variants "engine fp32" "bf16 autocast" > "$OUT/$workload.txt" 2>&1
    echo "$workload: exit $?, $(( $(date +%s) - began )) s (limit $limit s)"
done

echo; echo "summary (total $(( $(date +%s) - START )) s)"
for run in $RUNS; do
    file="$OUT/${run%%:*}.txt"
    [ -f "$file" ] || continue
    if grep -q " on gpu: median" "$file"; then
        sed -n '/ on gpu: median/,$p' "$file"
    else
        echo "${run%%:*}: no table; its last lines:"; tail -n 15 "$file"
    fi
    echo
done
