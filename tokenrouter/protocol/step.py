"""What one step of a writer hands its compiled `route`: the batch's tensors
(`StepTensors`), and what a router reads besides the logits (`FeatureNeeds`), so the engine
computes only that.

A subserver steps its engine on a batch, samples one token per request, then calls the
compiled `route` of its writer once for the whole batch:

    decisions = router.route(step)      # CPU int64 tensor [2, B]: the one D2H copy
    dest, keep = decisions[0], decisions[1]

`dest[i]` is an index into the program's writers (the writer's own index means "stay");
`keep[i]` is 1 when the sampled token is committed, 0 when it is rewritten (dropped: the
destination writes that position instead). For a request that stays, keep is always 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class FeatureNeeds:
    """What a model's compiled router reads besides the logits, so the engine computes
    only that. Layers use `ir.InputHidden` numbering (-1 = after the final norm)."""

    hidden_layers: tuple[int, ...] = ()
    token_embedding: bool = False


@dataclass
class StepTensors:
    """One step of one model (or ensemble) for a batch of B requests, on the model's device.

    logits: [B, V] last-position logits (float32/64); for an ensemble writer,
        `member_logits` holds each member's logits in `Ensemble.members` order instead.
    sampled: [B] int64, the token each request sampled this step.
    hidden: {layer: [B, H]} for the layers in `needs.hidden_layers`.
    token_embedding: [B, H] input embedding of `sampled`, when `needs.token_embedding`.
    visit_tokens: [B] int64, tokens this writer produced in the current visit, counting
        the one just sampled.
    position: [B] int64, index of the sampled token among the request's output tokens.
    request_seed: [B] int64, the request's seed (for seeded features).
    """

    logits: Any
    sampled: Any
    visit_tokens: Any
    position: Any
    request_seed: Any
    hidden: dict[int, Any] = field(default_factory=dict)
    token_embedding: Any = None
    member_logits: tuple[Any, ...] = ()
