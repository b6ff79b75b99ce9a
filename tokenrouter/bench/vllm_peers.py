"""Stock vLLM servers as benchmark peers (the `vllm` extra): what a user who serves the
large model with vLLM deploys instead of tokenrouter.

`VllmServer` runs vLLM's own OpenAI-compatible server (`vllm serve`'s module) in a child
process on a loopback port, one model, its CPU worker bound to the cores given. Two peers
are built on it, each started once for the whole run (a vLLM server takes any
concurrency up to its `--max-num-seqs`):

- `VllmLarge` (`vllm_large`): the large model alone on one server, each request one
  `/v1/completions` call of `max_tokens` tokens at the level's concurrency.
- `VllmStandard` (`vllm_std`): "standard serving" from stock vLLM: one server per model,
  prefix caching on (with vLLM's smallest CPU block, 32 tokens, so a returning request
  reuses as much of its context as vLLM can), and the per-token dispatcher of
  `dispatch.py`: one-token calls with the top-20 log-probabilities, routed by the
  program's IR interpreter.

Both send token ids and read token ids back (`return_token_ids`, and the top
log-probabilities as `token_id:N`), greedy with stop tokens ignored, as the workload asks.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time

from tokenrouter.compiler.backend.compiled import default_base_dir
from tokenrouter.compiler.backend.interpreter import Interpreter
from tokenrouter.protocol.sampling import SamplingParams

from tokenrouter.bench.deploy import Measurement
from tokenrouter.bench.dispatch import check_dispatchable, route_request, run_dispatched, timed_all
from tokenrouter.bench.llamacpp import LoopThread

TOP_N = 20


def cpu_sets(cores: int, parts: int, threads: int) -> list[str]:
    """`parts` disjoint sets of `threads` cores each (as far as the machine's cores go), as
    `VLLM_CPU_OMP_THREADS_BIND` writes them."""
    out = []
    for i in range(parts):
        first = (i * threads) % max(1, cores)
        ids = [(first + k) % max(1, cores) for k in range(max(1, threads))]
        out.append(",".join(str(c) for c in sorted(set(ids))))
    return out


class VllmServer:
    """One stock vLLM server process on 127.0.0.1, stopped by `close`."""

    def __init__(self, folder: str, name: str, dtype: str, cpus: str, max_model_len: int, max_num_seqs: int,
                 prefix_caching: bool, timeout: float = 900.0):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.name, self.cpus, self.url = name, cpus, f"http://127.0.0.1:{port}"
        self.threads = len(cpus.split(","))
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", folder,
               "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
               "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs), "--enforce-eager",
               "--max-logprobs", str(TOP_N), "--block-size", "32", "--disable-uvicorn-access-log",
               "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching"]
        env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": cpus, "VLLM_CPU_KVCACHE_SPACE": "1",
               "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the stock server, as a user runs it
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"vllm-{name}-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        try:
            self._wait_ready(timeout)
        except BaseException:  # an interrupt (Ctrl-C, a test's timeout) too: no server outlives the bench
            self.close()
            raise

    def _wait_ready(self, timeout: float) -> None:
        import httpx
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        self.log.seek(0)
        tail = self.log.read()[-2000:]
        self.close()
        raise RuntimeError(f"vLLM server for {self.name} did not start within {timeout:.0f} s:\n{tail}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()


def completion_body(name: str, tokens: list[int], max_tokens: int, sampling: SamplingParams,
                    logprobs: int | None) -> dict:
    body = {"model": name, "prompt": list(tokens), "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": not sampling.stop_token_ids, "return_token_ids": True}
    if sampling.stop_token_ids:
        body["stop_token_ids"] = list(sampling.stop_token_ids)
    if logprobs is not None:
        body |= {"logprobs": logprobs, "return_tokens_as_token_ids": True}
    return body


class VllmLarge:
    """`vllm_large`: one server, each request a single completion of max_tokens."""

    def __init__(self, folder: str, dtype: str, threads: int, max_model_len: int, max_num_seqs: int):
        cores = os.cpu_count() or 1
        self.server = VllmServer(folder, "large", dtype, cpu_sets(cores, 1, threads)[0], max_model_len,
                                 max_num_seqs, prefix_caching=False)
        self._loop = LoopThread()

    def measure(self, name: str, prompts, sampling: SamplingParams, concurrency: int, batch=None) -> Measurement:
        return self._loop.call(self._run(name, prompts, sampling, concurrency))

    async def _run(self, name, prompts, sampling, concurrency):
        import httpx
        sem = asyncio.Semaphore(concurrency)
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=self.server.url, limits=limits, timeout=1800.0) as client:
            async def one(_, p, __):
                r = await client.post("/v1/completions", json=completion_body(
                    "large", p, sampling.max_tokens, sampling, None))
                r.raise_for_status()
                return r.json()["choices"][0]["token_ids"]

            outs, wall = await timed_all(prompts, lambda: sem, one)
        toks = [t for t, _ in outs]
        return Measurement(name, concurrency, wall, sum(map(len, toks)), [lat for _, lat in outs],
                           {"large": sum(map(len, toks))}, toks, threads={"large": self.server.threads})

    def close(self):
        self._loop.stop()
        self.server.close()


class VllmStandard:
    """`vllm_std`: one stock vLLM server per model, prefix caching on, a per-token dispatcher."""

    def __init__(self, program, folders: dict[str, str], max_model_len: int, max_num_seqs: int, vocab: int):
        check_dispatchable(program, "vllm_std")
        self.program, self.vocab = program, vocab
        self.interp = Interpreter(program, default_base_dir(program))
        cores = os.cpu_count() or 1
        sets = cpu_sets(cores, len(program.models), max(1, cores // len(program.models)))
        self.servers: dict[str, VllmServer] = {}
        try:
            for m, cpus in zip(program.models, sets):
                self.servers[m.name] = VllmServer(folders[m.name], m.name, m.dtype, cpus, max_model_len,
                                                  max_num_seqs, prefix_caching=True)
        except BaseException:
            self.close()
            raise
        self._loop = LoopThread()

    def measure(self, name: str, prompts, sampling: SamplingParams, concurrency: int, batch=None) -> Measurement:
        return self._loop.call(self._run(name, prompts, sampling, concurrency))

    async def _run(self, name, prompts, sampling, concurrency):
        import httpx
        sem = asyncio.Semaphore(concurrency)

        async def request(call, i, p, _):
            async def next_token(writer: str, tokens: list[int]):
                r = await call(writer, lambda client: client.post(
                    "/v1/completions", json=completion_body(writer, tokens, 1, sampling, TOP_N)))
                r.raise_for_status()
                ch = r.json()["choices"][0]
                top = ch["logprobs"]["top_logprobs"][0] if ch.get("logprobs") else None
                return int(ch["token_ids"][0]), (None if not top else [
                    {"id": int(k.split(":", 1)[1]), "logprob": v} for k, v in top.items()])

            toks, written, _ = await route_request(self.interp, self.program.start, self.vocab, next_token,
                                                   list(p), sampling, route_seed=i)
            return toks, written

        return await run_dispatched(httpx, name, concurrency, prompts, self.servers, lambda: sem, request)

    def close(self):
        if hasattr(self, "_loop"):
            self._loop.stop()
        for s in self.servers.values():
            s.close()
