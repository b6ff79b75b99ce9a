"""Our engine against llama.cpp on the same GGUF file, and both against the file's exact values.

For each of the coding questions of `bench.agreement` (chat-templated), llama.cpp (the
`xllamacpp` wheel's server, 2 threads) writes 32 greedy tokens with the log-probabilities of
its 8 best candidates at each; `quant = native` (this host's measured kernel plan, the
default int4 head rescored from the file) reads the same tokens, and so does, with
`--float`, the float32 engine on the file dequantised (`quant = none`: the file's values
exactly, float32 activations), the reference both quantised engines approximate. Timing
plays no part: the figures do not depend on the host's load.

    python benchmarks/gguf_accuracy.py --model PATH.gguf --float   # the 0.5B: ~5 min, 2.5 GB of float cache
Writes gguf_accuracy-<file>.json into --out (default bench-results/).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from tokenrouter.bench.agreement import (CODING_QUESTIONS, against_reference, compare, llamacpp_top_logprobs,
                                         teacher_forced_logprobs)
from tokenrouter.runtime.engine.engine import Engine
from tokenrouter.runtime.host import host_info
from tokenrouter.runtime.loader import load_model
from tokenrouter.runtime.loader.resolve import gguf_source

STEPS, TOP = 32, 8


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a GGUF file, or a built-in model made from one")
    ap.add_argument("--float", action="store_true", help="also the float32 engine on the file's exact values")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench-results")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    path = gguf_source(a.model)
    if path is None:
        ap.error(f"--model {a.model}: not a GGUF file or a built-in model made from one")
    native = load_model(path, quant="native")
    tok = native.tokenizer
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True))
               for q in CODING_QUESTIONS]
    theirs = llamacpp_top_logprobs(path, prompts, STEPS, TOP, threads=a.threads)
    forced = [t for t, _ in theirs]
    eng = Engine(native.config, native.weights, native.engine_options(max_model_len=512, num_blocks=96))
    ours = teacher_forced_logprobs(eng, prompts, forced)
    res = {"host": host_info(), "command": "python benchmarks/gguf_accuracy.py --model " + os.path.basename(path)
           + (" --float" if a.float else ""), "gguf": os.path.basename(path), "threads": a.threads,
           "questions": list(CODING_QUESTIONS), "steps": STEPS, "top": TOP, "native_plans": eng.kernel_plans,
           "native_vs_llamacpp": compare(theirs, ours), "measured_at": time.strftime("%Y-%m-%d")}
    print(f"native against llama.cpp: {res['native_vs_llamacpp']}", flush=True)
    del eng, native
    if a.float:
        f = load_model(path)
        ref_eng = Engine(f.config, f.weights, f.engine_options(max_model_len=512, num_blocks=96))
        res["against_float32"] = against_reference(theirs, ours, teacher_forced_logprobs(ref_eng, prompts, forced))
        print(f"each against the float32 engine: {res['against_float32']}", flush=True)
    os.makedirs(a.out, exist_ok=True)
    out = os.path.join(a.out, f"gguf_accuracy-{os.path.splitext(res['gguf'])[0]}.json")
    with open(out, "w") as fh:
        json.dump(res, fh, indent=1)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
