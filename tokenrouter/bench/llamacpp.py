"""Stock llama.cpp servers as benchmark peers: what a user deploys instead of tokenrouter.

`LlamaCppServer` runs upstream llama.cpp's HTTP server (the `xllamacpp` wheel, the `bench`
extra) in a child process on a loopback port, one GGUF model, `--parallel` slots with
continuous batching. The wheel is one build for every x86 CPU (AVX2); given a `llama-server`
binary built on the host (`tokenrouter bench --llama-server PATH`) it runs that instead, the
same server with every instruction set the CPU has. Either way `build` is the server's
`system_info` line. Two peers are built on it:

- `LlamaCppLarge` (`llamacpp_large`): the large model alone on one server, each request one
  `/completion` call at the same concurrency: what a user runs who does not route at all.
- `LlamaCppStandard` (`llamacpp_std`): the paper's "standard serving": one stock server per
  model and an external dispatcher (asyncio, one keep-alive `httpx` client per server) that
  sends each request one token at a time (`n_predict 1`, `cache_prompt`, the request's slot)
  to the model that currently writes, and applies the routing program to the server's
  top-20 probabilities (`n_probs`), as `dispatch.py` does for every such peer. Each slot's
  KV stays on its server between calls, so a returning request re-processes only the
  tokens the other model wrote meanwhile.

Both serve the weights our engine runs (`peer_gguf`): a model our engine runs as a GGUF's own
blocks (`quant = native`, e.g. the Qwen2.5-Coder pair) is served from that very file; any other
is exported by `runtime.loader.gguf_export` as float32, the numbers our engine starts from.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import asynccontextmanager
from typing import Any

from tokenrouter.compiler.backend.compiled import default_base_dir
from tokenrouter.compiler.backend.interpreter import Interpreter
from tokenrouter.extras import require
from tokenrouter.protocol.sampling import SamplingParams
from tokenrouter.runtime.loader.gguf_export import exported_gguf
from tokenrouter.runtime.loader.resolve import native_gguf

from tokenrouter.bench.deploy import Measurement
from tokenrouter.bench.dispatch import check_dispatchable, route_request, run_dispatched, timed_all


def peer_gguf(model) -> str:
    """The GGUF file llama.cpp serves for `model` (an IR model): the file itself when our engine
    runs its blocks as they are (`quant = native`), else a float32 export (built once, cached)."""
    if model.quant == "native":
        return native_gguf(model.path)
    return exported_gguf(model.path)


TOP_N = 20  # probabilities a dispatcher asks for (the full row costs ~0.6 s a token to serialise)


class LlamaCppServer:
    """One llama.cpp server process on 127.0.0.1 (the wheel's, or `binary`), stopped by `close`."""

    def __init__(self, gguf: str, parallel: int, threads: int, ctx_per_slot: int, timeout: float = 120.0,
                 binary: str | None = None):
        self.gguf, self.parallel, self.threads = gguf, parallel, threads
        self.log = None
        self.build = None  # the server's system_info line
        if binary:
            self._start_binary(binary, parallel * ctx_per_slot, timeout)
            return
        require("bench", "xllamacpp", "the llama.cpp peers")
        cmd = [sys.executable, "-m", "tokenrouter.bench.llamacpp_server", gguf, "--parallel", str(parallel),
               "--threads", str(threads), "--ctx", str(parallel * ctx_per_slot)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=dict(os.environ))
        try:
            self.url = self._wait_ready(timeout)
        except BaseException:  # an interrupt (Ctrl-C, a test's timeout) too: no server outlives the bench
            self.close()
            raise

    def _start_binary(self, binary: str, ctx: int, timeout: float) -> None:
        """`binary` (a llama-server) on a free loopback port, its log in a temporary file."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen([binary, "-m", self.gguf, "--parallel", str(self.parallel), "-c", str(ctx),
                                      "-t", str(self.threads), "-tb", str(self.threads), "--host", "127.0.0.1",
                                      "--port", str(port), "--cont-batching", "--metrics", "--slots"],
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.log.seek(0)
                    raise RuntimeError(f"{binary} for {self.gguf} did not start serving "
                                       f"(exit code {self.proc.poll()}): {self.log.read()[-1500:]}")
                try:
                    with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:  # not listening yet, or 503 while loading
                    pass
                time.sleep(0.2)
        except BaseException:
            self.close()
            raise
        self.build = server_build(binary)

    def _wait_ready(self, timeout: float) -> str:
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not sel.select(timeout=0.5):
                if self.proc.poll() is not None:
                    break
                continue
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith("BUILD "):
                self.build = line[6:].strip()
            if line.startswith("READY "):
                return line.split(" ", 1)[1].strip()
            if line.startswith("ERROR "):
                self.close()
                raise RuntimeError(f"llama.cpp server for {self.gguf}: {line[6:].strip()}")
        self.close()
        raise RuntimeError(f"llama.cpp server for {self.gguf} did not start within {timeout:.0f} s")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                if self.proc.stdin:
                    self.proc.stdin.close()  # the wheel's child exits when its stdin closes
                else:
                    self.proc.terminate()
                self.proc.wait(timeout=10)
            except (subprocess.TimeoutExpired, OSError):
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.log is not None:
            self.log.close()
            self.log = None


def llama_server_problem(path: str | None) -> str | None:
    """Why `path` cannot be a `--llama-server` binary, or None."""
    if path and os.path.isfile(path) and os.access(path, os.X_OK):
        return None
    return (f"--llama-server {path}: not an executable file" if path else "no --llama-server given") + \
        " (scripts/build-llama-server builds one for this host)"


@functools.lru_cache(maxsize=None)
def server_build(binary: str) -> str:
    """The `system_info` line of a llama-server binary (the instruction sets it was built
    with): it logs it at trace level before loading a model, so a run on no model says it
    and exits."""
    out = subprocess.run([binary, "-lv", "4", "-m", os.devnull, "--port", "1"], capture_output=True, text=True,
                         timeout=60)
    info = re.search(r"system_info:.*", out.stdout + out.stderr)
    return " ".join(info.group(0).split()) if info else f"{binary} (logged no system_info line)"


def completion_body(tokens: list[int], slot: int, n_predict: int, n_probs: int) -> dict[str, Any]:
    """A greedy `/completion` request on token ids, reusing the slot's cached prefix."""
    return {"prompt": tokens, "n_predict": n_predict, "temperature": 0.0, "top_k": 0, "top_p": 1.0,
            "min_p": 0.0, "repeat_penalty": 1.0, "cache_prompt": True, "id_slot": slot, "n_probs": n_probs,
            "return_tokens": True, "stream": False}


class LoopThread:
    """A private asyncio loop in a thread, for the synchronous `measure` interface."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


class _Slots:
    """Slot ids 0..N-1 handed to requests in flight (the same id on every server)."""

    def __init__(self, n: int):
        self.free = asyncio.Queue()
        for i in range(n):
            self.free.put_nowait(i)

    @asynccontextmanager
    async def take(self):
        """A free slot id for one request, back in the pool when the request ends."""
        slot = await self.free.get()
        try:
            yield slot
        finally:
            self.free.put_nowait(slot)


class LlamaCppLarge:
    """`llamacpp_large`: one server, each request a single `/completion` of max_tokens."""

    def __init__(self, gguf: str, parallel: int, threads: int, ctx_per_slot: int, binary: str | None = None):
        self.server = LlamaCppServer(gguf, parallel, threads, ctx_per_slot, binary=binary)
        self.build = self.server.build
        self.ggufs = {"large": os.path.basename(gguf)}
        self.name = "large"
        self._loop = LoopThread()

    def measure(self, name: str, prompts, sampling: SamplingParams, concurrency: int, batch=None) -> Measurement:
        return self._loop.call(self._run(name, prompts, sampling, concurrency))

    async def _run(self, name, prompts, sampling, concurrency):
        httpx = require("bench", "httpx", "the llama.cpp dispatcher")
        slots = _Slots(min(concurrency, self.server.parallel))
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=self.server.url, limits=limits, timeout=600.0) as client:
            async def one(_, p, slot):
                r = await client.post("/completion", json=dict(completion_body(
                    list(p), slot, sampling.max_tokens, 0), ignore_eos=not sampling.stop_token_ids))
                r.raise_for_status()
                return r.json()["tokens"]

            outs, wall = await timed_all(prompts, slots.take, one)
        toks = [t for t, _ in outs]
        return Measurement(name, concurrency, wall, sum(map(len, toks)), [lat for _, lat in outs],
                           {self.name: sum(map(len, toks))}, toks, threads={self.name: self.server.threads})

    def close(self):
        self._loop.stop()
        self.server.close()


class LlamaCppStandard:
    """`llamacpp_std`: one server per model and a per-token dispatcher running the program."""

    def __init__(self, program, ggufs: dict[str, str], parallel: int, threads: dict[str, int], ctx_per_slot: int,
                 vocab: int, binary: str | None = None):
        check_dispatchable(program, "llamacpp_std")
        self.program = program
        self.vocab = vocab
        self.interp = Interpreter(program, default_base_dir(program))
        self.servers: dict[str, LlamaCppServer] = {}
        try:
            for m in program.models:
                self.servers[m.name] = LlamaCppServer(ggufs[m.name], parallel, threads[m.name], ctx_per_slot,
                                                      binary=binary)
        except BaseException:
            self.close()
            raise
        self.build = next(iter(self.servers.values())).build
        self.ggufs = {m: os.path.basename(f) for m, f in ggufs.items()}
        self._loop = LoopThread()
        self.blind_steps = 0  # steps whose distribution the server did not return (counted, see _request)

    def measure(self, name: str, prompts, sampling: SamplingParams, concurrency: int, batch=None) -> Measurement:
        return self._loop.call(self._run(name, prompts, sampling, concurrency))

    async def _run(self, name, prompts, sampling, concurrency):
        httpx = require("bench", "httpx", "the llama.cpp dispatcher")
        slots = _Slots(min(concurrency, min(s.parallel for s in self.servers.values())))
        return await run_dispatched(httpx, name, concurrency, prompts, self.servers, slots.take,
                                    lambda call, i, p, slot: self._request(call, list(p), sampling, slot, route_seed=i))

    async def _request(self, call, prompt, sampling, slot, route_seed):
        """One request through `run_dispatched`'s `call`, on `slot` of every server."""
        async def next_token(writer: str, tokens: list[int]):
            r = await call(writer, lambda client: client.post("/completion", json=completion_body(tokens, slot, 1, TOP_N)))
            r.raise_for_status()
            body = r.json()
            probs = body.get("completion_probabilities")  # held back for a token that ends mid-UTF-8
            return int(body["tokens"][0]), probs[0]["top_logprobs"] if probs else None

        out, written, blind = await route_request(self.interp, self.program.start, self.vocab, next_token, prompt,
                                                  sampling, route_seed)
        self.blind_steps += blind
        return out, written

    def close(self):
        if hasattr(self, "_loop"):
            self._loop.stop()
        for s in self.servers.values():
            s.close()
