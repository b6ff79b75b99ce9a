"""The baselines produce the reference's tokens too (so benchmarks compare like with like),
and the naive one really re-sends the context while this runtime sends suffixes."""

import pytest

from tests.helpers import tiny
from tokenrouter.runtime.baselines.lockstep import Lockstep
from tokenrouter.runtime.baselines.naive import naive_options
from tokenrouter.runtime.engine.sampler import SamplingParams
from tokenrouter.runtime.launcher import LaunchOptions
from tokenrouter.runtime.offline import LLM
from tokenrouter.runtime.reference import Reference

PROMPTS = [[7 + i, 30 + 5 * i, 90, 120 + i, 8] * (1 + i % 3) for i in range(10)] + [[7, 30, 90, 120, 8]]
MAX = 16


@pytest.fixture(scope="module")
def program(pair):
    return tiny.rstitch(pair, 0.25)


@pytest.fixture(scope="module")
def expected(program):
    ref = Reference(program)
    return [ref.generate(p, SamplingParams(max_tokens=MAX, stop_token_ids=(tiny.EOS,))) for p in PROMPTS]


def test_lockstep_matches_reference_and_frees_kv(program, expected):
    ls = Lockstep(program, num_blocks=64)
    outs = ls.generate(PROMPTS, SamplingParams(max_tokens=MAX), stop_token_ids=(tiny.EOS,), concurrency=4)
    for o, r in zip(outs, expected):
        assert o.token_ids == r.tokens and o.tokens_by_model == r.written_by and o.finish_reason == r.reason
    assert ls.blocks_used() == {"slm": 0, "llm": 0}


def test_naive_deployment_matches_reference_and_resends_context(program, expected):
    sp = SamplingParams(max_tokens=MAX)
    with LLM(program, launch=naive_options(program, LaunchOptions(mode="thread", num_blocks=96))) as naive:
        outs = naive.generate(PROMPTS, sp, use_tqdm=False)
        naive_in = {w: s["suffix_tokens_in"] for w, s in naive.stats().items()}
    with LLM(program, launch=LaunchOptions(mode="thread", num_blocks=96)) as ours:
        mine = ours.generate(PROMPTS, sp, use_tqdm=False)
        ours_in = {w: s["suffix_tokens_in"] for w, s in ours.stats().items()}
    for o, m, r in zip(outs, mine, expected):
        assert o.token_ids == r.tokens == m.token_ids
        assert o.tokens_by_model == r.written_by
    # suffixes: each token crosses to a model at most once, so at most prompt + output per
    # request; the naive dispatcher sends the whole context on every handoff
    bound = sum(len(p) + len(r.tokens) for p, r in zip(PROMPTS, expected))
    assert sum(ours_in.values()) <= 2 * bound
    assert sum(naive_in.values()) > 2 * sum(ours_in.values())
