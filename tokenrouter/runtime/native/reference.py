"""How the single-request reference (`runtime/reference.py`) runs a model on tokenrouter's
engine: one `Engine` sized for one full-length sequence, each forward a fresh prefill of
everything the writer sees, on a sequence freed right after (no KV reuse)."""

from __future__ import annotations

from typing import Any

import torch

from tokenrouter.compiler import ir
from tokenrouter.protocol.step import FeatureNeeds
from tokenrouter.runtime.engine.engine import Engine
from tokenrouter.runtime.loader import load_model, quant_options


class NativeReference:
    def __init__(self, model: ir.Model, *, models: dict[str, Any] | None = None, max_model_len: int | None = None,
                 block_size: int = 16):
        dtype = getattr(torch, model.dtype)
        lm = (models or {}).get(model.name) or load_model(model.path, dtype=dtype, quant=model.quant)
        length = max_model_len or lm.config.max_position_embeddings
        # one sequence at a time: room for one full-length sequence is enough
        kw = {"device": "cpu", "dtype": dtype, "block_size": block_size, "max_model_len": length,
              "num_blocks": -(-length // block_size) + 1}
        self.engine = Engine(lm.config, lm.weights, quant_options(lm, model.quant, **kw))
        self.max_model_len = self.engine.max_model_len
        self.seq = 0

    def forward(self, tokens: list[int], needs: FeatureNeeds):
        """Logits [V] and hidden {layer: [H]} at the last position, by a fresh prefill."""
        self.seq += 1
        sid = -self.seq  # never collides with anything else using this engine
        try:
            out = self.engine.step([(sid, list(tokens))], needs)
        finally:
            self.engine.free(sid)
        return out.logits[0], {k: v[0] for k, v in out.hidden.items()}

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The tokens' input embeddings (a router that reads `token_embedding`)."""
        return self.engine.embed(tokens)

    def close(self) -> None:
        """Nothing to stop: the engine is freed with the object."""


def reference_model(model: ir.Model, *, models: dict[str, Any] | None = None, max_model_len: int | None = None,
                    block_size: int = 16) -> NativeReference:
    return NativeReference(model, models=models, max_model_len=max_model_len, block_size=block_size)
