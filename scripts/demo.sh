#!/usr/bin/env bash
# The main job: serve examples/demo.route on the embedded default pair, ask it one
# question through the official OpenAI client, show who wrote which tokens and the
# handoff counters from /metrics, then stop the server.
#   usage: scripts/demo.sh ["your question"]   (PORT=8000 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${PORT:-8000}
QUESTION=${1:-"What is the capital of France? Answer in one sentence."}
LOG=$(mktemp -t tokenrouter-demo.XXXXXX.log)
.venv/bin/tokenrouter serve examples/demo.route --port "$PORT" >"$LOG" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
echo "starting: tokenrouter serve examples/demo.route --port $PORT (log: $LOG; the first run converts the weights)"
for _ in $(seq 1 600); do
  if .venv/bin/python -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)" \
       "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then break; fi
  if ! kill -0 $SERVER 2>/dev/null; then echo "the server exited:"; cat "$LOG"; exit 1; fi
  sleep 0.5
done
.venv/bin/python - "$PORT" "$QUESTION" <<'PY'
import sys, urllib.request
from openai import OpenAI
port, question = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
reply = client.chat.completions.create(model="demo", max_tokens=64,
                                       messages=[{"role": "user", "content": question}])
print(f"\nQ: {question}\nA: {reply.choices[0].message.content}\n")
print("tokens written by each model:", reply.model_extra.get("tokens_by_model"))
metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
print("".join(line + "\n" for line in metrics.splitlines()
              if line.startswith(("tokenrouter_handoffs_out_total", "tokenrouter_tokens_written_total"))))
PY
