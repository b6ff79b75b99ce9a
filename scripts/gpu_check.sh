#!/bin/sh
# The engine's GPU check, in one call of at most 8 minutes on a CUDA machine with torch
# preinstalled and no network: the CUDA checks (CUDA graphs for decodes and extends against
# eager, device=cuda against the CPU float64 engine, the CUDA-marked tests where pytest is
# installed) and a short benchmark of our engine against torch eager at batch 1, 8 and 32,
# all written to one JSON file (default: gpu_check.json). Uses only torch and this repository.
#
#   scripts/gpu_check.sh [OUT.json]        PYTHON=python3.11 scripts/gpu_check.sh
#
# Exit status: 0 all checks passed (or no CUDA device: the JSON says "no_cuda"), 1 a check
# failed, 124 the 8-minute bound was hit (the JSON is then missing or partial).
set -u
cd "$(dirname "$0")/.."
OUT=${1:-gpu_check.json}
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "gpu_check: $PY cannot import torch (this check needs torch preinstalled)" >&2
    exit 2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TOKENROUTER_CACHE=${TOKENROUTER_CACHE:-$(mktemp -d)}
exec timeout --signal=INT --kill-after=10 480 "$PY" scripts/gpu_check.py --out "$OUT"
