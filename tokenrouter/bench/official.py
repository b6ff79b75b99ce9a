"""`official`: the algorithms' own serving style, as the CITER paper describes its loop
(written from that description, not from its code).

A static batch of requests advances one position at a time with Hugging Face `transformers`:
the small model writes the next token of every row it owns with `generate(max_new_tokens=1)`
(its KV cache carried from step to step), the routing program decides per row, and the
large model takes the rows handed to it with its own `generate(max_new_tokens=1)` over the
whole prefix, recomputed from scratch on every call (no KV cache for the large model). A
batch runs until its slowest row is done before the next batch starts; rows are
left-padded. The routing program is applied by the IR interpreter on the raw logits
`generate` returns, so its decisions are the ones our runtime makes.

The same loop serves every program whose rules read only the next-token distribution and
coins (CITER's and R2R's published serving is this shape: the small model steps the batch,
the large model is called on the rows that need it); Co-LLM's and R-Stitch's official code
also step token by token in `transformers`, so this loop stands for them on CPU too. A
program that reads hidden states through a learned router would need the router here as
well and is refused.
"""

from __future__ import annotations

import time

import torch

from tokenrouter.compiler.backend.compiled import default_base_dir
from tokenrouter.compiler.backend.interpreter import Interpreter, RequestStep
from tokenrouter.compiler.needs import writer_needs
from tokenrouter.extras import require
from tokenrouter.protocol.sampling import SamplingParams
from tokenrouter.runtime.loader import checkpoint_folder

from tokenrouter.bench.configs import small_and_large
from tokenrouter.bench.deploy import Measurement


def _cache_keyword() -> str:
    """`transformers` renamed generate's `past_key_values` to `cache` in version 5."""
    try:
        from transformers import __version__
        return "cache" if int(__version__.split(".")[0]) >= 5 else "past_key_values"
    except (ImportError, ValueError):
        return "past_key_values"


_CACHE_KW = _cache_keyword()


class CiterOfficial:
    def __init__(self, program, threads: int):
        AutoModelForCausalLM = require("bench", "transformers", "the `official` peer").AutoModelForCausalLM
        if program.ensembles:
            raise ValueError("official: ensembles have no single-writer serving loop to reproduce")
        for m in program.models:
            n = writer_needs(program, m.name)
            if n.hidden_layers or n.token_embedding:
                raise ValueError(f"official: {m.name}'s routing reads hidden states; not reproduced")
        self.small, self.large = small_and_large(program)
        self.program = program
        self.threads = threads
        self.interp = Interpreter(program, default_base_dir(program))
        torch.set_num_threads(threads)
        self.models = {}
        for m in program.models:
            _, folder = checkpoint_folder(m.path)
            self.models[m.name] = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        self.pad = 0

    def measure(self, name: str, prompts, sampling: SamplingParams, concurrency: int, batch=None) -> Measurement:
        torch.set_num_threads(self.threads)
        outs, lats, written, calls = [], [], {}, {m: 0 for m in self.models}
        t0 = time.perf_counter()
        for start in range(0, len(prompts), max(1, concurrency)):
            chunk = prompts[start:start + concurrency]
            tb = time.perf_counter()
            toks, wb = self._static_batch(chunk, start, sampling, calls)
            lat = time.perf_counter() - tb
            outs += toks
            lats += [lat] * len(chunk)
            for k, v in wb.items():
                written[k] = written.get(k, 0) + v
        wall = time.perf_counter() - t0
        m = Measurement(name, concurrency, wall, sum(map(len, outs)), lats, written, outs,
                        threads={"all": self.threads})
        m.steps = calls  # generate() calls per model
        return m

    def _static_batch(self, prompts, first: int, sampling, calls):
        """One static batch: prompts `first`, `first` + 1, ... (their route seeds)."""
        n = len(prompts)
        width = max(map(len, prompts))
        ids = torch.full((n, width), self.pad, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        writer = [self.program.start] * n
        visit = [0] * n
        out: list[list[int]] = [[] for _ in range(n)]
        written: dict[str, int] = {}
        small_cache = None
        stop = set(sampling.stop_token_ids)
        done = [False] * n
        with torch.inference_mode():
            for pos in range(sampling.max_tokens):
                new = [None] * n
                pending = [i for i in range(n) if not done[i]]
                tries = 0
                while pending:
                    tries += 1
                    if tries > 2 * len(self.models) + 2:
                        raise RuntimeError(f"official: rewrite loop at position {pos}")
                    for model in (self.small, self.large):
                        rows = [i for i in pending if writer[i] == model]
                        if not rows:
                            continue
                        if model == self.small:
                            # the small model's generate over the whole batch, its cache kept
                            logits, small_cache = self._generate(model, ids, mask, small_cache)
                            logits = logits[rows]
                        else:
                            # the large model: only its rows, the whole prefix, no cache
                            logits, _ = self._generate(model, ids[rows], mask[rows], None)
                        calls[model] += 1
                        for r, i in enumerate(rows):
                            row = logits[r].double().numpy()
                            tok = int(row.argmax())
                            d = self.interp.route(model, RequestStep(logits=row, sampled=tok, visit_tokens=visit[i] + 1,
                                                                     position=pos, request_seed=first + i))
                            if d.keep:
                                new[i] = tok
                                written[model] = written.get(model, 0) + 1
                                visit[i] += 1
                            if d.dest != model:
                                writer[i], visit[i] = d.dest, 0
                    pending = [i for i in pending if new[i] is None]
                col = torch.tensor([[t if t is not None else self.pad] for t in new], dtype=torch.long)
                ids = torch.cat([ids, col], dim=1)
                mask = torch.cat([mask, torch.tensor([[0 if done[i] else 1] for i in range(n)])], dim=1)
                for i, t in enumerate(new):
                    if t is not None and not done[i]:
                        out[i].append(t)
                        done[i] = t in stop
                if all(done):
                    break
        return out, written

    def _generate(self, model: str, ids, mask, cache):
        """One `generate(max_new_tokens=1)`: the next-token logits of every row, and the cache."""
        keep = model == self.small
        kw = {_CACHE_KW: cache} if cache is not None else {}
        res = self.models[model].generate(input_ids=ids, attention_mask=mask, max_new_tokens=1, do_sample=False,
                                          output_logits=True, return_dict_in_generate=True, use_cache=keep,
                                          pad_token_id=self.pad, **kw)
        out_cache = getattr(res, "cache", None) if _CACHE_KW == "cache" else getattr(res, "past_key_values", None)
        return res.logits[0], out_cache if keep else None

    def close(self) -> None:
        self.models.clear()
