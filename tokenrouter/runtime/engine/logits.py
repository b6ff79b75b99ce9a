"""What the sampler draws from: a batch's [B, V] logits after each request's penalties,
logit bias, `min_tokens` and structured-output mask, in one function any writer's step
calls (ours in `subserver/step.py`, the single-request reference, another engine's
writer), so every writer of a request changes its logits alike.

Per row, in this order (the same as vLLM's):

| step | what |
|---|---|
| repetition penalty r | every token in the prompt or the output: a positive logit is divided by r, a negative one multiplied |
| frequency penalty f, presence penalty p | `logit -= f * count + p * (count > 0)`, counts over the output tokens |
| logit bias | added to the logits of the tokens named |
| `min_tokens` | the stop ids are -inf until the output has that many tokens, unless the request's grammar allows nothing else (where its grammar ends, the output ends) |
| structured output | every token the request's grammar does not allow is -inf (`grammar.py`) |

Each row is changed alone (row-wise operations only), so a request's result does not depend
on the batch it shares. The routers read the models' own logits; only the sampler reads
these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from tokenrouter.protocol.sampling import SamplingParams
from tokenrouter.runtime.engine.grammar import GrammarState

__all__ = ["LogitsRow", "process_logits"]


@dataclass
class LogitsRow:
    """What processing one row reads besides its logits: the request's parameters, its tokens
    (prompt then output) and its grammar state (advanced to the output, or None)."""

    params: SamplingParams
    tokens: Sequence[int]
    prompt_len: int
    grammar: GrammarState | None = None


def process_logits(logits: torch.Tensor, rows: Sequence[LogitsRow]) -> torch.Tensor:
    """The logits [B, V] the sampler draws from: `logits` itself when no row changes them,
    else a changed copy."""
    if len(rows) != logits.shape[0]:
        raise ValueError("process_logits: need one row per logits row")
    todo = [i for i, r in enumerate(rows) if r.params.processes_logits]
    if not todo:
        return logits
    out = logits.clone()
    for i in todo:
        _process_row(out[i], rows[i])
    return out


def _process_row(x: torch.Tensor, row: LogitsRow) -> None:
    """Change one row [V] in place."""
    p, vocab = row.params, x.shape[0]
    output = torch.tensor(row.tokens[row.prompt_len:], dtype=torch.int64)
    if p.repetition_penalty != 1.0:
        seen = torch.unique(torch.tensor(row.tokens, dtype=torch.int64))
        seen = seen[seen < vocab]
        v = x[seen]
        x[seen] = torch.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
    if (p.frequency_penalty or p.presence_penalty) and len(output):
        counts = torch.bincount(output[output < vocab], minlength=vocab).to(x.dtype)
        x -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(x.dtype)
    if p.logit_bias:
        ids = torch.tensor([t for t, _ in p.logit_bias], dtype=torch.int64)
        bias = torch.tensor([b for _, b in p.logit_bias], dtype=x.dtype)
        keep = ids < vocab
        x.index_add_(0, ids[keep], bias[keep])
    allowed = row.grammar.allowed(vocab) if row.grammar is not None else None
    if len(output) < p.min_tokens and p.stop_token_ids:
        stop = torch.tensor([t for t in p.stop_token_ids if t < vocab], dtype=torch.int64)
        if allowed is None or allowed.index_fill(0, stop, False).any():
            x[stop] = float("-inf")
    if allowed is not None:
        x.masked_fill_(~allowed.to(x.device), float("-inf"))
