"""Tool calling on real weights, served as a user serves them (`tokenrouter serve` as a
subprocess, the official `openai` client): `tool_choice` required and named on the embedded
SmolLM2 pair, whose template knows nothing of tools (the grammar writes the call), a call
whose tokens both writers wrote read as one call, streamed; and on the Qwen2.5-Coder pair a
whole round trip the model chooses itself (`auto`): the call (which both models write as a
bare JSON object, without Qwen's markers), the tool's result, the answer (asked without
`tools`: with them offered again, both models alone only call again)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import httpx
import pytest

from tests.helpers import REPO
from tests.helpers.serving import stop, wait_until_healthy

pytestmark = pytest.mark.slow

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}},
                   "required": ["zone"], "additionalProperties": False}}}


def serve(*args):
    """`tokenrouter serve ARGS` on a free port: (the process, its URL)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "tokenrouter.cli", "serve", *args, "--port", str(port)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, f"http://127.0.0.1:{port}"


def stream_calls(client, **kw):
    calls, content, finish = {}, "", None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            content += ch.delta.content or ""
            finish = ch.finish_reason or finish
            for d in ch.delta.tool_calls or ():
                c = calls.setdefault(d.index, {"name": "", "arguments": ""})
                c["name"] += d.function.name or ""
                c["arguments"] += d.function.arguments or ""
    return list(calls.values()), content, finish


@pytest.mark.real_weights
def test_required_and_named_calls_on_the_embedded_pair_one_call_across_handoffs():
    proc, url = serve("examples/demo.route", "--set", "tau=0.1")
    try:
        wait_until_healthy(proc, url, timeout_s=600, poll_s=0.5)
        import openai
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
        ask = [{"role": "user", "content": "What is the weather like in Paris right now?"}]
        kw = dict(model="demo", messages=ask, tools=[WEATHER, TIME], max_tokens=80, temperature=0)
        got = client.chat.completions.create(tool_choice="required", parallel_tool_calls=False, **kw)
        ch = got.choices[0]
        (call,) = ch.message.tool_calls
        assert ch.finish_reason == "tool_calls" and call.function.name in ("get_weather", "get_time")
        assert set(json.loads(call.function.arguments)) == {"city" if call.function.name == "get_weather" else "zone"}
        calls, content, finish = stream_calls(client, tool_choice="required", parallel_tool_calls=False, **kw)
        assert calls == [{"name": call.function.name, "arguments": call.function.arguments}]
        assert finish == "tool_calls" and content == ""
        split = None
        for city in ("Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Quito"):
            body = {**kw, "messages": [{"role": "user", "content": f"Weather in {city}?"}],
                    "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
            r = httpx.post(url + "/v1/chat/completions", json=body, timeout=300).json()
            ch = r["choices"][0]
            (call,) = ch["message"]["tool_calls"]
            assert call["function"]["name"] == "get_weather" and ch["finish_reason"] == "tool_calls"
            assert set(json.loads(call["function"]["arguments"])) == {"city"}
            if {"slm", "llm"} <= set(ch["token_writers"][:-1]):  # both wrote the call (the last: end of sequence)
                split = ch
                break
        assert split is not None, "no named call written by both writers"
    finally:
        stop(proc, 60)


@pytest.mark.real_pair
def test_a_whole_tool_round_trip_on_the_coder_pair():
    proc, url = serve("examples/coder/entropy.route")
    try:
        wait_until_healthy(proc, url, timeout_s=900, poll_s=1.0)
        import openai
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
        messages = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
        got = client.chat.completions.create(model="entropy", messages=messages, tools=[WEATHER, TIME],
                                             max_tokens=96, temperature=0)
        ch = got.choices[0]
        assert ch.finish_reason == "tool_calls", ch.message.content
        (call,) = ch.message.tool_calls
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
        streamed, _, finish = stream_calls(client, model="entropy", messages=messages, tools=[WEATHER, TIME],
                                           max_tokens=96, temperature=0)
        assert finish == "tool_calls" and streamed == [{"name": "get_weather", "arguments": call.function.arguments}]
        messages += [ch.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": '{"weather": "sunny", "celsius": 21}'}]
        # the answer is asked without `tools`: offered them again, both models alone call again
        answer = client.chat.completions.create(model="entropy", messages=messages, max_tokens=64,
                                                temperature=0).choices[0]
        assert answer.finish_reason == "stop" and not answer.message.tool_calls
        assert "21" in answer.message.content and "sunny" in answer.message.content.lower(), answer.message.content
    finally:
        stop(proc, 120)
