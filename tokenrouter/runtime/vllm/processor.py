"""The logits processor that samples and routes a vLLM writer's steps (vLLM's V1 interface;
`engine.py` pins the V1 model runner on GPUs too, `VLLM_USE_V2_MODEL_RUNNER=0`).

vLLM builds one per worker: in the subserver's process (one rank), or in each
tensor-parallel worker process, which all see the same [B, V] logits and decide alike. It
reads its program from the engine's `additional_config["tokenrouter"]` (`engine.py`) and
loads the writer's compiled router itself. Each of our requests carries, in
`SamplingParams.extra_args["tokenrouter"]`, where it stood when its chunk was added
(`codes.chunk_args`); vLLM adds the row again with each chunk, and the row's live output list
counts the tokens sampled since. Every step, for the rows that carry it:

    sample_and_route (subserver/step.py), the function tokenrouter's engine calls (the
                     writer refuses requests whose logits it would have to process first:
                     penalties, logit bias, structured output; and logprobs)
    end_reason       (protocol/sampling.py): whether the committed token ends the request
    force            the sampled token when the request stays and goes on, else the park
                     token (a stop id of the request: vLLM parks it with its KV); the
                     forced logit's value is the decision (`codes.py`)

Rows without our arguments are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from tokenrouter.compiler import ir
from tokenrouter.compiler.backend.compiled import load_routers
from tokenrouter.protocol.sampling import SamplingParams, end_reason
from tokenrouter.runtime.subserver.step import RowFacts, sample_and_route
from tokenrouter.runtime.vllm.codes import KEY, encode


@dataclass
class Row:
    """One of our requests in vLLM's batch, as its current chunk started."""

    params: SamplingParams
    n_out: int
    n_tokens: int
    visit: int
    route_seed: int
    out: list[int]  # vLLM's live list of the tokens sampled in this chunk

    @staticmethod
    def of(args: dict, out: list[int]) -> "Row":
        return Row(SamplingParams.model_validate(args["sampling"]), args["n_out"], args["n_tokens"], args["visit"],
                   args["route_seed"], out)

    def facts(self) -> RowFacts:
        k = len(self.out)  # tokens this chunk committed already, each one a stay
        return RowFacts(self.params, self.n_out + k, self.visit + k + 1, self.route_seed)

    def ends(self, token: int, max_model_len: int) -> bool:
        k = len(self.out) + 1
        return end_reason(token, self.n_out + k, self.n_tokens + k, self.params, max_model_len) is not None


class RouteProcessor(LogitsProcessor):
    def __init__(self, vllm_config, device, is_pin_memory):
        cfg = (vllm_config.additional_config or {}).get(KEY)
        self.rows: dict[int, Row] = {}
        self.router = None
        if cfg is None:
            return  # an engine without tokenrouter's requests
        program = ir.Program.from_json(cfg["program"])
        self.router = load_routers(program, device=str(device), dtype=torch.float32,
                                   base_dir=cfg["base_dir"])[cfg["writer"]]
        self.writers = len(program.writers())
        self.index = program.writers().index(cfg["writer"])
        self.park_token = cfg["park_token"]
        self.max_model_len = vllm_config.model_config.max_model_len

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        args = (sampling_params.extra_args or {}).get(KEY)
        if args is not None:
            SamplingParams.model_validate(args["sampling"])

    def is_argmax_invariant(self) -> bool:
        return False  # it chooses the token: it runs for greedy rows too

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if not batch_update or self.router is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, _prompt, out in batch_update.added:
            args = (params.extra_args or {}).get(KEY) if params is not None else None
            if args is None:
                self.rows.pop(index, None)
            else:
                self.rows[index] = Row.of(args, out)
        for a, b, how in batch_update.moved:
            ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
            if ra is not None:
                self.rows[b] = ra
            if rb is not None and how == MoveDirectionality.SWAP:
                self.rows[a] = rb

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        idx = sorted(i for i in self.rows if i < logits.shape[0])
        if not idx:
            return logits
        rows = [self.rows[i] for i in idx]
        decided = sample_and_route(self.router, logits[idx], [r.facts() for r in rows])
        forced, values = [], []
        for row, (tok, dest, keep, _) in zip(rows, decided):
            goes_on = keep and dest == self.index and not row.ends(tok, self.max_model_len)
            forced.append(tok if goes_on else self.park_token)
            values.append(encode(tok, dest, keep, self.writers))
        at = torch.tensor(idx, device=logits.device)
        logits[at] = float("-inf")
        logits[at, torch.tensor(forced, device=logits.device)] = torch.tensor(values, dtype=logits.dtype,
                                                                             device=logits.device)
        return logits
