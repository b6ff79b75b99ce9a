"""`n` > 1 computes the prompt once: choice j > 0 forks choice 0's prompt KV at the start
writer (`subserver/forks.py`). Served as a user serves it (`tokenrouter serve` on the
embedded SmolLM2 demo, a subprocess; the official `openai` client): the start writer's
`tokenrouter_prefill_tokens_computed_total` grows by P for n = 1 and by P + 3 for n = 4
(each fork computes the prompt's last token itself); greedy choices are the single-request
reference's; sampled choices differ, repeat under a seed, and each equals the unforked
single request with its choice's seed; an aborted n = 4 stream gives back every block."""

from __future__ import annotations

import os
import time

import httpx
import pytest

from tests.helpers import REPO
from tests.helpers.ports import free_port
from tests.helpers.serving import CLI, metrics, stop, wait_until_healthy
from tokenrouter.compiler.pipeline import load_program
from tokenrouter.protocol.sampling import SamplingParams
from tokenrouter.runtime.http.choices import choice_seed
from tokenrouter.runtime.loader import model_facts, program_tokenizer
from tokenrouter.runtime.reference import Reference

pytestmark = [pytest.mark.slow, pytest.mark.real_weights]

ROOT = str(REPO)
DEMO = os.path.join(ROOT, "examples", "demo.route")
PROMPT = "Write one sentence about the sea and the sky, then another about mountains."


@pytest.fixture(scope="module")
def served():
    import subprocess
    port = free_port()
    proc = subprocess.Popen([*CLI, "serve", DEMO, "--port", str(port), "--max-restarts", "0"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(proc, url, timeout_s=600, poll_s=0.5)
        import openai
        yield url, openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=600)
    finally:
        stop(proc, 30)


def computed(url: str) -> dict[str, float]:
    """Prompt tokens each writer has computed so far."""
    return {dict(labels)["model"]: v for (name, labels), v in metrics(url).items()
            if name == "tokenrouter_prefill_tokens_computed_total"}


def blocks_used(url: str, timeout: float = 30.0) -> dict[str, float]:
    """KV blocks in use per writer, polled until all are back (releases are asynchronous)."""
    deadline = time.monotonic() + timeout
    while True:
        used = {dict(labels)["model"]: v for (name, labels), v in metrics(url).items()
                if name == "tokenrouter_kv_blocks_used"}
        if not any(used.values()) or time.monotonic() > deadline:
            return used
        time.sleep(0.2)


def tokens(choice) -> list[int]:
    return choice.model_extra["token_ids"]


def test_n4_computes_the_prompt_once_at_the_start_writer(served):
    url, client = served
    before = computed(url)
    one = client.completions.create(model="demo", prompt=PROMPT, max_tokens=6, temperature=0)
    p = one.usage.prompt_tokens
    mid = computed(url)
    assert mid["slm"] - before["slm"] == p
    four = client.completions.create(model="demo", prompt=PROMPT, max_tokens=6, temperature=1.0, seed=3, n=4)
    assert len(four.choices) == 4
    after = computed(url)
    assert after["slm"] - mid["slm"] == p + 3  # once, plus each fork's last prompt token
    assert blocks_used(url) == {"slm": 0, "llm": 0}


def test_greedy_choices_are_identical_and_the_reference(served):
    url, client = served
    got = client.completions.create(model="demo", prompt=PROMPT, max_tokens=24, temperature=0, n=4)
    program = load_program(DEMO, model_facts=model_facts)
    tk = program_tokenizer(program)
    want = Reference(program).generate(tk.encode(PROMPT), SamplingParams(max_tokens=24,
                                                                         stop_token_ids=tk.eos_token_ids))
    assert [tokens(c) for c in got.choices] == [want.tokens] * 4
    assert got.model_extra["tokens_by_model"] == {w: 4 * n for w, n in want.written_by.items()}


def test_sampled_choices_differ_repeat_under_a_seed_and_equal_unforked_requests(served):
    url, client = served
    kw = dict(model="demo", prompt=PROMPT, max_tokens=16, temperature=1.0, top_p=1.0)
    first = client.completions.create(seed=11, n=4, **kw)
    again = client.completions.create(seed=11, n=4, **kw)
    outs = [tokens(c) for c in first.choices]
    assert len({tuple(t) for t in outs}) == 4  # choice i differs from choice j
    assert [tokens(c) for c in again.choices] == outs
    for j, want in enumerate(outs):  # a fork changes nothing: choice j is the n = 1 request with its seed
        single = client.completions.create(seed=choice_seed(11, j), n=1, **kw)
        assert tokens(single.choices[0]) == want


def test_an_aborted_n4_stream_gives_back_every_block(served):
    url, _ = served
    # as long as the context allows (the demo writes hundreds of tokens a second): still running when it goes
    body = {"model": "demo", "prompt": PROMPT, "max_tokens": 1500, "temperature": 1.0, "n": 4, "stream": True,
            "ignore_eos": True}
    aborted = metrics(url).get(("tokenrouter_requests_total", (("reason", "abort"),)), 0)
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        chunks = 0
        for line in r.iter_lines():
            chunks += line.startswith("data: {")
            if chunks >= 12:
                break
    assert blocks_used(url) == {"slm": 0, "llm": 0}
    # the four were aborted mid-way (1500 tokens each take minutes here), not finished
    assert metrics(url)[("tokenrouter_requests_total", (("reason", "abort"),))] == aborted + 4
