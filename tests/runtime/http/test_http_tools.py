"""Tool calling through the real server (uvicorn, subservers in threads) on the tiny pair,
with a chat template that writes calls as Qwen2.5's does (the tools by name only: the tiny
context is short) (and, like it, drops a
role it does not know), with the official `openai` client: `tool_choice` required and named
forced by the grammar on a model never trained for tools, streamed as `delta.tool_calls`,
a call whose tokens two writers wrote read as one call, a malformed call back as text, the
history's calls and results rendered by the template, custom roles, and the 400s."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.helpers import tiny
from tests.helpers.serving import served
from tokenrouter.runtime.launch import LaunchOptions

TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\n<tools>' }}{% for t in tools %}{{ '\n' + t.function.name }}{% endfor %}"
    "{{ '\n</tools><|im_end|>\n' }}{% endif %}"
    "{% for m in messages %}"
    "{% if m.role in ['system', 'user', 'wizard'] or (m.role == 'assistant' and not m.tool_calls) %}"
    "{{ '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}"
    "{% elif m.role == 'assistant' %}{{ '<|im_start|>assistant' }}{% if m.content %}{{ '\n' + m.content }}{% endif %}"
    "{% for c in m.tool_calls %}{{ '\n<tool_call>\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' "
    "+ (c.function.arguments | tojson) + '}\n</tool_call>' }}{% endfor %}{{ '<|im_end|>\n' }}"
    "{% elif m.role == 'tool' %}{{ '<|im_start|>user\n<tool_response>\n' + m.content + '\n</tool_response>"
    "<|im_end|>\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CITY = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "the weather", "parameters": CITY}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
             "additionalProperties": False}}}]
ASK = [{"role": "user", "content": "weather in Paris?"}]
GREEDY = {"max_tokens": 120, "temperature": 0}


@pytest.fixture(scope="module")
def srv(pair, tmp_path_factory):
    paths = tiny.pair_with_tokenizer_config(pair, tmp_path_factory.mktemp("tools"),
                                            {"chat_template": TEMPLATE, "eos_token": "<|im_end|>", "bos_token": None})
    with served(tiny.rstitch(paths, 0.25), LaunchOptions(mode="thread"), blocks_back=True, name="tiny") as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    import openai
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused")


def post(srv, body, status=200):
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == status, r.text
    return r.json()


def streamed_calls(client, **kw) -> tuple[dict[int, dict], str, str | None]:
    """The calls a stream's `delta.tool_calls` add up to (by index), its content, its finish reason."""
    calls: dict[int, dict] = {}
    content, finish = "", None
    for chunk in client.chat.completions.create(model="tiny", stream=True, **kw):
        for ch in chunk.choices:
            content += ch.delta.content or ""
            finish = ch.finish_reason or finish
            for d in ch.delta.tool_calls or ():
                c = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                c["id"] = d.id or c["id"]
                c["name"] += d.function.name or ""
                c["arguments"] += d.function.arguments or ""
    return calls, content, finish


def test_tool_choice_required_forces_a_call_streamed_as_the_whole_reply_is(client):
    kw = dict(messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, **GREEDY)
    whole = client.chat.completions.create(model="tiny", **kw)
    ch = whole.choices[0]
    assert ch.finish_reason == "tool_calls" and not ch.message.content
    (call,) = ch.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in ("get_weather", "get_time")
    args = json.loads(call.function.arguments)
    assert args in ({"city": "Paris"}, {"city": "Oslo"}, {"zone": "UTC"}, {"zone": "CET"})
    calls, content, finish = streamed_calls(client, **kw)
    assert finish == "tool_calls" and content == ""
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [(call.function.name, call.function.arguments)]
    assert calls[0]["id"].startswith("call_")


def test_a_named_tool_choice_forces_that_function(client):
    for name in ("get_weather", "get_time"):
        got = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, **GREEDY,
                                             tool_choice={"type": "function", "function": {"name": name}})
        (call,) = got.choices[0].message.tool_calls
        assert call.function.name == name and got.choices[0].finish_reason == "tool_calls"
        assert set(json.loads(call.function.arguments)) == {"city" if name == "get_weather" else "zone"}


def test_a_call_two_writers_wrote_is_one_call(srv):
    """rstitch at tau 0.25 hands off often: find a forced call whose tokens both writers wrote."""
    for i in range(12):
        body = {"messages": [{"role": "user", "content": f"weather {i}?"}], "tools": TOOLS, **GREEDY,
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
        ch = post(srv, body)["choices"][0]
        if {"slm", "llm"} <= set(ch["token_writers"][:-1]):  # before the end-of-sequence token
            break
    else:
        pytest.fail("no forced call written by both writers in 12 prompts")
    (call,) = ch["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"])["city"]
    text = srv.tokenizer.decode(ch["token_ids"], skip_special_tokens=True)
    assert text == '<tool_call>\n{"name": "get_weather", "arguments": ' + call["function"]["arguments"] \
        + "}\n</tool_call>"


def test_a_malformed_call_comes_back_as_text_and_a_good_one_is_read_in_auto(srv):
    bad = '<tool_call>\n{"name": "launch", "arguments": {}}\n</tool_call>'
    good = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    for text, called in ((bad, False), (good, True)):
        body = {"messages": ASK, "tools": TOOLS, "tool_choice": "auto", **GREEDY,
                "structured_outputs": {"regex": json.dumps(text)[1:-1].replace("\\n", "\n").replace("{", "\\{")
                                       .replace("}", "\\}")}}
        ch = post(srv, body)["choices"][0]
        if called:
            assert ch["message"]["content"] is None and ch["finish_reason"] == "tool_calls"
            assert [c["function"] for c in ch["message"]["tool_calls"]] == [{"name": "get_time",
                                                                           "arguments": '{"zone": "UTC"}'}]
        else:
            assert ch["message"] == {"role": "assistant", "content": bad} and ch["finish_reason"] == "stop"
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        assert "".join(d.get("content") or "" for d in deltas) == ("" if called else bad)
        assert bool([d for d in deltas if d.get("tool_calls")]) is called
        # the tokens stream as they did: every choice chunk carries its token ids
        assert [t for c in chunks for t in c["choices"][0].get("token_ids", [])] == ch["token_ids"]


def test_the_history_s_calls_and_results_go_through_the_template(srv):
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    got = post(srv, {"messages": history, "tools": TOOLS, "return_prompt_text": True, "max_tokens": 4})
    assert got["prompt_text"] == (
        "<|im_start|>system\n<tools>\nget_weather\nget_time"
        + "\n</tools><|im_end|>\n<|im_start|>user\nweather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny, 21 C\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    tokens = httpx.post(srv.url + "/tokenize", json={"messages": history, "tools": TOOLS}, timeout=60).json()["tokens"]
    assert srv.tokenizer.decode(tokens) == got["prompt_text"]


def test_a_custom_role_goes_to_the_template_and_one_it_cannot_render_is_a_400(srv):
    got = post(srv, {"messages": [{"role": "wizard", "content": "cast"}, *ASK], "return_prompt_text": True,
                     "max_tokens": 2})
    assert got["prompt_text"].startswith("<|im_start|>wizard\ncast<|im_end|>\n")
    err = post(srv, {"messages": [*ASK, {"role": "narrator", "content": "x"}], "max_tokens": 2}, 400)["error"]
    assert err["param"] == "messages[1].role" and "'narrator'" in err["message"]
    err = post(srv, {"messages": [{"role": "narrator", "content": ""}], "max_tokens": 2}, 400)["error"]
    assert err["param"] == "messages[0].role" and "'narrator'" in err["message"]  # alone, and empty


BAD = [
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "nope"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "tools", "get_weather"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools.0.function.name", "name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}],
      "tool_choice": "required"}, "tools", "tools"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format",
     "tool_choice"),
    ({"tool_choice": "sometimes"}, "tool_choice", "tool_choice"),
    ({"parallel_tool_calls": [1]}, "parallel_tool_calls", "parallel_tool_calls"),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [{"type": "function", "function": {
        "name": "f", "arguments": "{not json"}}]}]}, "messages", "arguments"),
]


@pytest.mark.parametrize("given, param, said", BAD, ids=[json.dumps(g)[:50] for g, _, _ in BAD])
def test_a_tool_request_that_cannot_hold_is_a_400_naming_the_field(srv, given, param, said):
    err = post(srv, {"messages": ASK, "max_tokens": 4, **given}, 400)["error"]
    assert (err["param"] == param or err["param"].startswith(param + ".")) and said in err["message"], err


def test_tools_on_completions_are_refused_and_none_is_accepted(srv):
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2, "tools": TOOLS}, timeout=60)
    assert r.status_code == 400 and "chat" in r.json()["error"]["message"]
    assert post(srv, {"messages": ASK, "tools": TOOLS, "tool_choice": "none", "max_tokens": 3})["choices"][0][
        "message"].get("tool_calls") is None
