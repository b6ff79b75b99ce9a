"""The shipped routers, served as a user would: `tokenrouter serve examples/{r2r,citer,co_llm}.route`
answers an OpenAI client with both models writing tokens, and `check` finds the files fit
their declarations and the embedded models."""

import os
import signal
import socket
import subprocess
import sys

import pytest

from tests.helpers import REPO
from tests.helpers.serving import wait_until_healthy
from tokenrouter.compiler.pipeline import check_file
from tokenrouter.runtime.loader import model_facts

pytestmark = pytest.mark.slow  # every test here takes seconds: the fast tier (-m "not slow") skips them

ROOT = str(REPO)


@pytest.mark.real_weights
@pytest.mark.parametrize("example", ["r2r", "citer", "co_llm"])
def test_shipped_router_serves_an_openai_client_with_both_models_writing(example):
    serve_and_ask(f"examples/{example}.route", example, ("What is the capital of France?",
                                                         "Write a short poem about the sea."))


@pytest.mark.real_pair
@pytest.mark.parametrize("example", ["r2r", "citer", "co_llm"])
def test_the_coder_pairs_fitted_routers_serve_with_both_models_writing(example):
    """examples/coder/: the routers fitted for the Qwen2.5-Coder pair."""
    serve_and_ask(f"examples/coder/{example}.route", example,
                  ("Write a Python function is_prime(n) that returns whether n is a prime number.",
                   "Write a Python function that returns the n-th Fibonacci number, with a docstring."),
                  max_tokens=128)


def serve_and_ask(route: str, name: str, questions: tuple[str, ...], max_tokens: int = 48) -> None:
    """`check` finds the file's weights fit; `tokenrouter serve` answers each question through
    the openai client, and over the questions both models wrote tokens."""
    _, diags = check_file(os.path.join(ROOT, route), full=True, model_facts=model_facts)
    assert diags == [], [d.message for d in diags]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "tokenrouter.cli", "serve", route,
                             "--port", str(port)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(proc, url, timeout_s=600, poll_s=0.5)
        import openai
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
        written: dict[str, int] = {}
        for question in questions:
            chat = client.chat.completions.create(
                model=name, messages=[{"role": "user", "content": question}], max_tokens=max_tokens, temperature=0)
            assert chat.choices[0].message.content.strip()
            by_model = chat.model_extra["tokens_by_model"]
            assert sum(by_model.values()) == chat.usage.completion_tokens
            for m, n in by_model.items():
                written[m] = written.get(m, 0) + n
        assert written.get("slm", 0) > 0 and written.get("llm", 0) > 0, written
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
