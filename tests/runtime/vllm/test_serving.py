"""A writer served by vLLM in the runtime, on tiny models: R-Stitch with its large writer on
a real vLLM engine (CPU), served over real HTTP by real subserver processes. Greedy output
at concurrency 1, 8 and 32 and at several batch thresholds equals the single-request
reference (which runs that writer on vLLM too, a fresh request per step); vLLM computed
exactly the tokens the runtime fed it (a return computes only its suffix); every KV block
comes back; and the same program with tensor_parallel = 2 (two CPU ranks over gloo) gives
the same tokens.
"""

import asyncio

import pytest

from tests.helpers import tiny
from tests.helpers import vllm as vh
from tests.helpers.serving import ServerThread, assert_outputs_equal, complete_many
from tokenrouter.runtime.engine.sampler import SamplingParams
from tokenrouter.runtime.launch import LaunchOptions
from tokenrouter.runtime.loader import program_tokenizer
from tokenrouter.runtime.reference import Reference

pytestmark = [vh.needs_vllm, pytest.mark.slow, pytest.mark.timeout(900)]

MAX_TOKENS = 10
PROMPTS = [f"prompt {i}: " + "abcdefghij"[i % 10] * (1 + i % 5) + " the end" for i in range(32)]
TAU = 0.3  # the tiny models' normalised entropies lie around it: both hand off often


@pytest.fixture(scope="module")
def program(pair, tmp_path_factory):
    llm = vh.write_model(str(tmp_path_factory.mktemp("vllm") / "llm"), seed=5)
    return vh.on_vllm(tiny.rstitch({"slm": pair["slm"], "llm": llm}, TAU), "llm")


@pytest.fixture(scope="module")
def expected(program):
    srv_tok = program_tokenizer(program)
    ref = Reference(program, max_model_len=512)
    stop = tuple(srv_tok.eos_token_ids)
    try:
        return {p: ref.generate(srv_tok.encode(p), SamplingParams(max_tokens=MAX_TOKENS, stop_token_ids=stop))
                for p in PROMPTS}
    finally:
        ref.close()


def test_greedy_equals_reference_at_every_concurrency_and_threshold(program, expected):
    assert all(len(r.written_by) == 2 for r in list(expected.values())[:8]), "both models should write"
    srv = ServerThread(program, LaunchOptions(mode="process", num_blocks=160, max_model_len=512, threads={}),
                       name="vllm")
    try:
        body = {"max_tokens": MAX_TOKENS, "temperature": 0}
        for conc, n in ((1, 4), (8, 16), (32, 32)):
            outs = asyncio.run(complete_many(srv.url, PROMPTS[:n], conc, **body))
            assert_outputs_equal(outs, PROMPTS[:n], expected)
        for b, wait in ((4, 50.0), (32, 5.0)):
            srv.configure("llm", batch_threshold=b, max_wait_ms=wait)
            assert_outputs_equal(asyncio.run(complete_many(srv.url, PROMPTS, 32, **body)), PROMPTS, expected)
        llm = srv.stats()["llm"]
        # a return computes only its suffix: vLLM computed exactly what the subserver fed it
        # (the prompt once, then each return's suffix, then one token a step), never a prefix again
        assert sum(llm["handoffs_in"].values()) > 50
        assert llm["engine_computed_tokens"] == llm["prefill_tokens"]
        assert srv.wait_blocks_free() == {"slm": 0, "llm": 0}
    finally:
        srv.close()


def test_tensor_parallel_2_gives_the_same_tokens(program, expected):
    tp2 = vh.on_vllm(program, "llm", tensor_parallel=2)
    srv = ServerThread(tp2, LaunchOptions(mode="process", num_blocks=160, max_model_len=512, threads={}),
                       name="vllm-tp2")
    try:
        outs = asyncio.run(complete_many(srv.url, PROMPTS[:16], 8, max_tokens=MAX_TOKENS, temperature=0))
        assert_outputs_equal(outs, PROMPTS[:16], expected)
        assert srv.wait_blocks_free() == {"slm": 0, "llm": 0}
    finally:
        srv.close()


def test_long_prompts_fed_over_several_vllm_steps(program):
    """16 prompts of ~300 tokens, the large writer waiting (B = 16, up to 3 s) until many
    arrive: more than vLLM's 2,048 tokens a step, so it feeds some over several steps
    (they stay ready, giving no token until fed), and the outputs still equal the reference."""
    long = [f"long {i}: " + "abcdefghij"[i % 10] * (290 + i) for i in range(16)]
    tok = program_tokenizer(program)
    ref = Reference(program, max_model_len=512)
    try:
        expected = {p: ref.generate(tok.encode(p), SamplingParams(max_tokens=MAX_TOKENS,
                                                                  stop_token_ids=tuple(tok.eos_token_ids)))
                    for p in long}
    finally:
        ref.close()
    assert sum(len(tok.encode(p)) for p in long) > 2048
    srv = ServerThread(program, LaunchOptions(mode="process", num_blocks=600, max_model_len=512, threads={},
                                              batch={"llm": 16}, max_wait_ms={"llm": 3000.0}),
                       name="vllm-long")
    try:
        outs = asyncio.run(complete_many(srv.url, long, 16, max_tokens=MAX_TOKENS, temperature=0))
        assert_outputs_equal(outs, long, expected)
        assert srv.wait_blocks_free() == {"slm": 0, "llm": 0}
    finally:
        srv.close()
