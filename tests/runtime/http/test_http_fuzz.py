"""No body gets a 5xx: 2,400 fuzzed bodies (JSON that parses, with every field of either
endpoint given values of every type, nested, huge, empty, unknown fields, message keys and
content parts of every shape, chat template variables, stop ids past the limit once the
server adds its end-of-sequence id), half of them streamed, against the real server with
real subserver processes. Every answer is a 2xx or a 4xx (a stream carries no server
error), the server keeps serving, and every KV block comes back."""

import asyncio
import json

import httpx
import pytest

from tests.helpers import tiny
from tests.helpers.fuzz import N_BODIES, bodies
from tests.helpers.serving import served
from tokenrouter.protocol.sampling import MAX_STOP_IDS
from tokenrouter.runtime.launch import LaunchOptions

pytestmark = pytest.mark.slow  # every test here takes seconds: the fast tier (-m "not slow") skips them


@pytest.fixture(scope="module")
def srv(pair):
    with served(tiny.coin(pair, 0.3), LaunchOptions(mode="process", num_blocks=400, concurrency=8),
                max_tokens_limit=8) as s:
        yield s


def test_fuzzed_bodies_get_no_5xx_and_the_server_keeps_serving(srv):
    sent = bodies()
    codes: dict[int, int] = {}
    bad: list = []

    async def run():
        sem = asyncio.Semaphore(16)
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
            async def one(path, b):
                async with sem:
                    r = await c.post(path, content=json.dumps(b), headers={"content-type": "application/json"})
                    text = r.text
                    codes[r.status_code] = codes.get(r.status_code, 0) + 1
                    if r.status_code >= 500 or (r.status_code == 200 and '"server_error"' in text):
                        bad.append((path, b, r.status_code, text[:300]))
            await asyncio.gather(*(one(p, b) for p, b in sent))

    asyncio.run(run())
    print(f"\n{N_BODIES} fuzzed bodies: {dict(sorted(codes.items()))}")
    assert not bad, bad[:5]
    assert sum(n for c, n in codes.items() if c == 200) > 100 and sum(n for c, n in codes.items() if c == 400) > 100
    ok = httpx.post(srv.url + "/v1/completions", json={"prompt": "still here", "max_tokens": 4}, timeout=30)
    assert ok.status_code == 200
    assert srv.wait_blocks_free() == {"slm": 0, "llm": 0}


@pytest.mark.parametrize("text", [5, None, ["a"], {"x": 1}, True])
def test_a_content_part_whose_text_is_not_a_string_is_a_400(srv, text):
    for stream in (False, True):
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=30, json={
            "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}], "max_tokens": 2,
            "stream": stream})
        assert r.status_code == 400 and "string" in r.json()["error"]["message"], r.text


def test_stop_ids_at_the_limit_plus_the_servers_eos_are_a_400_streamed_or_not(srv):
    ids = [i for i in range(3, 259)] * 4  # 1,024 ids without the end-of-sequence id
    assert len(ids) == MAX_STOP_IDS and tiny.EOS not in ids
    for stream in (False, True):
        r = httpx.post(srv.url + "/v1/completions", timeout=30, json={
            "prompt": "x", "max_tokens": 2, "stop_token_ids": ids, "stream": stream})
        assert r.status_code == 400 and "stop_token_ids" in r.text, r.text
