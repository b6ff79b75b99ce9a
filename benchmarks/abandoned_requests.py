"""A 10-token request's latency before and after 16 abandoned streaming requests (vLLM's
recovery check), against a running `tokenrouter serve` (URL, default http://127.0.0.1:8011),
with the KV and queue gauges from /metrics right after the abandon. Prints JSON last."""
import asyncio, json, os, subprocess, sys, time
import httpx

URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8011"
BODY = {"prompt": "The capital of France is", "max_tokens": 10, "temperature": 0, "ignore_eos": True}

def timed():
    t0 = time.perf_counter()
    r = httpx.post(URL + "/v1/completions", json=BODY, timeout=120)
    assert r.status_code == 200, r.text
    return time.perf_counter() - t0

def gauges():
    out = {}
    for line in httpx.get(URL + "/metrics", timeout=30).text.splitlines():
        if line.startswith(("tokenrouter_kv_blocks_used", "tokenrouter_pending_requests", "tokenrouter_ready_requests", "tokenrouter_requests_running", "tokenrouter_requests_total")):
            k, v = line.rsplit(" ", 1); out[k] = float(v)
    return out

async def abandon(n=16):
    async with httpx.AsyncClient(base_url=URL, timeout=120) as c:
        async def one(i):
            async with c.stream("POST", "/v1/completions", json={"prompt": f"Tell me a long story number {i}", "max_tokens": 200, "stream": True, "ignore_eos": True}) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        return
        await asyncio.gather(*(one(i) for i in range(n)))

before = [timed() for _ in range(3)]
print("before", [round(x, 2) for x in before], flush=True)
t0 = time.perf_counter(); asyncio.run(abandon()); print("abandon took", round(time.perf_counter() - t0, 2), flush=True)
print(gauges(), flush=True)
after = []
for _ in range(4):
    after.append(timed()); print("after", round(after[-1], 2), gauges(), flush=True)
print(json.dumps({"before": before, "after": after}))
