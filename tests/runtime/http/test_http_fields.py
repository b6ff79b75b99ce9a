"""No request field is silently dropped: every field of vLLM's request schemas either acts
here, is refused with a 400 naming it, or is listed as changing nothing here (accepted); a
field outside vLLM's schema is accepted and named in a warning. Against the real server
(uvicorn, the subservers in threads) on the tiny pair with a tokenizer that adds a BOS and
a chat template that writes out the variables it is given."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import tiny
from tests.helpers import vllm as vh
from tests.helpers.serving import served
from tokenrouter.runtime.launch import LaunchOptions
from tokenrouter.runtime.http import fields, schema

BOS = 0  # <|endoftext|>, which this tokenizer puts before a prompt
TEMPLATE = ("{% for m in messages %}{{ '<|im_start|>' + m.role }}{% if m.name %}{{ ':' + m.name }}{% endif %}"
            "{% if m.tool_call_id %}{{ '#' + m.tool_call_id }}{% endif %}"
            "{% if m.reasoning_content %}{{ '<think>' + m.reasoning_content + '</think>' }}{% endif %}"
            "{{ '\n' + m.content + '<|im_end|>\n' }}{% endfor %}"
            "{% for d in documents or [] %}{{ '<doc>' + d.text + '</doc>\n' }}{% endfor %}"
            "{% if flavour is defined %}{{ '[' + flavour + ']' }}{% endif %}"
            "{% if reasoning_effort %}{{ '(effort ' + reasoning_effort + ')' }}{% endif %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
            "{% if enable_thinking is defined and not enable_thinking %}{{ '<think></think>' }}{% endif %}{% endif %}")
CMPL = {"prompt": "fields", "max_tokens": 4, "temperature": 0, "ignore_eos": True}
HI = [{"role": "user", "content": "hi"}]
CHAT = {"messages": HI, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
BASE = {"/v1/completions": CMPL, "/v1/chat/completions": CHAT, "/tokenize": {"messages": HI}}
LOGGER = fields.__name__


@pytest.fixture(scope="module")
def srv(pair, tmp_path_factory):
    paths = tiny.pair_with_tokenizer_config(pair, tmp_path_factory.mktemp("fields"),
                                            {"chat_template": TEMPLATE, "eos_token": "<|im_end|>",
                                             "bos_token": "<|endoftext|>", "add_bos_token": True})
    with served(tiny.rstitch(paths, 0.3), LaunchOptions(mode="thread"), name="tiny") as s:
        yield s


def post(srv, path, body, status=200, **kw):
    r = httpx.post(srv.url + path, json=body, timeout=60, **kw)
    assert r.status_code == status, r.text
    return r.json()


def tokens(srv, path, body) -> list[list[int]]:
    return [c["token_ids"] for c in post(srv, path, body)["choices"]]


# ------------------------------------------------------------------ refused

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
CALLED = [{"role": "user", "content": "weather?"},
          {"role": "assistant", "content": "", "tool_calls": [
              {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
          {"role": "tool", "content": "sunny", "tool_call_id": "c1"}]
REFUSED = [
    ("/v1/completions", {"prompt_embeds": "AAAA"}, "prompt_embeds"),
    ("/v1/completions", {"prompt": None, "prompt_embeds": "AAAA"}, "prompt_embeds"),  # not "prompt: a string"
    ("/v1/completions", {"priority": 1}, "priority"),
    ("/v1/completions", {"repetition_detection": {"max_pattern_size": 4}}, "repetition_detection"),
    ("/v1/completions", {"thinking_token_budget": 16}, "thinking_token_budget"),
    ("/v1/completions", {"spaces_between_special_tokens": False}, "spaces_between_special_tokens"),
    ("/v1/completions", {"min_tokens": 5}, "min_tokens"),  # more than max_tokens, as vLLM refuses
    ("/v1/completions", {"function_call": "auto"}, "function_call"),
    ("/v1/chat/completions", {"chat_template": "{{ messages }}"}, "chat_template"),
    ("/v1/chat/completions", {"continue_final_message": True}, "continue_final_message"),
    ("/v1/chat/completions", {"tool_choice": "required"}, "tool_choice"),  # needs tools
    ("/v1/chat/completions", {"functions": [TOOL["function"]]}, "functions"),  # deprecated: use tools
    ("/v1/chat/completions", {"messages": [{**CALLED[1], "function_call": {"name": "f"}}]}, "messages.function_call"),
    ("/v1/completions", {"tools": [TOOL]}, "tools"),  # a chat feature
    ("/v1/chat/completions", {"chat_template_kwargs": {"tokenize": False}}, "chat_template_kwargs"),
    ("/tokenize", {"chat_template": "{{ messages }}"}, "chat_template"),
    ("/tokenize", {"continue_final_message": True}, "continue_final_message"),
]


@pytest.mark.parametrize("path, given, param", REFUSED, ids=[f"{p} {k}" for p, _, k in REFUSED])
def test_a_field_this_server_does_not_implement_gets_a_400_naming_it(srv, path, given, param):
    body = {k: v for k, v in {**BASE[path], **given}.items() if v is not None}
    err = post(srv, path, body, status=400)["error"]
    assert err["param"] == param and param.split(".")[-1] in err["message"], err


def test_tools_and_the_history_s_calls_reach_the_template(srv):
    """What tool calling implemented in place of the 400s above: tools, a named choice and a
    history with calls and their results are served, on chat and /tokenize."""
    got = post(srv, "/v1/chat/completions", {**CHAT, "messages": CALLED, "tools": [TOOL], "tool_choice": "none",
                                             "return_prompt_text": True})
    assert "<|im_start|>tool#c1\nsunny<|im_end|>" in got["prompt_text"]
    assert post(srv, "/tokenize", {"messages": CALLED, "tools": [TOOL]})["tokens"]


def test_a_value_that_asks_for_nothing_is_accepted(srv):
    nothing = {"priority": 0, "best_of": 1, "use_beam_search": False, "bad_words": [], "tools": [],
               "tool_choice": "none", "functions": [], "function_call": "none", "spaces_between_special_tokens": True,
               "prompt_embeds": None}
    assert tokens(srv, "/v1/completions", {**CMPL, **nothing}) == tokens(srv, "/v1/completions", CMPL)
    said_nothing = [*HI[:-1], {**HI[-1], "tool_calls": []}]
    assert tokens(srv, "/v1/chat/completions", {**CHAT, **nothing, "messages": said_nothing}) \
        == tokens(srv, "/v1/chat/completions", CHAT)


# ------------------------------------------------------------------ implemented

def test_request_id_and_the_x_request_id_header_name_the_response(srv):
    assert post(srv, "/v1/completions", {**CMPL, "request_id": "abc"})["id"] == "cmpl-abc"
    assert post(srv, "/v1/chat/completions", {**CHAT, "request_id": "abc"})["id"] == "chatcmpl-abc"
    assert post(srv, "/v1/completions", {**CMPL, "request_id": "abc"}, headers={"X-Request-Id": "hdr"})["id"] \
        == "cmpl-hdr"  # the header wins, as in vLLM
    ids = {post(srv, "/v1/completions", CMPL)["id"] for _ in range(2)}
    assert len(ids) == 2 and all(i.startswith("cmpl-") for i in ids)
    with httpx.stream("POST", srv.url + "/v1/completions", json={**CMPL, "stream": True, "request_id": "s1"},
                      timeout=60) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert chunks and {c["id"] for c in chunks} == {"cmpl-s1"}

    async def twice():  # the same id twice at once: the server's own ids keep them apart
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
            return await asyncio.gather(*(client.post("/v1/completions", json={**CMPL, "request_id": "same"})
                                          for _ in range(2)))
    both = asyncio.run(twice())
    assert [r.status_code for r in both] == [200, 200]
    assert both[0].json()["choices"][0]["token_ids"] == both[1].json()["choices"][0]["token_ids"]


def test_return_token_ids_returns_the_prompts_and_add_special_tokens_adds_the_bos(srv):
    ids = post(srv, "/tokenize", {"prompt": "fields"})["tokens"]
    assert ids[0] == BOS and post(srv, "/tokenize", {"prompt": "fields", "add_special_tokens": False})["tokens"] \
        == ids[1:]
    assert "prompt_token_ids" not in post(srv, "/v1/completions", CMPL)["choices"][0]
    got = post(srv, "/v1/completions", {**CMPL, "return_token_ids": True})
    assert got["choices"][0]["prompt_token_ids"] == ids and got["usage"]["prompt_tokens"] == len(ids)
    plain = post(srv, "/v1/completions", {**CMPL, "return_token_ids": True, "add_special_tokens": False})
    assert plain["choices"][0]["prompt_token_ids"] == ids[1:] and plain["usage"]["prompt_tokens"] == len(ids) - 1
    two = post(srv, "/v1/completions", {**CMPL, "prompt": ["a", "bc"], "return_token_ids": True})["choices"]
    assert [c["prompt_token_ids"] for c in two] == [post(srv, "/tokenize", {"prompt": p})["tokens"]
                                                    for p in ("a", "bc")]
    with httpx.stream("POST", srv.url + "/v1/completions", json={**CMPL, "stream": True, "return_token_ids": True},
                      timeout=60) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert chunks[0]["choices"][0]["prompt_token_ids"] == ids
    assert not any("prompt_token_ids" in c["choices"][0] for c in chunks[1:])

    chat = post(srv, "/tokenize", {"messages": HI})["tokens"]  # a chat prompt: no BOS unless asked (vLLM's)
    assert chat[0] != BOS and post(srv, "/tokenize", {"messages": HI, "add_special_tokens": True})["tokens"] \
        == [BOS, *chat]
    got = post(srv, "/v1/chat/completions", {**CHAT, "return_token_ids": True})
    assert got["prompt_token_ids"] == chat and got["usage"]["prompt_tokens"] == len(chat)
    assert post(srv, "/v1/chat/completions", {**CHAT, "return_token_ids": True, "add_special_tokens": True}) \
        ["prompt_token_ids"] == [BOS, *chat]


def test_chat_template_variables_and_message_keys_reach_the_template(srv):
    messages = [{"role": "system", "content": "S", "name": "boss"}, {"role": "user", "content": "U"},
                {"role": "assistant", "content": "A", "reasoning": "R"},
                {"role": "tool", "content": "T", "tool_call_id": "c1"}]
    body = {**CHAT, "messages": messages, "documents": [{"title": "d", "text": "D1"}], "reasoning_effort": "none",
            "chat_template_kwargs": {"flavour": "mint", "add_generation_prompt": False}, "return_prompt_text": True,
            "return_token_ids": True}
    got = post(srv, "/v1/chat/completions", body)
    assert got["prompt_text"] == ("<|im_start|>system:boss\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
                                  "<|im_start|>assistant<think>R</think>\nA<|im_end|>\n"
                                  "<|im_start|>tool#c1\nT<|im_end|>\n"
                                  "<doc>D1</doc>\n[mint](effort none)<|im_start|>assistant\n<think></think>")
    assert got["prompt_token_ids"] == post(srv, "/tokenize", {"prompt": got["prompt_text"],
                                                              "add_special_tokens": False})["tokens"]
    # the kwargs' enable_thinking wins over the one reasoning_effort implies; without return_prompt_text, none
    thinking = post(srv, "/v1/chat/completions", {**body, "chat_template_kwargs": {"enable_thinking": True}})
    assert thinking["prompt_text"].endswith("(effort none)<|im_start|>assistant\n")
    assert "prompt_text" not in post(srv, "/v1/chat/completions", CHAT)
    # /tokenize takes the kwargs too
    assert post(srv, "/tokenize", {"messages": messages, "chat_template_kwargs": {"flavour": "mint"}})["tokens"] \
        == post(srv, "/tokenize", {"prompt": got["prompt_text"].split("<doc>")[0] + "[mint]<|im_start|>assistant\n",
                                   "add_special_tokens": False})["tokens"]
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert chunks[0]["prompt_text"] == got["prompt_text"] and chunks[0]["prompt_token_ids"] == got["prompt_token_ids"]
    assert not any("prompt_text" in c for c in chunks[1:])


def test_return_tokens_as_token_ids_names_logprob_tokens_by_id(srv):
    c = post(srv, "/v1/completions", {**CMPL, "logprobs": 2, "return_tokens_as_token_ids": True})["choices"][0]
    assert c["logprobs"]["tokens"] == [f"token_id:{t}" for t in c["token_ids"]]
    assert all(k.startswith("token_id:") for top in c["logprobs"]["top_logprobs"] for k in top)
    text = post(srv, "/v1/completions", {**CMPL, "logprobs": 2})["choices"][0]["logprobs"]
    assert c["logprobs"]["text_offset"] == text["text_offset"]  # offsets in the text, whatever the names
    body = {**CHAT, "logprobs": True, "top_logprobs": 2, "return_tokens_as_token_ids": True}
    c = post(srv, "/v1/chat/completions", body)["choices"][0]
    assert [e["token"] for e in c["logprobs"]["content"]] == [f"token_id:{t}" for t in c["token_ids"]]
    assert all(t["token"].startswith("token_id:") for e in c["logprobs"]["content"] for t in e["top_logprobs"])


def test_tokenize_returns_token_strings(srv):
    got = post(srv, "/tokenize", {"prompt": "a b", "return_token_strs": True})
    assert got["token_strs"] == ["<|endoftext|>", "a", "Ġ", "b"] and len(got["tokens"]) == 4


# ------------------------------------------------------------------ accepted: no effect, unknown

NO_EFFECT = {"user": "u-1", "session_id": "s-1", "stream_interval": 4, "cache_salt": "salt",
             "watermarking": {"enabled": False}, "length_penalty": 1.5, "truncation_side": "left",
             "parallel_tool_calls": False, "include_reasoning": False, "vllm_xargs": {"k": 1},
             "kv_transfer_params": {"do_remote_prefill": False}, "ec_transfer_params": {},
             "routed_experts_prompt_start": 0, "return_token_offsets": True, "mm_payload": {},
             "return_mm_kwargs": False, "media_io_kwargs": {}, "mm_processor_kwargs": {}}


def test_fields_without_effect_here_are_accepted_without_a_warning(srv, caplog):
    assert set(NO_EFFECT) == set(fields.NO_EFFECT)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for path in ("/v1/completions", "/v1/chat/completions"):
            assert tokens(srv, path, {**BASE[path], **NO_EFFECT}) == tokens(srv, path, BASE[path])
        assert post(srv, "/tokenize", {"messages": HI, "mm_processor_kwargs": {}})["tokens"] \
            == post(srv, "/tokenize", {"messages": HI})["tokens"]
    assert not [r for r in caplog.records if r.name == LOGGER]


def test_unknown_fields_are_accepted_and_named_in_one_warning(srv, caplog):
    unknown = {"store": False, "service_tier": "auto", "max_token": 9}
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert tokens(srv, "/v1/completions", {**CMPL, **unknown}) == tokens(srv, "/v1/completions", CMPL)
        said = [{**HI[0], "refusal": None}]
        assert tokens(srv, "/v1/chat/completions", {**CHAT, "metadata": {}, "messages": said}) \
            == tokens(srv, "/v1/chat/completions", CHAT)
    warned = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warned) == 2, warned
    assert all(n in warned[0] for n in unknown) and "metadata" in warned[1] and "messages[].refusal" in warned[1]


def test_no_docs_or_openapi_schema_are_served(srv):
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert httpx.get(srv.url + path).status_code == 404


@vh.needs_vllm
@pytest.mark.slow  # importing vLLM's protocol takes seconds
def test_every_field_of_vllms_requests_is_implemented_refused_or_without_effect():
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.serve.tokenize import protocol as tokenize
    from vllm.renderers.chat_utils import CustomChatCompletionMessageParam

    known = set(fields.UNSUPPORTED) | set(fields.NO_EFFECT)
    for theirs, ours in [(CompletionRequest, schema.CompletionRequest), (ChatCompletionRequest, schema.ChatRequest),
                         (tokenize.TokenizeCompletionRequest, schema.TokenizeRequest),
                         (tokenize.TokenizeChatRequest, schema.TokenizeRequest),
                         (tokenize.DetokenizeRequest, schema.DetokenizeRequest)]:
        assert not set(theirs.model_fields) - set(ours.model_fields) - known, theirs.__name__
    message_keys = set(CustomChatCompletionMessageParam.__annotations__)
    assert not message_keys - set(schema.ChatMessage.model_fields) - set(fields.MESSAGE_UNSUPPORTED)


# ------------------------------------------------------------------ wrong types

# every field either request schema declares, and every field `fields.py` judges, on either
# endpoint (so each also gets the other's fields, which it does not define), and every key
# of a chat message
EVERY_FIELD = sorted(set(schema.CompletionRequest.model_fields) | set(schema.ChatRequest.model_fields)
                     | set(fields.UNSUPPORTED) | set(fields.NO_EFFECT))
MESSAGE_KEYS = sorted(set(schema.ChatMessage.model_fields) | set(fields.MESSAGE_UNSUPPORTED))
ODD_TEXT = st.sampled_from(["", "null", "\ud800", "a" * 5000, "NaN", "json_schema", "text", "user", "none",
                            "required", "auto", "function", "{not json"])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(1 << 70), max_value=1 << 70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12) | ODD_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12) | ODD_TEXT, inner, max_size=4)
    | st.fixed_dictionaries({"type": inner}, optional={"text": inner, "json_schema": inner, "schema": inner})
    # a tool, a named tool choice or a call of the history, with any value anywhere
    | st.fixed_dictionaries({"function": st.fixed_dictionaries({}, optional={
        "name": inner | ODD_TEXT, "parameters": inner, "arguments": inner | ODD_TEXT, "description": inner})},
        optional={"type": st.just("function") | inner, "id": inner}),
    max_leaves=12)
WHERE = [(path, f) for path in ("/v1/completions", "/v1/chat/completions", "/tokenize") for f in EVERY_FIELD] + \
    [(path, f"messages[].{k}") for path in ("/v1/chat/completions", "/tokenize") for k in MESSAGE_KEYS]


ONCE_A_500 = [  # bodies that got a 500 before their fields were checked by type
    ("/v1/completions", {"messages": 2147483647}, 200),  # a field completions does not define: unknown
    ("/v1/completions", {"messages": "null"}, 200),
    ("/v1/completions", {"messages": [{"role": 5}]}, 200),
    ("/v1/completions", {"response_format": {"type": "json_schema", "json_schema": "x"}, "store": 1}, 400),
    ("/v1/chat/completions", {"structured_outputs": {"choice": "not json"}}, 400),
    ("/v1/chat/completions", {"structured_outputs": {"\ud800": True}}, 400),  # quoted back in the error
]


@pytest.mark.parametrize("path, given, status", ONCE_A_500, ids=[json.dumps(g)[:40] for _, g, _ in ONCE_A_500])
def test_bodies_that_once_got_a_500_get_their_answer(srv, path, given, status):
    r = httpx.post(srv.url + path, content=json.dumps({**BASE[path], **given}),
                   headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == status, r.text
    if status == 400:
        assert r.json()["error"]["param"] in given


def _no_server_error(srv, path: str, body: dict, stream: bool) -> None:
    raw = json.dumps({**body, "stream": stream} if path != "/tokenize" else body)  # NaN and Infinity too
    r = httpx.post(srv.url + path, content=raw, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code < 500 and '"server_error"' not in r.text, (path, raw[:300], r.status_code, r.text[:300])


@pytest.mark.slow  # about 2,000 requests
@pytest.mark.parametrize("path, field", WHERE, ids=[f"{p} {f}" for p, f in WHERE])
def test_a_value_of_any_type_in_any_field_is_never_a_server_error(srv, path, field):
    @settings(max_examples=10, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(value=JSON, other=st.none() | st.tuples(st.sampled_from(EVERY_FIELD), JSON), stream=st.booleans())
    def check(value, other, stream):
        body = dict(BASE[path])
        if other is not None:  # sometimes another field is wrong too
            body[other[0]] = other[1]
        if field.startswith("messages[]."):
            body["messages"] = [{**HI[0], field.split(".", 1)[1]: value}]
        else:
            body[field] = value
        _no_server_error(srv, path, body, stream)
    check()


FUNCTION = st.fixed_dictionaries({"name": st.sampled_from(["f", "g"]) | ODD_TEXT}, optional={
    "parameters": JSON | st.fixed_dictionaries({"type": st.just("object") | JSON}, optional={
        "properties": st.dictionaries(st.text(max_size=4), JSON, max_size=3), "required": JSON})})
TOOLISH = st.fixed_dictionaries({"type": st.just("function"), "function": FUNCTION})


@pytest.mark.slow  # about 100 requests
@pytest.mark.parametrize("choice", ["required", "auto", {"type": "function", "function": {"name": "f"}}])
def test_tools_of_any_shape_with_any_choice_are_never_a_server_error(srv, choice):
    """Forced calls compile the tools' parameters into a grammar: any of them is a 4xx or a reply."""
    @settings(max_examples=30, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(tools=st.lists(TOOLISH, max_size=3), parallel=st.booleans() | st.none(), stream=st.booleans())
    def check(tools, parallel, stream):
        body = {**CHAT, "tools": tools, "tool_choice": choice, "max_tokens": 24}
        if parallel is not None:
            body["parallel_tool_calls"] = parallel
        _no_server_error(srv, "/v1/chat/completions", body, stream)
    check()
