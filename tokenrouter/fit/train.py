"""Training the papers' router networks, choosing a threshold, and the held-out figures.

Labels (the reference is always the large model's greedy token at the same prefix, since
no verifier or gold text is at hand; see docs/fit.md):
- r2r: 1 = divergent (the small model's greedy token differs from the large model's). R2R
  labels a token divergent when a large-model continuation from it, judged by a 72B
  verifier, reaches a different answer; "differs from the large model's token" is the
  verifier-free stand-in (it also counts harmless paraphrases as divergent).
- citer: 1 = the small model's token is right (keep it), 0 = it is wrong and the large
  model's is right (route). With the large model as the reference its token is right by
  definition, so CITER's third case (both wrong: keep the small model) never occurs, and the
  paper's iterative relabelling (which asks whether routing changes the final answer) is
  not done.
- co_llm: Co-LLM's weak labels first (1 where the large model's token is right and the
  small model's is not: here, divergent), then its marginal-likelihood objective with the
  models frozen: maximise log((1 - pi) p_small(y) + pi p_large(y)), pi = sigmoid(defer
  logit), y = the reference token.
- mlp: like r2r, oriented by the program's comparison.

Training: AdamW, BCE with logits (r2r, citer, mlp), batches of 1024 rows as in R2R; dropout
0.1 while training (r2r, citer). CITER's BatchNorms are folded into the linear layers on
export. All randomness (init, dropout, shuffling) comes from `seed`, so a fit is a
deterministic function of its data and seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from tqdm.auto import trange

from tokenrouter.compiler import ir
from tokenrouter.compiler.weights import nets as rn


@dataclass
class Hyper:
    epochs: int = 30
    lr: float = 1e-3
    weight_decay: float = 5e-4
    batch: int = 1024
    dropout: float = 0.1
    width: int = 256  # r2r backbone width (R2R: 1024)
    blocks: int = 2  # r2r residual blocks (R2R: 6)
    expansion: int = 4


class CiterTrain(nn.Module):
    """CITER's classifier as trained: h -> 2h (BN, ReLU, dropout) -> h (BN, ReLU, dropout) -> 1."""

    def __init__(self, h: int, dropout: float):
        super().__init__()
        self.l0, self.b0 = nn.Linear(h, 2 * h), nn.BatchNorm1d(2 * h)
        self.l1, self.b1 = nn.Linear(2 * h, h), nn.BatchNorm1d(h)
        self.l2 = nn.Linear(h, 1)
        self.drop = nn.Dropout(dropout)

    def logit(self, x: torch.Tensor) -> torch.Tensor:
        x = self.drop(torch.relu(self.b0(self.l0(x))))
        x = self.drop(torch.relu(self.b1(self.l1(x))))
        return self.l2(x)[:, 0]

    def export(self) -> dict[str, torch.Tensor]:
        w0, b0 = rn.fold_batchnorm(self.l0, self.b0)
        w1, b1 = rn.fold_batchnorm(self.l1, self.b1)
        return {"layers.0.weight": w0, "layers.0.bias": b0, "layers.1.weight": w1, "layers.1.bias": b1,
                "layers.2.weight": self.l2.weight, "layers.2.bias": self.l2.bias}


class HeadTrain(nn.Module):
    def __init__(self, h: int):
        super().__init__()
        self.row = nn.Linear(h, 1)

    def logit(self, x: torch.Tensor) -> torch.Tensor:
        return self.row(x)[:, 0]

    def export(self) -> dict[str, torch.Tensor]:
        return {"weight": self.row.weight.reshape(-1), "bias": self.row.bias.reshape(1)}


class _Export(nn.Module):
    """r2r and mlp train as their inference modules (dropout between blocks for r2r)."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def logit(self, x):
        return self.net.logit(x)

    def export(self):
        return dict(self.net.state_dict())


def build(arch: str, router: ir.RouterNet | None, width: int, hp: Hyper) -> nn.Module:
    if arch == "co_llm":
        return HeadTrain(width)
    if arch == "citer":
        return CiterTrain(width, hp.dropout)
    if arch == "r2r":
        widths = rn.input_widths(router)
        hid = max([w for i, w in zip(router.inputs, widths) if not isinstance(i, ir.InputTopkLogits)] or [hp.width])
        proj = [hid if isinstance(i, ir.InputTopkLogits) else None for i in router.inputs]
        return _Export(rn.RouterResidual(widths, proj, hp.width, [hp.width * hp.expansion] * hp.blocks,
                                         router.activation, hp.dropout))
    return _Export(rn.RouterMLP([width, hp.width, 1], router.activation))


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, hp: Hyper, seed: int, progress: bool = True,
          aux: tuple[torch.Tensor, torch.Tensor] | None = None) -> list[float]:
    """Fit `model` in place; returns the mean loss of each epoch. `aux` = (p_small(y),
    p_large(y)) switches the second half of the epochs to Co-LLM's marginal likelihood."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
    bce = nn.BCEWithLogitsLoss()
    losses = []
    bar = trange(hp.epochs, desc="train", unit="epoch", disable=not progress, leave=False)
    for epoch in bar:
        model.train()
        perm = torch.randperm(len(x), generator=g)
        total, n = 0.0, 0
        marginal = aux is not None and epoch >= hp.epochs // 2
        for s in range(0, len(x), hp.batch):
            i = perm[s:s + hp.batch]
            if len(i) < 2:  # BatchNorm needs two rows
                continue
            z = model.logit(x[i])
            if marginal:
                ps, pl = aux[0][i], aux[1][i]
                ll = torch.logaddexp(nn.functional.logsigmoid(-z) + torch.log(ps.clamp_min(1e-12)),
                                     nn.functional.logsigmoid(z) + torch.log(pl.clamp_min(1e-12)))
                loss = -ll.mean()
            else:
                loss = bce(z, y[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(i)
            n += len(i)
        losses.append(total / max(n, 1))
        bar.set_postfix(loss=f"{losses[-1]:.4f}")
    model.eval()
    return losses


# ------------------------------------------------------------------ figures


def auc(score: torch.Tensor, label: torch.Tensor) -> float:
    """Area under the ROC curve of `score` for `label` (Mann-Whitney, ties counted half)."""
    pos, neg = int(label.sum()), int((1 - label).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    order = torch.argsort(score.double())
    s = score.double()[order]
    ranks = torch.empty(len(s), dtype=torch.float64)
    i = 0
    while i < len(s):  # average ranks over ties
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[i:j + 1] = (i + j) / 2 + 1
        i = j + 1
    r = torch.empty_like(ranks)
    r[order] = ranks
    return float((r[label.bool()].sum() - pos * (pos + 1) / 2) / (pos * neg))


def routes(score: torch.Tensor, op: str, threshold: float) -> torch.Tensor:
    return {">=": score >= threshold, ">": score > threshold, "<": score < threshold, "<=": score <= threshold}[op]


def at(score: torch.Tensor, divergent: torch.Tensor, op: str, threshold: float) -> dict:
    """Recall and precision of routing for divergent positions, and the large-token share."""
    r = routes(score, op, threshold).float()
    tp = float((r * divergent).sum())
    return {"threshold": threshold, "recall": tp / max(float(divergent.sum()), 1.0),
            "precision": tp / max(float(r.sum()), 1.0), "large_share": float(r.mean()),
            "fpr": float((r * (1 - divergent)).sum()) / max(float((1 - divergent).sum()), 1.0)}


def curve(score: torch.Tensor, divergent: torch.Tensor, op: str, points: int = 201) -> list[dict]:
    """The figures at thresholds spread over the scores' quantiles (and the ends)."""
    qs = torch.quantile(score.double(), torch.linspace(0, 1, points, dtype=torch.float64)).tolist()
    lo, hi = float(score.min()), float(score.max())
    ths = sorted(set([lo - 1e-6, hi + 1e-6] + qs))
    return [at(score, divergent, op, t) for t in ths]


def choose(score: torch.Tensor, divergent: torch.Tensor, op: str, min_recall: float | None,
           target_share: float | None) -> dict:
    """The threshold: the smallest large-token share with recall >= min_recall, or the share
    closest to target_share. Thresholds are midpoints between neighbouring scores."""
    s = torch.unique(score.double()).tolist()
    cands = [s[0] - 1e-6] + [(a + b) / 2 for a, b in zip(s, s[1:])] + [s[-1] + 1e-6]
    figs = [at(score, divergent, op, t) for t in cands]
    if min_recall is not None:
        ok = [f for f in figs if f["recall"] >= min_recall]
        return min(ok, key=lambda f: (f["large_share"], -f["precision"]))
    return min(figs, key=lambda f: (abs(f["large_share"] - target_share), -f["recall"]))


def entropy_threshold_for_share(entropy: torch.Tensor, share: float) -> float:
    """The tau at which `entropy > tau` routes `share` of the rows."""
    if share <= 0:
        return float(entropy.max()) + 1e-6
    if share >= 1:
        return float(entropy.min()) - 1e-6
    return float(torch.quantile(entropy.double(), 1 - share))


def sigmoid_inverse(p: float) -> float:
    p = min(max(p, 1e-12), 1 - 1e-12)
    return math.log(p / (1 - p))
