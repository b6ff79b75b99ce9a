"""The baselines produce the reference's tokens too (so benchmarks compare like with like),
and the naive one really re-sends the context while this runtime sends suffixes."""

import pytest

from tests.helpers import tiny
from tokenrouter.runtime.baselines.lockstep import Lockstep
from tokenrouter.runtime.baselines.naive import naive_options
from tokenrouter.runtime.engine.sampler import SamplingParams
from tokenrouter.runtime.launch import LaunchOptions
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


def test_lockstep_ends_at_the_context_limit_like_the_reference(pair):
    """A request whose tokens fill the context ends there ("length"), as at a subserver
    and in the reference, instead of being fed to an engine that has no room for it."""
    program = tiny.coin(pair, 0.5)
    ctx = 40
    prompts = [[7, 30, 90, 120, 8] * 6, [9, 11, 13] * 4]  # 30 and 12 tokens
    ref = Reference(program, max_model_len=ctx)
    want = [ref.generate(p, SamplingParams(max_tokens=100), route_seed=i) for i, p in enumerate(prompts)]
    ls = Lockstep(program, num_blocks=32, max_model_len=ctx)
    outs = ls.generate(prompts, SamplingParams(max_tokens=100), concurrency=2)
    for p, o, r in zip(prompts, outs, want):
        assert o.finish_reason == r.reason == "length"
        assert len(p) + len(o.token_ids) == ctx
        assert o.token_ids == r.tokens and o.tokens_by_model == r.written_by
    assert ls.blocks_used() == {"slm": 0, "llm": 0}


def test_lockstep_fails_a_rewrite_loop_like_the_reference(pair):
    """Two writers that always rewrite each other's token never make progress: the request
    ends with an error (as in the reference and the subservers), not an endless loop."""
    import dataclasses

    from tokenrouter.compiler import ir
    always = ir.Bernoulli(1.0, 3)
    program = dataclasses.replace(tiny.coin(pair, 1.0), bounds=(), transitions=(
        ir.Transition("slm", "llm", always, "rewrite"), ir.Transition("llm", "slm", always, "rewrite")))
    prompts = [[7, 30, 90, 120, 8], [5, 6, 7]]
    ref = Reference(program).generate(prompts[0], SamplingParams(max_tokens=8))
    assert ref.reason == "error" and "rewrite loop" in ref.error
    ls = Lockstep(program, num_blocks=32)
    outs = ls.generate(prompts, SamplingParams(max_tokens=8), concurrency=2)
    for o in outs:
        assert o.finish_reason == "error" and o.token_ids == [] and "loop" in o.error
    assert ls.iterations == 3  # slm rewrites, llm rewrites, slm finds nothing new to read
    assert ls.blocks_used() == {"slm": 0, "llm": 0}
