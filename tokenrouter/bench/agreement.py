"""Our engine against llama.cpp on the same GGUF file, position by position.

llama.cpp (`llamacpp.LlamaCppServer`) writes each prompt's greedy tokens and gives, at each
position, the log-probabilities of its best candidates (`/completion` with `n_probs`: the
softmax of its raw logits); an engine of ours reads the same tokens (teacher forcing: a
prefill, then one decode step per token, as serving runs them) and `compare` measures how
often the two pick the same token and how far their log-probabilities of llama.cpp's
candidates lie apart. `benchmarks/gguf_accuracy.py` and the real-weights test of Qwen's files
use it.
"""

from __future__ import annotations

import statistics
from typing import Any

import torch

from tokenrouter.bench.llamacpp import LlamaCppServer
from tokenrouter.extras import require

# chat questions whose answers are code: the comparison's default prompts
CODING_QUESTIONS = ("Write a python function is_prime(n).", "Reverse a linked list in C.",
                    "What does `git rebase -i` do?", "Write a SQL query for the ten largest orders.")


def llamacpp_top_logprobs(gguf: str, prompts: list[list[int]], steps: int, top: int, threads: int = 2,
                          timeout: float = 900.0) -> list[tuple[list[int], list[dict[int, float]]]]:
    """Per prompt (token ids): llama.cpp's `steps` greedy tokens and, at each, {token:
    log-probability} of its `top` best, from one server with one slot."""
    httpx = require("bench", "httpx", "the llama.cpp comparison")
    srv = LlamaCppServer(gguf, parallel=1, threads=threads, ctx_per_slot=max(len(p) for p in prompts) + steps + 16,
                         timeout=timeout)
    out = []
    try:
        with httpx.Client(base_url=srv.url, timeout=timeout) as c:
            for ids in prompts:
                body = {"prompt": ids, "n_predict": steps, "temperature": 0.0, "return_tokens": True, "n_probs": top,
                        "cache_prompt": False, "ignore_eos": True}
                r = c.post("/completion", json=body)
                r.raise_for_status()
                r = r.json()
                tops = [{t["id"]: t["logprob"] for t in p["top_logprobs"]} for p in r["completion_probabilities"]]
                out.append((r["tokens"], tops))
    finally:
        srv.close()
    return out


def teacher_forced_logprobs(engine, prompts: list[list[int]], forced: list[list[int]]) -> list[Any]:
    """Per prompt: the engine's log-probabilities [len(forced), V] (float64) at each position
    of `forced` (a prefill of the prompt, then a decode step per forced token)."""
    out = []
    for i, (p, toks) in enumerate(zip(prompts, forced)):
        rows = [engine.step([(i, p)]).logits[0]]
        for t in toks[:-1]:
            rows.append(engine.step([(i, [t])]).logits[0])
        engine.free(i)
        out.append(torch.log_softmax(torch.stack(rows).double(), -1))
    return out


def compare(theirs: list[tuple[list[int], list[dict[int, float]]]], ours: list[Any]) -> dict:
    """How `ours` (`teacher_forced_logprobs` on llama.cpp's tokens) agrees with llama.cpp:
    positions where our best token is theirs; |log-probability difference| of their token, and
    of each of their top candidates that we rank as high too."""
    agree = total = 0
    gaps, greedy = [], []
    for (toks, tops), lp in zip(theirs, ours):
        for pos, (t, top) in enumerate(zip(toks, tops)):
            agree += int(lp[pos].argmax()) == t
            total += 1
            greedy.append(abs(float(lp[pos, t]) - top[t]))
            ours_top = set(lp[pos].topk(len(top)).indices.tolist())
            gaps += [abs(float(lp[pos, j]) - v) for j, v in top.items() if j in ours_top]
    return {"positions": total, "greedy_agree": agree, "greedy_logprob_gap_max": max(greedy),
            "greedy_logprob_gap_mean": statistics.fmean(greedy), "top_logprob_gap_max": max(gaps),
            "top_logprob_gap_mean": statistics.fmean(gaps), "top_pairs": len(gaps)}


def against_reference(theirs: list[tuple[list[int], list[dict[int, float]]]], ours: list[Any],
                      reference: list[Any]) -> dict:
    """Ours and llama.cpp's, each against a reference engine's log-probabilities on the same
    positions (the float32 engine on the file's exact values): how often each picks the
    reference's best token, and |log-probability difference| over llama.cpp's top candidates."""
    out: dict = {"positions": 0, "ours_argmax": 0, "llamacpp_argmax": 0}
    ours_gaps, their_gaps = [], []
    for (toks, tops), lp, ref in zip(theirs, ours, reference):
        for pos, top in enumerate(tops):
            best = int(ref[pos].argmax())
            out["positions"] += 1
            out["ours_argmax"] += int(lp[pos].argmax()) == best
            out["llamacpp_argmax"] += toks[pos] == best
            for j, v in top.items():
                ours_gaps.append(abs(float(lp[pos, j] - ref[pos, j])))
                their_gaps.append(abs(v - float(ref[pos, j])))
    out.update(ours_gap_max=max(ours_gaps), ours_gap_mean=statistics.fmean(ours_gaps),
               llamacpp_gap_max=max(their_gaps), llamacpp_gap_mean=statistics.fmean(their_gaps),
               pairs=len(ours_gaps))
    return out
