#!/usr/bin/env bash
# The main job: serve examples/demo.route on the embedded default pair, ask it one
# question through the official OpenAI client (greedy), show the answer with each token
# coloured by the model that wrote it (on a terminal; [model:text] otherwise), the large
# model's own greedy answer beside it, and the handoff counters from /metrics; then stop.
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
import subprocess, sys, urllib.request
from openai import OpenAI
from tokenrouter.compiler.pipeline import load_program
from tokenrouter.eval.analysis import token_pieces
from tokenrouter.eval.configs import small_and_large
from tokenrouter.eval.show import coloured, legend
from tokenrouter.runtime.loader import model_facts
from tokenrouter.runtime.offline import tokenizer_for
port, question = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
reply = client.chat.completions.create(model="demo", max_tokens=64, temperature=0,
                                       messages=[{"role": "user", "content": question}])
choice = reply.choices[0].model_extra
program = load_program("examples/demo.route", model_facts=model_facts)
small, large = small_and_large(program)
tty = sys.stdout.isatty()
pieces = token_pieces(tokenizer_for(program), choice["token_ids"])
print(f"\nQ: {question}\n\nrouted ({legend([small, large], tty)}):\n{coloured(pieces, choice['token_writers'], [small, large], tty)}\n")
print("tokens written by each model:", reply.model_extra.get("tokens_by_model"))
model = program.model(large)
alone = subprocess.run([sys.executable, "-m", "tokenrouter.cli", "generate", "--chat", question, "-m", model.path,
                        "--max-tokens", "64", "--dtype", model.dtype, "--quant", model.quant],
                       capture_output=True, text=True)
print(f"\nthe large model alone ({large}, greedy):\n{alone.stdout.strip() or alone.stderr.strip()}\n")
metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
print("".join(line + "\n" for line in metrics.splitlines()
              if line.startswith(("tokenrouter_handoffs_out_total", "tokenrouter_tokens_written_total"))))
PY
