"""What a writer reads of its step besides the logits (`FeatureNeeds`): the hidden layers
and whether the sampled token's embedding, so the engine computes only those.

`writer_needs(program, writer)` is what the writer's `route` reads: the inputs of every
router network its rules use, and the final hidden state (layer -1) wherever a rule or a
router's scalar input uses a head row. Generated modules declare it (`Router.needs`,
written by `backend/codegen.py`), the single-request reference computes it for the
interpreter (`runtime/reference.py`), and the commands' serving plan lists it.
`input_needs(inputs)` is what one router network's inputs read, which is how `fit`
collects its training rows (`fit/collect.py`).
"""

from __future__ import annotations

from typing import Iterable

from tokenrouter.compiler import ir
from tokenrouter.protocol.step import FeatureNeeds

__all__ = ["input_needs", "writer_needs"]


def input_needs(inputs: Iterable[ir.RouterInput]) -> FeatureNeeds:
    """What a router network with these inputs reads besides the logits."""
    layers, embedding = set(), False
    for inp in inputs:
        if isinstance(inp, ir.InputHidden):
            layers.add(inp.layer)
        elif isinstance(inp, ir.InputTokenEmbedding):
            embedding = True
        elif isinstance(inp, ir.InputScalar) and _reads_head(inp.expr):
            layers.add(-1)
    return FeatureNeeds(hidden_layers=tuple(sorted(layers)), token_embedding=embedding)


def writer_needs(program: ir.Program, writer: str) -> FeatureNeeds:
    """What `writer`'s `route` reads besides the logits: the inputs of the routers its
    rules use (a router no rule of `writer` uses is not read) and, for a head row, the
    final hidden state."""
    routers = {r.name: r for r in program.routers}
    nodes = [e for t in program.transitions_from(writer) for e in ir.walk(t.when)]
    used = [routers[e.router] for e in nodes if isinstance(e, ir.RouterProb) and e.router in routers]
    needs = input_needs(inp for r in used for inp in r.inputs)
    if not any(isinstance(e, ir.HeadLogit) for e in nodes):
        return needs
    return FeatureNeeds(hidden_layers=tuple(sorted({*needs.hidden_layers, -1})),
                        token_embedding=needs.token_embedding)


def _reads_head(e: ir.Expr) -> bool:
    return any(isinstance(x, ir.HeadLogit) for x in ir.walk(e))
