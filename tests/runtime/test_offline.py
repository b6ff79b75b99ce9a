"""The offline API (`LLM.generate`), on subserver threads."""

import pytest

from tests.helpers import tiny
from tests.helpers.ports import free_port
from tokenrouter.runtime.engine.sampler import SamplingParams
from tokenrouter.runtime.launch import LaunchOptions
from tokenrouter.runtime.offline import LLM
from tokenrouter.runtime.reference import Reference


def test_generate_text_prompts_in_order_with_a_progress_bar(pair, capsys):
    program = tiny.coin(pair, 0.3)
    prompts = [f"offline {i} " + "z" * i for i in range(12)]
    with LLM(program, launch=LaunchOptions(mode="thread", num_blocks=64)) as llm:
        outs = llm.generate(prompts, SamplingParams(max_tokens=10), concurrency=3)
        ref = Reference(program)
        for i, (p, o) in enumerate(zip(prompts, outs)):  # prompt i's route seed is i
            r = ref.generate(llm.tokenizer.encode(p), SamplingParams(max_tokens=10, stop_token_ids=(tiny.EOS,)),
                             route_seed=i)
            assert o.prompt == p and o.token_ids == r.tokens and o.tokens_by_model == r.written_by
            assert o.text == llm.tokenizer.decode([t for t in r.tokens if t != tiny.EOS], skip_special_tokens=True)
        assert "12/12" in capsys.readouterr().err  # tqdm
        # a request that cannot fit is an error for that prompt only
        big = llm.generate([[5] * 20], SamplingParams(max_tokens=5000), use_tqdm=False)
        assert big[0].finish_reason == "error" and "KV blocks" in big[0].error
        import time
        time.sleep(0.2)
        assert all(s["blocks_used"] == 0 for s in llm.stats().values())


def test_unseeded_prompts_of_one_call_flip_independent_route_coins(pair):
    """The same prompt eight times in one call: by default prompt i's route seed is i, so
    a coin-flip rule hands each copy off at its own positions (one shared seed would make
    all eight identical); the same call again gives the same routes."""
    program = tiny.coin(pair, 0.5)
    with LLM(program, launch=LaunchOptions(mode="thread", num_blocks=64)) as llm:
        runs = [llm.generate(["same prompt"] * 8, SamplingParams(max_tokens=12), use_tqdm=False) for _ in range(2)]
    writers = [tuple(o.token_writers) for o in runs[0]]
    assert len(set(writers)) > 1, writers
    assert writers == [tuple(o.token_writers) for o in runs[1]]


def test_a_subserver_that_cannot_start_is_a_clear_error(pair, tmp_path):
    from tokenrouter.runtime.frontend.frontend import RuntimeUnavailable
    program = tiny.coin({"slm": pair["slm"], "llm": str(tmp_path / "missing")}, 0.3)
    with pytest.raises(RuntimeUnavailable, match="llm failed to start"):
        LLM(program, launch=LaunchOptions(mode="thread", num_blocks=64))


def test_tcp_endpoints_with_a_separately_started_subserver(pair, tmp_path):
    """The multi-host layout on one host: explicit tcp addresses, the large model's
    subserver started on its own (as `serve --subserver` does), the rest marked remote;
    the deployment's keys on both sides (plain tcp is refused)."""
    import threading

    import zmq

    from tokenrouter.runtime.launch import plan
    from tokenrouter.runtime.subserver.subserver import Subserver
    from tokenrouter.runtime.transport.security import SecurityError, generate_keys, stop_authenticator

    program = tiny.coin(pair, 0.4)
    addrs = {n: f"tcp://127.0.0.1:{free_port()}" for n in ("frontend", "slm", "llm")}
    with pytest.raises(SecurityError, match="started elsewhere"):
        LLM(program, launch=LaunchOptions(mode="thread", addresses=addrs, remote=("llm",), num_blocks=64))
    generate_keys(str(tmp_path / "keys"))
    opts = LaunchOptions(mode="thread", addresses=addrs, remote=("llm",), num_blocks=64,
                         curve_keys=str(tmp_path / "keys"))
    ctx = zmq.Context()
    remote = Subserver(plan(program, opts)["llm"], ctx=ctx)
    t = threading.Thread(target=remote.serve, daemon=True)
    t.start()
    try:
        with LLM(program, launch=opts) as llm:
            assert llm.launcher.local == ["slm"]
            outs = llm.generate(["over tcp"] * 3, SamplingParams(max_tokens=12), use_tqdm=False)
            ref = Reference(program)
            sp = SamplingParams(max_tokens=12, stop_token_ids=(tiny.EOS,))
            assert all(o.token_ids == ref.generate(o.prompt_token_ids, sp, route_seed=i).tokens
                       for i, o in enumerate(outs))
            assert "llm" in outs[0].tokens_by_model
    finally:
        t.join(10)  # the LLM's close sent shutdown to every subserver, the remote one too
        stop_authenticator(ctx)
        ctx.term()
    assert not t.is_alive()
