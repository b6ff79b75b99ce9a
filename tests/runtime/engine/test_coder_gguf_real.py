"""Qwen's official Q4_K_M files of Qwen2.5-Coder-0.5B/1.5B-Instruct run as they are
(`quant = native`) against llama.cpp (the `xllamacpp` wheel's server) on the same file.

Per prompt (chat-templated coding questions), llama.cpp writes STEPS greedy tokens and gives
the log-probabilities of its TOP best candidates at each; our engine reads the same tokens
(teacher-forced, decode steps, the integer kernels: int4avx2 / int8avx2, the int4 head with
its 16 best rescored from the file's rows) and we compare:
- greedy agreement: how often our best token is llama.cpp's;
- the log-probabilities of llama.cpp's candidates where both rank it among their best, and of
  llama.cpp's own greedy token: |ours - theirs| at each position.
Both engines quantise their activations (llama.cpp to 8 bits per block of 32, ours to ~15
bits), so neither is the exact product and they differ by their roundings; the bounds below
sit above what the files measured (printed with -s) so that noise passes and a wrong block
layout or kernel (which moves log-probabilities by whole nats) does not.

The files: $TOKENROUTER_CODER_SMALL and $TOKENROUTER_CODER_LARGE, else the pulled files'
default locations; skipped with the reason where they are absent."""

from __future__ import annotations

import os

import pytest

from tokenrouter.bench.agreement import CODING_QUESTIONS, compare, llamacpp_top_logprobs, teacher_forced_logprobs
from tokenrouter.runtime.engine.engine import Engine
from tokenrouter.runtime.loader import load_model

pytestmark = pytest.mark.real_weights

FILES = {"small": ("TOKENROUTER_CODER_SMALL", "/work/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
         "large": ("TOKENROUTER_CODER_LARGE", "/work/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")}
STEPS, TOP = 32, 8
# Measured on this project's 2-core Xeon (AVX-512 VNNI build of our kernels, the xllamacpp
# wheel's AVX2 llama.cpp), 4 prompts x 32 positions, printed with -s:
#   0.5B: greedy agreement 124/128; |dlogprob| of llama.cpp's top-8 max 0.342, mean 0.056
#         (1,008 pairs); of its greedy token max 0.099, mean 0.0087
#   1.5B: 128/128; top-8 max 0.376, mean 0.061 (1,007); greedy token max 0.124, mean 0.0101
# The floors sit under those with room for another host's rounding; a wrong block layout or
# scale moves whole nats and agrees on few tokens.
AGREEMENT = 0.9
MAX_GREEDY_GAP = 0.3  # llama.cpp's own token's log-probability
MAX_GAP = 0.75  # any of its top-8 that we rank in our top-8 too


def _file(which: str) -> str:
    env, default = FILES[which]
    path = os.environ.get(env) or default
    if not os.path.isfile(path):
        pytest.skip(f"Qwen2.5-Coder {which} GGUF not found: set ${env} or pull it (tokenrouter models pull)")
    return path


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("which", ["small", "large"])
def test_logits_and_greedy_tokens_agree_with_llamacpp_on_the_same_file(which):
    path = _file(which)
    m = load_model(path, quant="native")
    tok = m.tokenizer
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True))
               for q in CODING_QUESTIONS]
    pytest.importorskip("xllamacpp")
    theirs = llamacpp_top_logprobs(path, prompts, STEPS, TOP)
    eng = Engine(m.config, m.weights, m.engine_options(kernel_plan="int4avx2", max_model_len=512, num_blocks=96))
    r = compare(theirs, teacher_forced_logprobs(eng, prompts, [t for t, _ in theirs]))
    print(f"\n{which}: {r}")
    assert r["greedy_agree"] >= AGREEMENT * r["positions"], r
    assert r["greedy_logprob_gap_max"] <= MAX_GREEDY_GAP and r["top_logprob_gap_max"] <= MAX_GAP, r
