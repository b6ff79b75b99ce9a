"""The step features, each declared once: its IR node and, in `step_feature`, its
arguments, type, what it reads, its batched computation (a helper of
`protocol/features.py`) and its reference computation (below it, in float64 Python, the
interpreter's oracle). `declare.py` says what each part means; docs/architecture.md has
the recipe for adding one.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Literal

from tokenrouter.compiler.features.declare import (EMBEDDING, HEAD_ROW, HIDDEN, INF, LOGITS, NAN, Call, FeatureError,
                                                   Int, Scalar, Vector, Word, step_feature)
from tokenrouter.dsl.span import Span


def sigmoid(z: float) -> float:
    """1 / (1 + e^-z) without overflow; NaN stays NaN."""
    if math.isnan(z):
        return math.nan
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def _sorted_probs(d) -> list[float]:
    return sorted((math.exp(lp) for lp in d.logp.tolist()), reverse=True)


# ------------------------------------------------------------ scalars of the logits


@dataclass(frozen=True)
class OfModel:
    """The fields of a feature that takes no argument but the model whose step it reads."""

    model: str
    span: Span | None = None


def probability_of_logits(words: str, helper: str, reference):
    """The declaration of a feature of the model's distribution alone, without arguments,
    whose values lie in [0, 1]; `helper(p, bad)` computes it on a batch."""
    return step_feature(value=Scalar(range=lambda e: (0.0, 1.0), words=words), reads=(LOGITS,),
                        batched=Call(helper, ("p", "bad")), reference=reference)


def _entropy(e: "Entropy", view) -> float:
    d = view.dist()
    if not d.valid:
        return NAN
    h = 0.0
    for lp in d.logp.tolist():
        p = math.exp(lp)
        if p > 0.0:
            h -= p * lp
    if e.normalized:
        if len(d.logp) < 2:
            raise FeatureError("normalised entropy needs a vocabulary of at least 2 tokens")
        h /= math.log(len(d.logp))
    return h


@step_feature(
    args=(Word("normalized", {"normalized": True, "raw": False},
               hint="normalized divides by log(vocabulary size), so it lies in [0, 1]; raw is in nats"),),
    value=Scalar(range=lambda e: (0.0, 1.0 if e.normalized else INF),
                 words=lambda e: f"{'normalized' if e.normalized else 'raw'} entropy",
                 range_hint=lambda e: "for entropy in nats write entropy(MODEL, raw)" if e.normalized else None),
    reads=(LOGITS,), batched=Call("entropy", ("p", "bad", "normalized")), reference=_entropy)
@dataclass(frozen=True)
class Entropy:
    """Shannon entropy of softmax(logits) in nats; normalized divides by log(vocab)."""

    model: str
    normalized: bool
    span: Span | None = None
    kind: Literal["entropy"] = "entropy"


def _top_prob(e: "TopProb", view) -> float:
    d = view.dist()
    return _sorted_probs(d)[0] if d.valid else NAN


@probability_of_logits("top-1 probability", "top_prob", _top_prob)
@dataclass(frozen=True)
class TopProb(OfModel):
    """Probability of the most likely token."""

    kind: Literal["top_prob"] = "top_prob"


def _margin(e: "Margin", view) -> float:
    d = view.dist()
    if not d.valid:
        return NAN
    p = _sorted_probs(d)
    if len(p) < 2:
        raise FeatureError("margin needs a vocabulary of at least 2 tokens")
    return p[0] - p[1]


@probability_of_logits("margin", "margin", _margin)
@dataclass(frozen=True)
class Margin(OfModel):
    """p(top-1) - p(top-2)."""

    kind: Literal["margin"] = "margin"


# ------------------------------------------------------------ a head row


def _head(e: "HeadLogit", view) -> float:
    h = view.hidden(-1)
    if not all(math.isfinite(v) for v in h.tolist()):
        return NAN
    w, b = view.head_row(e.file)
    z = float(w @ h) + b
    return sigmoid(z) if e.sigmoid else z


@step_feature(value=Scalar(range=lambda e: (0.0, 1.0) if e.sigmoid else (-INF, INF),
                           words=lambda e: "probability" if e.sigmoid else "logit"),
              reads=(HIDDEN, HEAD_ROW), layer=lambda e: -1,
              batched=Call("head", ("step", "row", "sigmoid", "dtype")), reference=_head, written="declared",
              show=lambda e: f"{'head' if e.sigmoid else 'head logit'}({e.model}: {os.path.basename(e.file)})")
@dataclass(frozen=True)
class HeadLogit:
    """An extra LM-head row (Co-LLM's defer head): sigmoid(h_final . w + b) when
    `sigmoid`, else the raw logit. Weights come from `file` (tensors `weight` [H] or
    [1, H], optional `bias` [1]); a `head` declaration names it."""

    model: str
    file: str
    sigmoid: bool
    span: Span | None = None
    kind: Literal["head_logit"] = "head_logit"


# ------------------------------------------------------------ vectors: router inputs only


@step_feature(args=(Int("layer", "LAYER", -1, "a layer number >= -1", layer=True,
                        hint="0 = the embeddings, N = after decoder layer N, -1 = after the final norm"),),
              value=Vector("dim", model_width=True), reads=(HIDDEN,), layer=lambda e: e.layer,
              batched=Call("hidden", ("step", "layer", "dtype")),
              reference=lambda e, view: view.hidden(e.layer, e.dim))
@dataclass(frozen=True)
class InputHidden:
    """Hidden state at the last position after decoder layer `layer` (0 = embeddings
    output, n_layers = last layer before the final norm, -1 = after the final norm,
    i.e. the LM head's input). `dim`: the model's hidden size (0 until it is resolved)."""

    layer: int
    dim: int = 0
    kind: Literal["hidden"] = "hidden"


@step_feature(value=Vector("dim", model_width=True), reads=(EMBEDDING,),
              batched=Call("embedding", ("step", "dtype")), reference=lambda e, view: view.embedding(e.dim))
@dataclass(frozen=True)
class InputTokenEmbedding:
    """Input embedding of the token the model just sampled (`dim` as `InputHidden`'s)."""

    dim: int = 0
    kind: Literal["token_embedding"] = "token_embedding"


def _topk_logits(e: "InputTopkLogits", view) -> list[float]:
    d = view.dist()
    if d.logits is None:
        raise FeatureError("top-k logits are only defined on a model's own logits")
    if e.k > len(d.logits):
        raise FeatureError(f"top-{e.k} logits of a vocabulary of {len(d.logits)}")
    if not d.valid:
        return [NAN] * e.k
    return sorted(d.logits.tolist(), reverse=True)[:e.k]


@step_feature(args=(Int("k", "K", 1, "a whole number K >= 1"),), value=Vector("k"), reads=(LOGITS,),
              batched=Call("topk", ("x", "k", "bad")), reference=_topk_logits)
@dataclass(frozen=True)
class InputTopkLogits:
    """The k largest logits, sorted in descending order."""

    k: int
    kind: Literal["topk_logits"] = "topk_logits"
