"""Generation on --eval-prompts: the router's routed greedy outputs against the large
model's own, next to the entropy rule's at the same large-token share and the small model
alone (the report's `generation` section). The fit's weights and threshold do not depend
on it.
"""

from __future__ import annotations

import functools
import os

import torch

from tokenrouter.fit import collect, train
from tokenrouter.fit.job import Pair, Scores
from tokenrouter.fit.report import agreement


def _share(roll: collect.Rollout) -> float:
    n = sum(len(r) for r in roll.routed)
    return sum(sum(r) for r in roll.routed) / max(n, 1)


def compare_generation(pair: Pair, ids: list[list[int]], max_tokens: int, scores: Scores, op: str, tau: float,
                        path: str, digest: str) -> dict:
    """Routed greedy outputs against the large model's own, for the router and for the entropy
    rule at the same large-token share. The share a threshold gives in generation differs
    from the share on the labelled rows (the trajectories change), so the entropy rule runs
    twice: with the tau matched on the held-out rows, and with the tau that routes the
    router's generation share of the positions the router's own generation visited (the
    closer match). The fit's output does not depend on this: it only reports."""
    threshold = scores.threshold
    _, ref = pair.lockstep(ids, max_tokens, "large", collect.ALWAYS, "large alone")
    _, small_only = pair.lockstep(ids, max_tokens, "small", None, "small alone")
    with torch.no_grad():
        rrows, routed = pair.lockstep(ids, max_tokens, f"router:{digest}{op}{threshold!r}",
                                      functools.partial(_route_by_score, scores.score_of, op, threshold), "router")
    tau_gen = train.entropy_threshold_for_share(rrows.entropy, _share(routed))
    out = {"prompts_file": os.path.basename(path), "prompts": len(ids), "max_tokens": max_tokens}
    for name, roll in (("router", routed), ("entropy_rule", _entropy_pass(pair, ids, max_tokens, tau_gen)),
                       ("entropy_rule_heldout_tau", _entropy_pass(pair, ids, max_tokens, tau)),
                       ("small_alone", small_only)):
        out[name] = {"large_share": _share(roll), **agreement(roll.tokens, ref.tokens)}
    out["entropy_rule"]["tau"] = tau_gen
    out["entropy_rule_heldout_tau"]["tau"] = tau
    return out


def _route_by_score(score_of, op: str, threshold: float, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    return train.routes(score_of(x), op, threshold)


def _route_by_entropy(tau: float, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    return collect.entropy(torch.log_softmax(logits, -1)) > tau


def _entropy_pass(pair: Pair, ids: list[list[int]], max_tokens: int, tau: float) -> collect.Rollout:
    return pair.lockstep(ids, max_tokens, f"entropy>{tau!r}", functools.partial(_route_by_entropy, tau),
                         "entropy rule")[1]
