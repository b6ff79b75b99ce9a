"""Run the real HTTP app (uvicorn, real subserver processes) inside a test (`ServerThread`,
or `served` for a fixture), and talk to it;
and `tokenrouter serve` as a subprocess: its command (`CLI`), waiting for it to be healthy
and stopping it."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import asynccontextmanager, contextmanager

import httpx
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from tokenrouter.runtime.launch import LaunchOptions, close_runtime, open_runtime
from tokenrouter.runtime.http.app import Limits, build_app
from tokenrouter.runtime.http.connections import server_config
from tokenrouter.runtime.loader import program_tokenizer

CLI = [sys.executable, "-m", "tokenrouter.cli"]  # `tokenrouter` as a user runs it, from this interpreter


class ServerThread:
    """`tokenrouter serve` in a thread of the test process (subservers are processes)."""

    def __init__(self, program, opts: LaunchOptions, name: str = "test", liveness: dict | None = None, **app_kw):
        self.program = program
        self.tokenizer = program_tokenizer(program)
        self.fe = None
        self.launcher = None
        self.loop = None

        @asynccontextmanager
        async def runtime():
            self.launcher, self.fe = await open_runtime(program, opts, **(liveness or {}))
            self.loop = asyncio.get_running_loop()
            try:
                yield self.fe
            finally:
                await close_runtime(self.launcher, self.fe)

        app = build_app(runtime, name, self.tokenizer, **app_kw)
        self.connections = app.state.connections  # what the connection guard counted
        limits = app_kw.get("limits") or Limits()
        self.server = uvicorn.Server(server_config(app, "127.0.0.1", 0, "warning", limits.connections,
                                                   app.state.connections))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 120
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.05)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def call(self, coro, timeout=30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stats(self):
        return self.call(self.fe.stats())

    def blocks_used(self) -> dict[str, int]:
        return {w: s["blocks_used"] for w, s in self.stats().items()}

    def wait_blocks_free(self, timeout=10.0) -> dict[str, int]:
        """Releases are asynchronous: poll until every subserver is back to zero blocks."""
        deadline = time.monotonic() + timeout
        while True:
            used = self.blocks_used()
            if not any(used.values()) or time.monotonic() > deadline:
                return used
            time.sleep(0.05)

    def configure(self, writer, **kw):
        self.call(self.fe.configure(writer, **kw))

    def close(self):
        self.server.should_exit = True
        self.thread.join(60)


@contextmanager
def served(program, opts: LaunchOptions, *, blocks_back: bool = False, **kw) -> Iterator[ServerThread]:
    """A `ServerThread` (`kw` as it takes them) for the body of a `with` or of a fixture,
    closed when the body ends. With `blocks_back`, the end first asserts that every
    subserver has every KV block back, whatever the body did (aborts, failures)."""
    s = ServerThread(program, opts, **kw)
    try:
        yield s
        if blocks_back:
            assert s.wait_blocks_free() == dict.fromkeys(s.fe.writers, 0)
    finally:
        s.close()


async def complete_many(url: str, prompts: list, concurrency: int, **body) -> list[dict]:
    """POST /v1/completions for every prompt with at most `concurrency` in flight."""
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        async def one(p):
            async with sem:
                r = await client.post("/v1/completions", json={"prompt": p, **body})
                assert r.status_code == 200, r.text
                return r.json()
        return await asyncio.gather(*(one(p) for p in prompts))


def assert_outputs_equal(outs: list[dict], prompts: list, expected: dict) -> None:
    """Each completion (from `complete_many`) is the reference's output for its prompt
    (`expected[prompt]`, a `ReferenceOutput`): tokens, finish reason, tokens by writer."""
    for p, o in zip(prompts, outs):
        ch, r = o["choices"][0], expected[p]
        assert ch["token_ids"] == r.tokens, p
        assert ch["finish_reason"] == r.reason, p
        assert o["tokens_by_model"] == r.written_by, p
        assert o["usage"]["completion_tokens"] == len(r.tokens), p


def stream_completion(url: str, body: dict) -> tuple[str, list[int], list[dict]]:
    """Text, token ids and the parsed chunks of one streamed completion."""
    chunks = []
    with httpx.Client(base_url=url, timeout=60) as c:
        with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    break
                chunks.append(json.loads(data))
    text = "".join(ch["choices"][0]["text"] for ch in chunks if ch.get("choices"))
    ids = [t for ch in chunks if ch.get("choices") for t in ch["choices"][0].get("token_ids", [])]
    return text, ids, chunks


def wait_until_healthy(proc, url: str, timeout_s: float, poll_s: float = 0.2) -> None:
    """Wait for a `tokenrouter serve` subprocess to answer /health with 200; fail with its
    output if it exits first, or when `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, proc.stdout.read()
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the server did not come up"
        time.sleep(poll_s)


def stop(proc: subprocess.Popen, timeout_s: float) -> int:
    """Stop a `tokenrouter serve` subprocess as Ctrl-C does (SIGINT) and return its exit
    status; one still running after `timeout_s` is killed and the test fails
    (`subprocess.TimeoutExpired`)."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A /metrics text as {(sample name, sorted labels): value}, read by prometheus_client's parser."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The server's /metrics, read by `scrape`."""
    r = httpx.get(url + "/metrics", timeout=10)
    assert r.status_code == 200, r.text
    return scrape(r.text)
