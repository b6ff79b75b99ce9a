"""The HTTP frontend on one served program: OpenAI compatibility, streaming, bad requests,
aborts, failures, metrics. Real uvicorn, real subserver processes."""

import asyncio
import time

import httpx
import pytest

import tiny
from serving import ServerThread, complete_many, stream_completion
from tokenrouter.runtime.launcher import LaunchOptions


@pytest.fixture(scope="module")
def srv(pair):
    s = ServerThread(tiny.rstitch(pair, 0.25), LaunchOptions(mode="process", num_blocks=64, concurrency=8, test_hooks=True),
                     name="tiny", max_tokens_limit=200)
    yield s
    try:  # whatever the tests did (aborts, failures), every block came back
        assert s.wait_blocks_free() == {"slm": 0, "llm": 0}
    finally:
        s.close()


def _post(srv, path, body, **kw):
    return httpx.post(srv.url + path, json=body, timeout=60, **kw)


def test_models_and_health(srv):
    r = httpx.get(srv.url + "/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    models = httpx.get(srv.url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny"]


def test_openai_client_completion_and_chat(srv):
    import openai
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused")
    c = client.completions.create(model="tiny", prompt="Hello there", max_tokens=12, temperature=0)
    assert c.choices[0].finish_reason in ("stop", "length")
    extra = c.model_extra or {}
    assert sum(extra["tokens_by_model"].values()) == c.usage.completion_tokens
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=10, temperature=0)
    assert chat.choices[0].message.role == "assistant"
    assert isinstance(chat.choices[0].message.content, str)
    # streamed chat through the official client gives the same text
    parts = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=10, temperature=0, stream=True)
    text = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
    assert text == chat.choices[0].message.content


@pytest.mark.parametrize("prompt", ["Hello world, stream me", "x", "Some more text ü é 漢字"])
def test_streaming_returns_the_same_text_as_non_streaming(srv, prompt):
    body = {"prompt": prompt, "max_tokens": 24, "temperature": 0}
    full = _post(srv, "/v1/completions", body).json()
    text, ids, chunks = stream_completion(srv.url, {**body, "stream_options": {"include_usage": True}})
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == full["usage"]
    chunks = chunks[:-1]
    assert ids == full["choices"][0]["token_ids"]
    assert text == full["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == full["choices"][0]["finish_reason"]
    assert chunks[-1]["tokens_by_model"] == full["tokens_by_model"]


BAD = [
    ("bad json", b'{"prompt": "hi", "max_tokens": ', "not valid JSON"),
    ("unknown model", {"model": "gpt-17", "prompt": "hi"}, "not served here"),
    ("max_tokens over the limit", {"prompt": "hi", "max_tokens": 201}, "over the limit"),
    ("max_tokens beyond the context", {"prompt": "hi", "max_tokens": 100000}, "over the limit"),
    ("prompt longer than the context", {"prompt": "word " * 200}, "longer than the context"),
    ("token id out of range", {"prompt": [1, 2, 999999]}, "outside the vocabulary"),
    ("wrong type", {"prompt": "hi", "max_tokens": "many"}, "max_tokens"),
    ("missing prompt", {"max_tokens": 3}, "prompt"),
    ("negative temperature", {"prompt": "hi", "temperature": -1}, "temperature"),
    ("empty prompt", {"prompt": ""}, "empty"),
    ("n > 1", {"prompt": "hi", "n": 3}, "n = 1"),
]


@pytest.mark.parametrize("name, body, message", BAD, ids=[b[0] for b in BAD])
def test_bad_requests_get_400_and_the_server_keeps_serving(srv, name, body, message):
    if isinstance(body, bytes):
        r = httpx.post(srv.url + "/v1/completions", content=body, headers={"content-type": "application/json"})
    else:
        r = _post(srv, "/v1/completions", body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert message in err["message"] and err["type"] == "invalid_request_error"
    ok = _post(srv, "/v1/completions", {"prompt": "still alive?", "max_tokens": 4, "temperature": 0})
    assert ok.status_code == 200


def test_bad_chat_request(srv):
    r = _post(srv, "/v1/chat/completions", {"model": "tiny", "messages": []})
    assert r.status_code == 400
    r = _post(srv, "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]})
    assert r.status_code == 400


def test_client_disconnect_mid_stream_aborts_and_frees_kv(srv):
    before = srv.fe.finished.get("abort", 0)
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        with c.stream("POST", "/v1/completions",
                      json={"prompt": "a long one", "max_tokens": 150, "temperature": 0, "stream": True,
                            "ignore_eos": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    break  # one token arrived: the request is running; now hang up
    deadline = time.monotonic() + 10
    while srv.fe.finished.get("abort", 0) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.fe.finished.get("abort", 0) == before + 1
    assert srv.wait_blocks_free() == {"slm": 0, "llm": 0}


def test_a_failing_step_ends_its_requests_with_an_error_not_a_hang(srv):
    srv.call(srv.fe.debug_fail("llm", 1))
    async def run():
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
            rs = await asyncio.gather(*(c.post("/v1/completions", json={
                "prompt": f"fail {i}", "max_tokens": 40, "temperature": 0, "ignore_eos": True}) for i in range(6)))
            return rs
    rs = asyncio.run(run())
    codes = sorted(r.status_code for r in rs)
    assert 500 in codes, codes  # the requests in the failed step ended with an error
    for r in rs:
        if r.status_code == 500:
            assert "injected step failure" in r.json()["error"]["message"]
    assert srv.wait_blocks_free() == {"slm": 0, "llm": 0}
    ok = _post(srv, "/v1/completions", {"prompt": "after", "max_tokens": 4, "temperature": 0})
    assert ok.status_code == 200


def test_metrics_show_handoffs_both_ways_and_the_deployment(srv):
    asyncio.run(complete_many(srv.url, [f"m {i}" for i in range(8)], 8, max_tokens=16, temperature=0))
    text = httpx.get(srv.url + "/metrics").text
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    assert samples['tokenrouter_handoffs_out_total{model="slm",peer="llm"}'] > 0
    assert samples['tokenrouter_handoffs_out_total{model="llm",peer="slm"}'] > 0
    assert samples['tokenrouter_handoffs_in_total{model="llm",peer="slm"}'] > 0
    for w in ("slm", "llm"):
        assert samples[f'tokenrouter_threads{{model="{w}"}}'] >= 1
        assert samples[f'tokenrouter_tokens_written_total{{model="{w}"}}'] > 0
        assert f'tokenrouter_kv_blocks_free{{model="{w}"}}' in samples
        assert samples[f'tokenrouter_batch_size_count{{model="{w}"}}'] > 0
        assert f'tokenrouter_queue_wait_seconds_bucket{{model="{w}",le="+Inf"}}' in samples
        assert f'tokenrouter_step_phase_seconds_total{{model="{w}",phase="forward"}}' in samples
    assert "# TYPE tokenrouter_batch_size histogram" in text
