#!/usr/bin/env bash
# Refit the routers that ship with r2r.route, citer.route and co_llm.route (the Qwen2.5-Coder
# pair, pulled with `tokenrouter models pull --all`). Each run prints its held-out figures and
# writes NAME.safetensors, NAME.report.json and NAME.report.png here. --cache lets the three
# fits share the labelled pass (the small model's greedy answers to data/prompts/code_train.jsonl,
# every position labelled by the large model) and the baselines' generations.
set -euo pipefail
cd "$(dirname "$0")/../../.."
TR=${TR:-.venv/bin/tokenrouter}
COMMON=(--prompts data/prompts/code_train.jsonl --eval-prompts data/prompts/code_heldout.jsonl --max-tokens 128
        --eval-max-prompts 24 --epochs 30 --target-share 0.1 --seed 0 --cache)
$TR fit examples/coder/r2r.route --router r2r --out examples/coder/weights/r2r_router.safetensors "${COMMON[@]}" "$@"
$TR fit examples/coder/citer.route --router citer --out examples/coder/weights/citer_router.safetensors "${COMMON[@]}" "$@"
$TR fit examples/coder/co_llm.route --router defer --out examples/coder/weights/co_llm_defer_head.safetensors "${COMMON[@]}" "$@"
