#!/usr/bin/env bash
# One command on a lent GPU: the engine against bare PyTorch loops (SimCLR ResNet-50 with CPU
# augmentation and with DATA.TRAIN.DEVICE_AUGMENTATION, DINO ViT-S/16 multi-crop, MAE
# ViT-B/16; float32 and bfloat16), one table printed at the end (benchmarks/gpu_suite.py says
# what each column is), within BUDGET seconds (420 by default: under 8 minutes with the set-up).
#
#   bash benchmarks/gpu_suite.sh prepare   # here, with the project's environment: the
#                                          # pure-Python packages into .gpu_site/, kornia's
#                                          # wheels into .whl/ (carry both)
#   bash benchmarks/gpu_suite.sh           # on the GPU machine, in the repository root
#   SMOKE=1 bash benchmarks/gpu_suite.sh   # on a CPU at tiny sizes (tests/test_gpu_suite.py)
#
# Output: the table on stdout (the last lines, after one line per row as it finishes) and in
# "$OUT"/gpu_suite.txt (OUT defaults to /tmp/gpu_suite), the whole output with the engine's
# log in "$OUT"/gpu_suite.log, the machine's set-up in "$OUT"/setup.txt. WORKERS (8)
# data-loading processes per side; ITERS (12) iterations per row, the first 4 not timed.
set -u
cd "$(dirname "$0")/.."
if [ "${1:-}" = "prepare" ]; then  # the same packages as the ViT benchmark's, and kornia
    bash benchmarks/gpu_vit_speed.sh prepare || exit
    # kornia (the device-augmentation rows) has a compiled part, kornia_rs: its wheels for the
    # GPU machine's Python (GPU_PYTHON, 3.12 by default) go to .whl/ (carry it too)
    PY=${PYTHON:-python3}
    rm -rf .whl && mkdir -p .whl
    exec "$PY" -m pip download -q --no-deps --only-binary=:all: \
        --python-version "${GPU_PYTHON:-3.12}" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl \
        "kornia==$("$PY" -c 'import kornia; print(kornia.__version__)')" \
        "kornia-rs==$("$PY" -c 'import importlib.metadata as m; print(m.version("kornia_rs"))')"
fi

OUT=${OUT:-/tmp/gpu_suite}
BUDGET=${BUDGET:-420}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
if [ -d .gpu_site ]; then  # taken along from `prepare`: first on the path, the machine's torch
    export PYTHONPATH="$PWD/.gpu_site:$PWD"
else
    export PYTHONPATH="$PWD"
fi

if [ -n "${SMOKE:-}" ]; then
    exec $PY benchmarks/gpu_suite.py --device cpu --tiny --iters 3 --warmup 1 --batch 2 \
        --workers 0 --budget "$BUDGET" --out "$OUT/gpu_suite.txt"
fi

if ls .whl/*.whl > /dev/null 2>&1 && [ -d .gpu_site ]; then  # kornia's, from `prepare`
    $PY -m pip install -q --no-index --no-deps --no-compile --target .gpu_site .whl/*.whl
fi
{
    nvidia-smi -L
    $PY -c "import torch, timm; print('torch', torch.__version__, 'timm', timm.__version__, \
'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0))"
} > "$OUT/setup.txt" 2>&1
cat "$OUT/setup.txt"
$PY benchmarks/gpu_suite.py --device gpu --iters "${ITERS:-12}" --warmup 4 \
    --workers "${WORKERS:-8}" --budget "$BUDGET" --out "$OUT/gpu_suite.txt" \
    > "$OUT/gpu_suite.log" 2>&1
status=$?
grep -v "^INFO\|^WARNING\|^DEBUG" "$OUT/gpu_suite.log" | tail -n 60
exit "$status"
