"""The embedded demo pair, served as a user would: `tokenrouter serve examples/demo.route`."""

import re
import signal
import socket
import subprocess
import sys

import httpx
import pytest

from tests.helpers import REPO
from tests.helpers.serving import wait_until_healthy

pytestmark = pytest.mark.slow  # every test here takes seconds: the fast tier (-m "not slow") skips them


@pytest.mark.real_weights
def test_demo_serves_an_openai_client_and_hands_off_both_ways():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "tokenrouter.cli", "serve", "examples/demo.route",
                             "--port", str(port)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(proc, url, timeout_s=600, poll_s=0.5)
        import openai
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
        for question in ("What is the capital of France?", "Write a short poem about the sea.",
                         "Explain how a bicycle works."):
            chat = client.chat.completions.create(
                model="demo", messages=[{"role": "user", "content": question}], max_tokens=48, temperature=0)
            assert chat.choices[0].message.content.strip()
            by_model = chat.model_extra["tokens_by_model"]
            assert sum(by_model.values()) == chat.usage.completion_tokens
        metrics = httpx.get(url + "/metrics").text
        out = dict(re.findall(r'^tokenrouter_handoffs_out_total\{model="(\w+)",peer="\w+"\} (\S+)$', metrics, re.M))
        assert float(out["slm"]) > 0 and float(out["llm"]) > 0, metrics
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
