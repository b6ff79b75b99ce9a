"""What a writer reads of its step besides the logits (`FeatureNeeds`): the hidden layers
and whether the sampled token's embedding, so the engine computes only those. Each step
feature's declaration says what it reads (`features/`).

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
from tokenrouter.compiler.features import EMBEDDING, feature_of
from tokenrouter.protocol.step import FeatureNeeds

__all__ = ["input_needs", "writer_needs"]


def _needs(nodes: Iterable) -> FeatureNeeds:
    """What these IR nodes read besides the logits, from their declarations."""
    layers, embedding = set(), False
    for node in nodes:
        decl = feature_of(node)
        if decl is not None:
            layers.update(decl.hidden_layers(node))
            embedding = embedding or EMBEDDING in decl.reads
    return FeatureNeeds(hidden_layers=tuple(sorted(layers)), token_embedding=embedding)


def _nodes(inp: ir.RouterInput) -> Iterable:
    return ir.walk(inp.expr) if isinstance(inp, ir.InputScalar) else (inp,)


def input_needs(inputs: Iterable[ir.RouterInput]) -> FeatureNeeds:
    """What a router network with these inputs reads besides the logits."""
    return _needs(node for inp in inputs for node in _nodes(inp))


def writer_needs(program: ir.Program, writer: str) -> FeatureNeeds:
    """What `writer`'s `route` reads besides the logits: what its rules' features read (a
    head row: the final hidden state) and the inputs of the routers its rules use (a router
    no rule of `writer` uses is not read)."""
    routers = {r.name: r for r in program.routers}
    nodes = [e for t in program.transitions_from(writer) for e in ir.walk(t.when)]
    used = [routers[e.router] for e in nodes if isinstance(e, ir.RouterProb) and e.router in routers]
    return _needs(nodes + [node for r in used for inp in r.inputs for node in _nodes(inp)])
