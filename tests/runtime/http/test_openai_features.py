"""What OpenAI clients written for vLLM, SGLang or llama-server expect, against the real HTTP
server (uvicorn, real subserver processes) on a pair whose writers both write: stop strings
(across chunks and across a handoff), logprobs, n and lists of prompts, penalties and
logit_bias (greedy outputs equal the single-request reference), JSON schemas enforced on
both writers, the extra endpoints, several served names, CORS and the metrics."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import torch

from tests.helpers import tiny
from tests.helpers.serving import complete_many, scrape, served, stream_completion
from tokenrouter.protocol.sampling import SamplingParams, Structured
from tokenrouter.protocol.step import FeatureNeeds
from tokenrouter.runtime.launch import LaunchOptions
from tokenrouter.runtime.http.app import Limits
from tokenrouter.runtime.reference import Reference

ORIGIN = "http://client.example"


@pytest.fixture(scope="module")
def srv(pair):
    with served(tiny.rstitch(pair, 0.25), LaunchOptions(mode="process", num_blocks=128, concurrency=8),
                blocks_back=True, name=("tiny", "alias"), max_tokens_limit=200,
                limits=Limits(max_body_bytes=8 << 20), allowed_origins=[ORIGIN]) as s:
        yield s


@pytest.fixture(scope="module")
def ref(srv):
    return Reference(srv.program)


def post(srv, path, body, **kw):
    r = httpx.post(srv.url + path, json=body, timeout=120, **kw)
    assert r.status_code == 200, r.text
    return r.json()


def greedy(srv, prompt, n=40):
    return post(srv, "/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0,
                                         "ignore_eos": True})["choices"][0]


# ------------------------------------------------------------------ stop strings

def _handoff_stop(srv, choice):
    """A stop string of two tokens written by different writers, whose first occurrence in the
    text is at those tokens: (the string, its offset, the index of its second token)."""
    dec = srv.tokenizer.decode
    toks, writers, text = choice["token_ids"], choice["token_writers"], choice["text"]
    offset = 0
    for k in range(1, len(toks)):
        offset += len(dec([toks[k - 1]]))
        a, b = dec([toks[k - 1]]), dec([toks[k]])
        s = a + b
        if writers[k - 1] != writers[k] and a.strip() and b.strip() and "\ufffd" not in s:
            if text.find(s) == offset - len(a):
                return s, offset - len(a), k
    return None


def test_a_stop_string_across_a_handoff_ends_the_request_and_is_withheld(srv):
    found = None
    for i in range(12):
        choice = greedy(srv, f"stop test {i}")
        found = _handoff_stop(srv, choice)
        if found:
            break
    assert found, "no handoff between two printable tokens in 12 prompts"
    stop, at, k = found
    body = {"prompt": f"stop test {i}", "max_tokens": 40, "temperature": 0, "ignore_eos": True, "stop": [stop, "\x00never"]}
    got = post(srv, "/v1/completions", body)["choices"][0]
    assert got["text"] == choice["text"][:at]
    assert got["finish_reason"] == "stop" and got["stop_reason"] == stop
    assert got["token_ids"] == choice["token_ids"][:k + 1]
    # streamed: the same text, token by token (so the string spans chunks), never any of it
    text, ids, chunks = stream_completion(srv.url, body)
    assert text == choice["text"][:at] and stop not in text
    assert ids == choice["token_ids"][:k + 1]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"][0]["stop_reason"] == stop
    kept = post(srv, "/v1/completions", {**body, "include_stop_str_in_output": True})["choices"][0]
    assert kept["text"] == choice["text"][:at] + stop
    assert srv.wait_blocks_free() == {"slm": 0, "llm": 0}


def test_chat_stop_string_through_the_openai_client(srv):
    import openai
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused")
    full = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=30,
                                          temperature=0, extra_body={"ignore_eos": True})
    content = full.choices[0].message.content
    stop = content[5:7]
    assert len(stop) == 2 and content.find(stop) >= 0
    cut = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=30,
                                         temperature=0, stop=[stop], extra_body={"ignore_eos": True})
    assert cut.choices[0].message.content == content[:content.find(stop)]
    assert cut.choices[0].finish_reason == "stop"


# ------------------------------------------------------------------ logprobs

def test_logprobs_are_the_writers_distribution(srv, ref):
    body = {"prompt": "logprobs please", "max_tokens": 24, "temperature": 0, "ignore_eos": True, "logprobs": 3}
    c = post(srv, "/v1/completions", body)["choices"][0]
    lp = c["logprobs"]
    toks, writers = c["token_ids"], c["token_writers"]
    assert len(lp["tokens"]) == len(toks) == len(lp["token_logprobs"]) == len(lp["top_logprobs"])
    assert {"slm", "llm"} <= set(writers)
    prompt = srv.tokenizer.encode("logprobs please")
    for i in range(len(toks)):  # each token's log-probability under the model that wrote it
        logits, _ = ref._forward(writers[i], prompt + toks[:i], FeatureNeeds())
        want = torch.log_softmax(logits.double(), -1)
        assert lp["token_logprobs"][i] == pytest.approx(float(want[toks[i]]), abs=1e-6)
        assert lp["token_logprobs"][i] == pytest.approx(max(lp["top_logprobs"][i].values()), abs=1e-9)  # greedy
        assert 1 <= len(lp["top_logprobs"][i]) <= 4  # keyed by text: byte tokens may share "\ufffd"
    zero = post(srv, "/v1/completions", {**body, "logprobs": 0})["choices"][0]["logprobs"]
    assert zero is not None and zero["token_logprobs"] == lp["token_logprobs"]
    assert all(len(t) == 1 for t in zero["top_logprobs"])  # the sampled token only
    none = post(srv, "/v1/completions", {**body, "logprobs": None})["choices"][0]
    assert none["logprobs"] is None


def test_chat_logprobs_name_each_tokens_writer_and_stream(srv):
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 16, "temperature": 0,
            "logprobs": True, "top_logprobs": 2, "ignore_eos": True}
    c = post(srv, "/v1/chat/completions", body)["choices"][0]
    content = c["logprobs"]["content"]
    assert [e["writer"] for e in content] == c["token_writers"]
    assert all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in content)
    assert [e["token"] for e in content] == [srv.tokenizer.decode([t]) for t in c["token_ids"]]
    streamed = []
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                ch = json.loads(line[6:])["choices"][0]
                streamed += (ch.get("logprobs") or {}).get("content") or []
    assert [e["logprob"] for e in streamed] == [e["logprob"] for e in content]


# ------------------------------------------------------------------ n and lists of prompts

def test_n_choices_and_lists_of_prompts(srv):
    one = post(srv, "/v1/completions", {"prompt": "n test", "max_tokens": 12, "temperature": 1.0, "seed": 11})
    two = post(srv, "/v1/completions", {"prompt": "n test", "max_tokens": 12, "temperature": 1.0, "seed": 11, "n": 2})
    assert [c["index"] for c in two["choices"]] == [0, 1]
    assert two["choices"][0]["token_ids"] == one["choices"][0]["token_ids"]  # choice 0 is the n = 1 request
    assert two["choices"][1]["token_ids"] != two["choices"][0]["token_ids"]
    assert two["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]
    assert two["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in two["choices"])
    many = post(srv, "/v1/completions", {"prompt": ["first", "second one"], "max_tokens": 6, "temperature": 0, "n": 2})
    assert [c["index"] for c in many["choices"]] == [0, 1, 2, 3]
    alone = [greedy(srv, p, 6) for p in ("first", "second one")]
    assert [c["token_ids"] for c in many["choices"]] == [alone[0]["token_ids"]] * 2 + [alone[1]["token_ids"]] * 2
    _, _, chunks = stream_completion(srv.url, {"prompt": "n test", "max_tokens": 8, "n": 2, "seed": 3,
                                               "temperature": 1.0})
    ends = {ch["choices"][0]["index"]: ch["choices"][0]["finish_reason"] for ch in chunks
            if ch.get("choices") and ch["choices"][0]["finish_reason"]}
    assert set(ends) == {0, 1}


# ------------------------------------------------------------------ penalties, logit bias

PENALTIES = [dict(presence_penalty=1.5), dict(frequency_penalty=1.0, repetition_penalty=1.3),
             dict(logit_bias={"70": 6.0, "71": -100.0})]


@pytest.mark.parametrize("extra", PENALTIES, ids=lambda e: ",".join(e))
def test_penalties_and_logit_bias_equal_the_reference_at_concurrency_8(srv, ref, extra):
    prompts = [f"penalty {i} " * 2 for i in range(8)]
    outs = asyncio.run(complete_many(srv.url, prompts, 8, max_tokens=20, temperature=0, **extra))
    plain = asyncio.run(complete_many(srv.url, prompts, 8, max_tokens=20, temperature=0))
    bias = tuple((int(k), v) for k, v in extra.get("logit_bias", {}).items())
    params = SamplingParams(max_tokens=20, **{k: v for k, v in extra.items() if k != "logit_bias"},
                            logit_bias=bias).with_eos(srv.tokenizer.eos_token_ids)
    changed = 0
    for p, o, q in zip(prompts, outs, plain):
        want = ref.generate(srv.tokenizer.encode(p), params)
        assert o["choices"][0]["token_ids"] == want.tokens, p
        assert o["choices"][0]["token_writers"] == want.writers
        changed += o["choices"][0]["token_ids"] != q["choices"][0]["token_ids"]
    assert changed  # the parameters did something
    if "logit_bias" in extra:
        assert all(71 not in o["choices"][0]["token_ids"] for o in outs)


# ------------------------------------------------------------------ structured output

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
          "required": ["name", "color", "ok"], "additionalProperties": False}


def _valid(obj) -> bool:
    return (isinstance(obj, dict) and set(obj) == {"name", "color", "ok"} and isinstance(obj["name"], str)
            and len(obj["name"]) <= 6 and obj["color"] in ("red", "green", "blue") and isinstance(obj["ok"], bool))


def test_a_json_schema_is_enforced_on_both_writers_at_concurrency_8(srv, ref):
    rf = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA}}
    prompts = [f"json {i}" for i in range(8)]
    outs = asyncio.run(complete_many(srv.url, prompts, 8, max_tokens=120, temperature=0, response_format=rf))
    writers = set()
    params = SamplingParams(max_tokens=120, structured=Structured(kind="json_schema", spec=json.dumps(SCHEMA)))
    params = params.with_eos(srv.tokenizer.eos_token_ids)
    for p, o in zip(prompts, outs):
        c = o["choices"][0]
        assert c["finish_reason"] == "stop", c
        assert _valid(json.loads(c["text"])), c["text"]
        writers |= set(c["token_writers"])
        want = ref.generate(srv.tokenizer.encode(p), params)
        assert c["token_ids"] == want.tokens and c["token_writers"] == want.writers
    assert writers == {"slm", "llm"}  # both writers wrote under the grammar
    # sampled, through the official client's chat
    import openai
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused")
    for seed in range(3):
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "json"}], seed=seed,
                                           max_tokens=120, temperature=1.0, response_format=rf)
        assert _valid(json.loads(r.choices[0].message.content))
    obj = post(srv, "/v1/completions", {"prompt": "any json", "max_tokens": 60, "temperature": 0,
                                        "response_format": {"type": "json_object"}})["choices"][0]
    if obj["finish_reason"] == "stop":
        assert isinstance(json.loads(obj["text"]), dict)
    else:
        assert obj["text"].lstrip().startswith("{")
    choice = post(srv, "/v1/completions", {"prompt": "pick", "max_tokens": 10, "temperature": 0,
                                           "structured_outputs": {"choice": ["yes", "no"]}})["choices"][0]
    assert choice["text"] in ("yes", "no")


def test_where_the_grammar_ends_the_output_ends(srv, ref):
    """`min_tokens` past the grammar's end gives way to it (the reference's tokens, finish
    "stop"); `ignore_eos`, which cannot hold with a grammar, is a 400. Both were a 500."""
    for given, spec in (({"structured_outputs": {"choice": ["yes", "no"]}}, Structured(kind="choice",
                                                                                        spec='["yes", "no"]')),
                        ({"response_format": {"type": "json_object"}}, Structured(kind="json"))):
        c = post(srv, "/v1/completions", {"prompt": "pick", "max_tokens": 40, "temperature": 0, "min_tokens": 30,
                                          **given})["choices"][0]
        params = SamplingParams(max_tokens=40, min_tokens=30, structured=spec).with_eos(srv.tokenizer.eos_token_ids)
        want = ref.generate(srv.tokenizer.encode("pick"), params)
        assert c["token_ids"] == want.tokens and c["finish_reason"] == "stop" and len(want.tokens) < 30, c
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "pick", "max_tokens": 4, "ignore_eos": True,
                                                         **given}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "ignore_eos", r.text


# ------------------------------------------------------------------ endpoints, names, CORS

def test_models_tokenize_detokenize_and_served_names(srv):
    models = httpx.get(srv.url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny", "alias"]
    assert httpx.get(srv.url + "/v1/models/alias").json()["id"] == "alias"
    missing = httpx.get(srv.url + "/v1/models/nope")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    tok = post(srv, "/tokenize", {"prompt": "Hello there"})
    assert tok["tokens"] == srv.tokenizer.encode("Hello there") and tok["count"] == len(tok["tokens"])
    assert post(srv, "/detokenize", {"tokens": tok["tokens"]})["prompt"] == "Hello there"
    chat = post(srv, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
    assert chat["count"] > 2
    bad = httpx.post(srv.url + "/detokenize", json={"tokens": [10 ** 7]})
    assert bad.status_code == 400
    r = post(srv, "/v1/completions", {"model": "alias", "prompt": "x", "max_tokens": 2})
    assert r["model"] == "alias"
    assert httpx.post(srv.url + "/v1/completions", json={"model": "other", "prompt": "x"}).status_code == 400
    assert httpx.get(srv.url + "/version").json()["version"]


def test_cors_preflight_and_headers(srv):
    pre = httpx.options(srv.url + "/v1/completions", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == ORIGIN
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers={"Origin": ORIGIN})
    assert r.headers["access-control-allow-origin"] == ORIGIN
    other = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2},
                       headers={"Origin": "http://elsewhere.example"})
    assert "access-control-allow-origin" not in other.headers


def test_a_10_mb_body_gets_a_413_the_client_can_read(srv):
    big = b'{"prompt": "' + b"a" * (10 << 20) + b'"}'
    r = httpx.post(srv.url + "/v1/completions", content=big, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]


def test_the_last_chunk_carries_the_last_text_with_the_finish_reason(srv):
    body = {"prompt": "last chunk", "max_tokens": 10, "temperature": 0, "ignore_eos": True}
    full = post(srv, "/v1/completions", body)["choices"][0]
    _, ids, chunks = stream_completion(srv.url, body)
    last = chunks[-1]["choices"][0]
    assert last["finish_reason"] == "length" and last["token_ids"] and last["token_ids"][-1] == full["token_ids"][-1]
    assert ids == full["token_ids"]


# ------------------------------------------------------------------ metrics

def test_metrics_have_latency_histograms_and_token_counters(srv):
    before = scrape(httpx.get(srv.url + "/metrics").text)
    prompts = [f"metrics {i}" for i in range(4)]
    outs = asyncio.run(complete_many(srv.url, prompts, 4, max_tokens=8, temperature=0, ignore_eos=True))
    after = scrape(httpx.get(srv.url + "/metrics").text)

    def grew(name):
        return after.get((name, ()), 0) - before.get((name, ()), 0)

    assert grew("tokenrouter_prompt_tokens_total") == sum(o["usage"]["prompt_tokens"] for o in outs)
    assert grew("tokenrouter_generation_tokens_total") == 32
    for h in ("tokenrouter_time_to_first_token_seconds", "tokenrouter_e2e_request_latency_seconds",
              "tokenrouter_request_queue_time_seconds"):
        assert grew(h + "_count") == 4, h
    assert grew("tokenrouter_inter_token_latency_seconds_count") >= 4
    assert after["tokenrouter_e2e_request_latency_seconds_sum", ()] > before.get(
        ("tokenrouter_e2e_request_latency_seconds_sum", ()), 0)
    for w in ("slm", "llm"):  # per writer: its tokens, its handoffs, its batch sizes
        assert after["tokenrouter_tokens_written_total", (("model", w),)] > 0
        assert after["tokenrouter_batch_size_count", (("model", w),)] > 0
