"""The HTTP frontend on one served program: OpenAI compatibility, streaming, bad requests,
aborts, failures, metrics. Real uvicorn, real subserver processes."""

import asyncio
import threading
import time

import httpx
import pytest

from tests.helpers import tiny
from tests.helpers.serving import complete_many, scrape, served, stream_completion
from tokenrouter.protocol.sampling import SamplingParams
from tokenrouter.runtime.launch import LaunchOptions
from tokenrouter.runtime.http.app import Limits
from tokenrouter.runtime.reference import Reference

LIMITS = Limits(max_body_bytes=2 << 20)  # the tests below retune it on the running server


@pytest.fixture(scope="module")
def srv(pair):
    with served(tiny.rstitch(pair, 0.25), LaunchOptions(mode="process", num_blocks=64, concurrency=8, test_hooks=True),
                blocks_back=True, name="tiny", max_tokens_limit=200, limits=LIMITS) as s:
        yield s


def _post(srv, path, body, **kw):
    return httpx.post(srv.url + path, json=body, timeout=60, **kw)


@pytest.mark.slow
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
    ("n out of range", {"prompt": "hi", "n": 0}, "n"),
    ("huge seed", {"prompt": "hi", "seed": 1208925819614629174706176}, "seed"),
    ("lone surrogate", b'{"prompt": "\\ud800", "max_tokens": 2}', "not valid Unicode"),
    ("lone surrogate in a list", b'{"prompt": ["a\\udfffb"]}', "not valid Unicode"),
    ("tools", {"prompt": "hi", "tools": [{"type": "function", "function": {"name": "f"}}]}, "chat/completions only"),
    ("response_format", {"prompt": "hi", "response_format": {"type": "yaml"}}, "response_format"),
    ("a schema that does not compile", {"prompt": "hi", "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frob"}}}}, "frob"),
    ("beam search", {"prompt": "hi", "use_beam_search": True}, "beam search"),
    ("stream_options without stream", {"prompt": "hi", "stream_options": {"include_usage": True}},
     "only allowed when stream"),
    ("logit_bias outside the vocabulary", {"prompt": "hi", "logit_bias": {"999999": 1}}, "outside the vocabulary"),
    ("echo with logprobs", {"prompt": "hi", "echo": True, "logprobs": 1}, "prompt logprobs"),
    ("too many stop ids", {"prompt": "hi", "stop_token_ids": [1] * 5000}, "stop_token_ids"),
    ("too many stop ids with the eos ids", {"prompt": "hi", "max_tokens": 4, "stop_token_ids": [1] * 1024},
     "invalid sampling parameters: stop_token_ids"),
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
    r = _post(srv, "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}], "max_tokens": 2,
                                            "return_prompt_text": True})  # a custom role: the template's to render
    assert r.status_code == 200 and r.json()["prompt_text"].startswith("<|im_start|>wizard\nx<|im_end|>")
    r = _post(srv, "/v1/chat/completions", {"messages": [{"role": "", "content": "x"}]})
    assert r.status_code == 400
    r = httpx.post(srv.url + "/v1/chat/completions", content=b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid Unicode" in r.json()["error"]["message"]
    r = _post(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                            "tools": [{"type": "function", "function": {"nom": "f"}}]})
    assert r.status_code == 400 and "tools" in r.json()["error"]["message"]
    r = _post(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                            "response_format": {"type": "json_schema"}})
    assert r.status_code == 400 and "response_format" in r.json()["error"]["message"]
    ok = _post(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                             "response_format": {"type": "text"}})
    assert ok.status_code == 200


def test_a_body_over_the_limit_gets_413_before_it_is_parsed(srv):
    big = b'{"prompt": "' + b"a" * (LIMITS.max_body_bytes + 10) + b'"}'
    r = httpx.post(srv.url + "/v1/completions", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]

    def chunks():  # no Content-Length: counted while it is read
        for _ in range(LIMITS.max_body_bytes // 65536 + 2):
            yield b"x" * 65536
    r = httpx.post(srv.url + "/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert _post(srv, "/v1/completions", {"prompt": "fine", "max_tokens": 2}).status_code == 200


@pytest.mark.slow
def test_health_answers_fast_while_large_requests_are_handled(srv):
    """The largest prompt the body limit lets through, as text and as a chat message, sent
    over and over while /health is timed: tokenising never blocks the event loop."""
    text = "word " * (LIMITS.max_body_bytes // 5 - 100)
    stop = threading.Event()
    codes = []

    def hammer():
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            while not stop.is_set():
                codes.append(c.post("/v1/completions", json={"prompt": text, "max_tokens": 2}).status_code)
                codes.append(c.post("/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": text}], "max_tokens": 2}).status_code)

    t = threading.Thread(target=hammer)
    t.start()
    lat = []
    try:
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            end = time.monotonic() + 3
            while time.monotonic() < end:
                t0 = time.perf_counter()
                assert c.get("/health").status_code == 200
                lat.append(time.perf_counter() - t0)
                time.sleep(0.02)
    finally:
        stop.set()
        t.join(60)
    assert codes and set(codes) == {400}, codes  # longer than the context: refused, not a 500
    lat.sort()
    assert lat[len(lat) // 2] < 0.1 and lat[int(len(lat) * 0.9)] < 0.1, lat[-5:]


def test_queue_limit_gives_503_with_retry_after_and_admitted_requests_finish(srv):
    LIMITS.max_running, LIMITS.max_queue = 1, 1
    try:
        async def run():
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
                return await asyncio.gather(*(c.post("/v1/completions", json={
                    "prompt": f"q {i}", "max_tokens": 60, "temperature": 0, "ignore_eos": True}) for i in range(5)))
        rs = asyncio.run(run())
    finally:
        LIMITS.max_running, LIMITS.max_queue = Limits().max_running, Limits().max_queue
    codes = sorted(r.status_code for r in rs)
    assert codes == [200, 200, 503, 503, 503], codes
    for r in rs:
        if r.status_code == 503:
            assert r.headers["retry-after"] == str(LIMITS.retry_after_s)
            assert "capacity" in r.json()["error"]["message"]
    assert srv.wait_blocks_free() == {"slm": 0, "llm": 0}


def test_a_request_over_its_deadline_gets_504_and_frees_its_kv(srv):
    # 200 tokens take well over 50 ms through two subservers (each token is at least a step
    # and a ZeroMQ round trip); 0.3 s was no longer enough once the tiny models' steps got faster
    LIMITS.request_timeout_s = 0.05
    try:
        r = _post(srv, "/v1/completions", {"prompt": "slow", "max_tokens": 200, "ignore_eos": True})
        text, _, chunks = stream_completion(srv.url, {"prompt": "slow", "max_tokens": 200, "ignore_eos": True})
    finally:
        LIMITS.request_timeout_s = None
    assert r.status_code == 504 and "did not finish within" in r.json()["error"]["message"]
    assert chunks[-1]["error"]["type"] == "timeout"
    assert srv.wait_blocks_free() == {"slm": 0, "llm": 0}


def test_the_paths_without_v1_serve_the_same_handlers(srv):
    body = {"prompt": "paths", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    with_v1, bare = _post(srv, "/v1/completions", body).json(), _post(srv, "/completions", body).json()
    assert bare["object"] == "text_completion" and bare["choices"][0]["token_ids"] == with_v1["choices"][0]["token_ids"]
    chat = {"messages": [{"role": "user", "content": "paths"}], "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    with_v1, bare = _post(srv, "/v1/chat/completions", chat).json(), _post(srv, "/chat/completions", chat).json()
    assert bare["object"] == "chat.completion"
    assert bare["choices"][0]["message"] == with_v1["choices"][0]["message"]
    assert httpx.get(srv.url + "/models").json() == httpx.get(srv.url + "/v1/models").json()
    assert httpx.get(srv.url + "/models/tiny").json()["id"] == "tiny"
    assert _post(srv, "/chat/completions", {"messages": []}).status_code == 400  # the same checks
    import openai
    client = openai.OpenAI(base_url=srv.url, api_key="unused")  # a base URL without /v1
    got = client.chat.completions.create(model="tiny", messages=chat["messages"], max_tokens=6, temperature=0,
                                         extra_body={"ignore_eos": True})
    assert got.choices[0].message.content == with_v1["choices"][0]["message"]["content"]


def test_api_key_guards_the_api_but_not_health_or_the_model_list(srv):
    LIMITS.api_key = "sekrit"
    try:
        body = {"prompt": "key", "max_tokens": 2}
        assert _post(srv, "/v1/completions", body).status_code == 401
        bad = _post(srv, "/v1/completions", body, headers={"authorization": "Bearer nope"})
        assert bad.status_code == 401 and bad.json()["error"]["code"] == "invalid_api_key"
        assert _post(srv, "/v1/completions", body, headers={"authorization": "Bearer sekrit"}).status_code == 200
        assert _post(srv, "/tokenize", {"prompt": "hi"}).status_code == 401
        assert _post(srv, "/completions", body).status_code == 401  # the paths without /v1 too
        assert _post(srv, "/chat/completions", {"messages": [{"role": "user", "content": "k"}]}).status_code == 401
        assert httpx.get(srv.url + "/models").status_code == 200
        assert httpx.get(srv.url + "/health").status_code == 200
        assert httpx.get(srv.url + "/v1/models").status_code == 200  # public, as in llama-server
        assert httpx.get(srv.url + "/v1/models/tiny").status_code == 200
        import openai
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="sekrit")
        assert client.completions.create(model="tiny", prompt="key", max_tokens=2).choices
    finally:
        LIMITS.api_key = None


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


@pytest.mark.slow
def test_metrics_show_handoffs_both_ways_and_the_deployment(srv):
    asyncio.run(complete_many(srv.url, [f"m {i}" for i in range(8)], 8, max_tokens=16, temperature=0))
    r = httpx.get(srv.url + "/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    samples = scrape(r.text)
    assert samples["tokenrouter_handoffs_out_total", (("model", "slm"), ("peer", "llm"))] > 0
    assert samples["tokenrouter_handoffs_out_total", (("model", "llm"), ("peer", "slm"))] > 0
    assert samples["tokenrouter_handoffs_in_total", (("model", "llm"), ("peer", "slm"))] > 0
    for w in ("slm", "llm"):
        m = (("model", w),)
        assert samples["tokenrouter_threads", m] >= 1
        assert samples["tokenrouter_tokens_written_total", m] > 0
        assert ("tokenrouter_kv_blocks_free", m) in samples
        assert samples["tokenrouter_batch_size_count", m] > 0
        assert ("tokenrouter_queue_wait_seconds_bucket", (("le", "+Inf"), ("model", w))) in samples
        assert ("tokenrouter_step_phase_seconds_total", (("model", w), ("phase", "forward"))) in samples
    assert "# TYPE tokenrouter_batch_size histogram" in r.text


@pytest.fixture(scope="module")
def coin_srv(pair):
    """A program whose only rule is a fair coin (`bernoulli(0.5, 7)`, seeded by the request's route seed)."""
    with served(tiny.coin(pair, 0.5), LaunchOptions(mode="process", num_blocks=64, concurrency=8), blocks_back=True,
                name="coin") as s:
        yield s


def test_unseeded_requests_flip_their_own_route_coins_and_a_seed_makes_them_reproducible(coin_srv):
    """The coins of a program's random rules are seeded by the request's route seed: an
    unseeded request's comes from its request id, so requests with the same prompt hand off
    at different positions; a `seed` in the body is the route seed, so equal seeds hand off
    alike (and as the reference does with that route seed)."""
    body = {"max_tokens": 16, "temperature": 0, "ignore_eos": True}

    def writers(n, **extra):
        outs = asyncio.run(complete_many(coin_srv.url, ["the same prompt"] * n, 4, **body, **extra))
        return [tuple(o["choices"][0]["token_writers"]) for o in outs]

    unseeded = writers(4)
    assert all("llm" in w for w in unseeded), unseeded  # the coin comes up
    assert len(set(unseeded)) > 1, unseeded  # ... at positions of each request's own
    seeded = writers(3, seed=5)
    assert len(set(seeded)) == 1, seeded
    ids = coin_srv.tokenizer.encode("the same prompt")
    want = Reference(coin_srv.program).generate(ids, SamplingParams(max_tokens=16), route_seed=5)
    assert seeded[0] == tuple(want.writers)
