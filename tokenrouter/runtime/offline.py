"""The offline API: load a `.route` file and generate for a list of prompts, like vLLM's
`LLM.generate`, on the same subservers `serve` runs.

    from tokenrouter.runtime.offline import LLM, SamplingParams
    with LLM("examples/demo.route") as llm:
        outs = llm.generate(["Hello", "The capital of France is"], SamplingParams(max_tokens=32))
    print(outs[0].text, outs[0].tokens_by_model)

The runtime lives in a private asyncio loop on a background thread, so `generate` is an
ordinary blocking call (with a tqdm progress bar) that also works inside notebooks.

`SamplingParams` is `protocol.sampling`'s, validated when it is made; `generate` adds the
tokenizer's end-of-sequence ids to its stop ids (`SamplingParams.with_eos`, as the HTTP
API does) unless `ignore_eos`; its stop strings end a request as over HTTP
(`frontend/text.py`), and `text` leaves them out. A request's route seed (the seed of the
program's coin flips) is `route_seeds[i]` when given, else the prompt's index i: coin-flip
rules are independent across the prompts of a call, and a run is reproducible.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

from tqdm.auto import tqdm

from tokenrouter.compiler import ir
from tokenrouter.compiler.pipeline import load_program
from tokenrouter.protocol.sampling import SamplingParams
from tokenrouter.runtime.frontend.frontend import Delta
from tokenrouter.runtime.launch import LaunchOptions, close_runtime, open_runtime
from tokenrouter.runtime.loader import model_facts, program_tokenizer

__all__ = ["LLM", "RequestOutput", "SamplingParams"]


@dataclass
class RequestOutput:
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str  # stop | length | abort | error
    tokens_by_model: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    token_writers: list[str] = field(default_factory=list)  # the writer of each of token_ids


class LLM:
    """A running deployment of one routing program (subservers + frontend)."""

    def __init__(self, program: str | ir.Program, model_paths: dict[str, str] | None = None,
                 launch=None, timeout: float = 300.0, params: dict[str, str] | None = None, **launch_kwargs):
        if isinstance(program, str):  # model_paths and params: the --model and --set of the commands
            program = load_program(program, model_paths=model_paths, params=params, model_facts=model_facts)
        self.program = program
        self.tokenizer = program_tokenizer(program)
        opts = launch or LaunchOptions(**launch_kwargs)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tokenrouter-offline", daemon=True)
        self._thread.start()
        try:
            self.launcher, self.frontend = self.call(open_runtime(program, opts, timeout))
        except BaseException:
            self._stop_loop()
            raise
        self._closed = False

    def call(self, coro, timeout: float | None = None):
        """Run a coroutine in the runtime's event loop and wait for its result (for code that
        drives `self.frontend` itself, as the bench's `RuntimeDeployment` does)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # ---------------------------------------------------------------- generate
    def generate(self, prompts: Sequence[str | list[int]] | str, params=None, *, concurrency: int | None = None,
                 use_tqdm: bool = True, ignore_eos: bool = False, route_seeds: Sequence[int] | None = None,
                 desc: str = "generate") -> list[RequestOutput]:
        """Generate for every prompt (text or token ids); outputs in prompt order.
        `concurrency` caps the requests in flight (default: all, as KV capacity allows);
        `route_seeds[i]` seeds prompt i's coin flips (default: i)."""
        if isinstance(prompts, str):
            prompts = [prompts]
        params = (params or SamplingParams()).with_eos(self.tokenizer.eos_token_ids, ignore_eos)
        ids = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        return self.call(self._run(list(prompts), ids, params, concurrency, use_tqdm, route_seeds, desc))

    async def _run(self, prompts, ids, params, concurrency, use_tqdm, route_seeds, desc) -> list[RequestOutput]:
        sem = asyncio.Semaphore(concurrency or len(ids) or 1)
        bar = tqdm(total=len(ids), desc=desc, unit="req", disable=not use_tqdm)

        async def one(i: int) -> RequestOutput:
            async with sem:
                toks: list[int] = []
                writers: list[str] = []
                text = ""
                final = None
                try:
                    seed = route_seeds[i] if route_seeds else i
                    async for ev in self.frontend.generate(ids[i], params, route_seed=seed, tokenizer=self.tokenizer):
                        if isinstance(ev, Delta):
                            toks += ev.tokens
                            writers += ev.writers
                            text += ev.text
                        else:
                            final = ev
                            text += ev.text
                except ValueError as exc:
                    bar.update(1)
                    return RequestOutput(prompts[i] if isinstance(prompts[i], str) else None, ids[i], [], "",
                                         "error", {}, str(exc))
                bar.update(1)
                return RequestOutput(prompts[i] if isinstance(prompts[i], str) else None, ids[i], toks, text,
                                     final.reason, dict(final.written_by), final.error, writers)

        try:
            return list(await asyncio.gather(*(one(i) for i in range(len(ids)))))
        finally:
            bar.close()

    def stats(self, timeout: float = 5.0) -> dict[str, dict[str, Any]]:
        """Counters of every subserver (see metrics.py)."""
        return self.call(self.frontend.stats(timeout=timeout))

    # ------------------------------------------------------------------- life
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.call(close_runtime(self.launcher, self.frontend), timeout=60)
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
