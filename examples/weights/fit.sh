#!/usr/bin/env bash
# Refit the routers that ship with r2r.route, citer.route and co_llm.route (the embedded demo
# pair). Each run prints its held-out figures and writes NAME.safetensors, NAME.report.json and
# NAME.report.png here. --cache lets the three fits share the labelled pass (261 training
# prompts x 32 tokens) and the baselines' generations (64 held-out prompts x 32 tokens).
set -euo pipefail
cd "$(dirname "$0")/../.."
TR=${TR:-.venv/bin/tokenrouter}
COMMON=(--prompts data/prompts/train.jsonl --eval-prompts data/prompts/heldout.jsonl --max-tokens 32
        --epochs 30 --target-share 0.3 --seed 0 --cache)
$TR fit examples/r2r.route --router r2r --out examples/weights/r2r_router.safetensors "${COMMON[@]}" "$@"
$TR fit examples/citer.route --router citer --out examples/weights/citer_router.safetensors "${COMMON[@]}" "$@"
$TR fit examples/co_llm.route --router defer --out examples/weights/co_llm_defer_head.safetensors "${COMMON[@]}" "$@"
