"""Token sampling: greedy, temperature, top-k, top-p, min-p, with reproducible per-request
seeds; and the log-probabilities a request asks for (`token_logprobs`).

A request's draw depends only on (its seed, its output position, its logits row), never
on the batch it shares a step with: each sampled row gets its own noise from a generator
seeded by (seed, position). The draw is the exponential race (argmax of p / E with
E ~ Exp(1)), which samples exactly from p and needs one uniform vector per row.
`SamplingParams` (`protocol/sampling.py`, importable from here) also carries a request's
`max_tokens` and `stop_token_ids`; the step runner (`subserver/step.py`) ends requests at
them. It is validated once where a request enters; `sample` only reads its attributes.
Penalties, logit bias and structured output change the logits before they get here
(`logits.py`).
"""

from __future__ import annotations

import torch

from tokenrouter.protocol.sampling import DEFAULT_MAX_TOKENS, SamplingParams

__all__ = ["DEFAULT_MAX_TOKENS", "LOGPROB_FLOOR", "SamplingParams", "TokenLogprobs", "filtered_probs", "sample",
           "token_logprobs"]

#: What a log-probability of -inf is reported as (JSON has no infinity; vLLM's value too).
LOGPROB_FLOOR = -9999.0

#: (the token's log-probability, [(token id, log-probability)] of the top k, most likely first)
TokenLogprobs = tuple[float, list[tuple[int, float]]]


_MIX = 0x9E3779B97F4A7C15


def _row_seed(seed: int, position: int) -> int:
    """A 63-bit seed from (seed, position) so nearby positions get unrelated streams."""
    x = (seed * _MIX + position + 1) & ((1 << 64) - 1)
    x ^= x >> 31
    x = (x * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    x ^= x >> 29
    return x & ((1 << 63) - 1)


def filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """The distributions rows [n, V] are sampled from after temperature, top-k, top-p and
    min-p (row-wise operations only, so a row's result does not depend on its neighbours)."""
    x = logits.double() / torch.tensor([p.temperature for p in params], dtype=torch.float64)[:, None]
    ks = [p.top_k if 0 < p.top_k < x.shape[1] else 0 for p in params]
    if any(ks):
        top = torch.topk(x, max(ks), dim=-1).values  # [n, kmax], descending
        kth = top.gather(1, torch.tensor([max(k, 1) - 1 for k in ks])[:, None])
        kth[torch.tensor([k == 0 for k in ks])] = float("-inf")
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    tops = torch.tensor([p.top_p for p in params], dtype=torch.float64)[:, None]
    if bool((tops < 1.0).any()):
        sp, idx = probs.sort(dim=-1, descending=True)
        before = sp.cumsum(-1) - sp  # mass strictly above each token
        sp = sp.masked_fill(before >= tops, 0.0)  # keep the smallest prefix reaching top_p
        probs = torch.zeros_like(probs).scatter_(1, idx, sp)
        probs = probs / probs.sum(-1, keepdim=True)
    mins = torch.tensor([p.min_p for p in params], dtype=torch.float64)[:, None]
    if bool((mins > 0).any()):  # drop tokens less likely than min_p times the most likely one
        probs = probs.masked_fill(probs < mins * probs.max(-1, keepdim=True).values, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(logits: torch.Tensor, params: list[SamplingParams], positions: list[int]) -> torch.Tensor:
    """One token per row of logits [B, V]; returns an int64 tensor [B] on logits' device."""
    if len(params) != logits.shape[0] or len(positions) != logits.shape[0]:
        raise ValueError("sample: need one SamplingParams and one position per logits row")
    out = logits.argmax(dim=-1)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return out
    probs = filtered_probs(logits[rows].detach().to("cpu"), [params[i] for i in rows])
    noise = torch.empty(probs.shape, dtype=torch.float64)
    for r, i in enumerate(rows):
        gen = torch.Generator()
        if params[i].seed is None:
            gen.seed()
        else:
            gen.manual_seed(_row_seed(params[i].seed, positions[i]))
        noise[r].exponential_(generator=gen)
    picks = torch.argmax(probs / noise, dim=-1)
    out = out.clone()
    out[torch.tensor(rows, device=out.device)] = picks.to(out.device)
    return out


def token_logprobs(logits: torch.Tensor, sampled: torch.Tensor, ks: list[int | None]) -> list[TokenLogprobs | None]:
    """For each row whose k is not None: the sampled token's log-probability under
    log_softmax(logits) and the k most likely tokens with theirs (None for the others).
    `logits` are the writer's own (an ensemble's: its combined log-probabilities), before
    penalties, bias, masks and temperature, as vLLM reports them by default."""
    rows = [i for i, k in enumerate(ks) if k is not None]
    out: list[TokenLogprobs | None] = [None] * len(ks)
    if not rows:
        return out
    lp = torch.log_softmax(logits[rows].detach().to("cpu", torch.float64), dim=-1)
    kmax = max(ks[i] for i in rows)
    top = lp.topk(kmax, dim=-1) if kmax else None
    chosen = lp.gather(1, sampled[rows].to("cpu")[:, None])[:, 0].tolist()
    for r, i in enumerate(rows):
        tops = [] if top is None else list(zip(top.indices[r, :ks[i]].tolist(), top.values[r, :ks[i]].tolist()))
        out[i] = (max(chosen[r], LOGPROB_FLOOR), [(t, max(v, LOGPROB_FLOOR)) for t, v in tops])
    return out
