#!/usr/bin/env bash
# The main job: serve examples/demo.route on the embedded pair, ask it one question through
# the official OpenAI client (greedy), show the answer with each stretch of tokens marked by
# the model that wrote it (colours on a terminal, [model:text] otherwise), the tokens each
# model wrote, the handoffs, and the large model's own greedy answer; then stop the server.
#   usage: scripts/demo.sh ["your question"]   (PORT=8000 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  echo "no .venv here: run ./scripts/setup.sh first" >&2
  exit 1
fi
exec .venv/bin/python -u scripts/demo.py "$@"
