"""Every example algorithm served over real HTTP by real subserver processes: greedy output at
concurrency 1, 8 and 32 equals the single-request reference token for token, equals itself
across batch thresholds B_i, and every KV block comes back afterwards.

Tiny random models (float64) and random router weights stand in for the examples' models.
"""

import asyncio

import pytest

from tests.helpers import tiny
from tests.helpers.serving import assert_outputs_equal, complete_many, served
from tokenrouter.runtime.engine.sampler import SamplingParams
from tokenrouter.runtime.launch import LaunchOptions
from tokenrouter.runtime.reference import Reference

pytestmark = pytest.mark.slow  # every test here takes seconds: the fast tier (-m "not slow") skips them

EXAMPLES = ["demo", "rstitch", "r2r", "citer", "co_llm", "ensemble"]
MAX_TOKENS = 10
PROMPTS = [f"prompt {i}: " + "abcdefghij"[i % 10] * (1 + i % 5) + " the end" for i in range(32)]


@pytest.fixture(scope="module")
def models(pair, tmp_path_factory):
    aux = tiny.write_model(str(tmp_path_factory.mktemp("aux") / "aux"), layers=2, hidden=32, seed=3,
                           family="qwen3")
    return {**pair, "aux": aux}


@pytest.fixture(scope="module", params=EXAMPLES)
def example(request, models, tmp_path_factory):
    program = tiny.example_program(request.param, str(tmp_path_factory.mktemp(request.param)), models)
    with served(program, LaunchOptions(mode="process", num_blocks=160, concurrency=8, threads={}),
                name=request.param) as srv:
        ref = Reference(program)
        stop = tuple(srv.tokenizer.eos_token_ids)
        expected = {}
        for p in PROMPTS:
            r = ref.generate(srv.tokenizer.encode(p), SamplingParams(max_tokens=MAX_TOKENS, stop_token_ids=stop))
            expected[p] = r
        yield srv, expected


def test_outputs_equal_reference_at_every_concurrency_and_threshold(example):
    srv, expected = example
    body = {"max_tokens": MAX_TOKENS, "temperature": 0}
    assert any(len(r.written_by) > 1 for r in expected.values()), "the program should route"
    for conc, n in ((1, 4), (8, 16), (32, 32)):
        outs = asyncio.run(complete_many(srv.url, PROMPTS[:n], conc, **body))
        assert_outputs_equal(outs, PROMPTS[:n], expected)
    start = srv.program.start
    others = [w for w in srv.fe.writers if w != start]
    for b, wait in ((4, 50.0), (1, 0.0), (32, 5.0)):
        for w in others:
            srv.configure(w, batch_threshold=b, max_wait_ms=wait)
        outs = asyncio.run(complete_many(srv.url, PROMPTS, 32, **body))
        assert_outputs_equal(outs, PROMPTS, expected)
    stats = srv.stats()
    assert sum(sum(s["handoffs_out"].values()) for s in stats.values()) > 0
    assert srv.wait_blocks_free() == {w: 0 for w in srv.fe.writers}
