#!/usr/bin/env bash
# Refit the routers that ship with r2r.route, citer.route and co_llm.route (the embedded demo
# pair). Each run prints its held-out figures and writes NAME.safetensors, NAME.report.json and
# NAME.report.png here. --cache lets the three fits share the labelled pass and the large
# model's own outputs. Sized for a shared 2-core host: 261 prompts x 32 tokens for training,
# 32 held-out prompts x 24 tokens for the generation comparison.
set -euo pipefail
cd "$(dirname "$0")/../.."
TR=${TR:-.venv/bin/tokenrouter}
COMMON=(--prompts data/prompts/train.jsonl --max-tokens 32 --seed 0 --epochs 15 --target-share 0.3 --cache
        --eval-prompts data/prompts/heldout.jsonl --eval-max-prompts 32 --eval-max-tokens 24)
$TR fit examples/r2r.route --router r2r --out examples/weights/r2r_router.safetensors "${COMMON[@]}" "$@"
$TR fit examples/citer.route --router citer --out examples/weights/citer_router.safetensors "${COMMON[@]}" "$@"
$TR fit examples/co_llm.route --router defer --out examples/weights/co_llm_defer_head.safetensors "${COMMON[@]}" "$@"
