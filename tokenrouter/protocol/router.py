"""`Router`: the base class of every generated writer class.

A generated class sets WRITERS (the program's writers), NAME, INDEX and what its `route`
reads (HIDDEN_LAYERS, TOKEN_EMBEDDING), and defines `route` (and `combine` for an
ensemble); identity, the loaded networks and head rows, and the handoff (`send` /
`receive`, `handoff.py`) are the same for every program and live here.
"""

from __future__ import annotations

import torch

from tokenrouter.protocol import handoff
from tokenrouter.protocol.step import FeatureNeeds

__all__ = ["Router"]


class Router:
    """What every writer's router shares: identity, loaded parameters, send and receive.
    A generated class sets WRITERS (the program's writers), NAME, INDEX and what its
    `route` reads, and defines `route` (and `combine` for an ensemble)."""

    WRITERS: tuple[str, ...] = ()
    NAME = ""
    INDEX = -1
    HIDDEN_LAYERS: tuple[int, ...] = ()
    TOKEN_EMBEDDING = False

    def __init__(self, nets=None, heads=(), device="cpu", dtype=torch.float32):
        self.nets = dict(nets or {})
        self.heads = tuple(heads)
        self.device = torch.device(device)
        self.dtype = dtype

    @property
    def name(self):
        return self.NAME

    @property
    def index(self):
        return self.INDEX

    @property
    def needs(self):
        return FeatureNeeds(hidden_layers=self.HIDDEN_LAYERS, token_embedding=self.TOKEN_EMBEDDING)

    def combine(self, step):
        raise TypeError(f"{self.NAME!r} is a model, not an ensemble: it has no combine")

    def route(self, step):
        raise NotImplementedError

    def send(self, state, peer):
        """The message taking `state` to `peer` (`handoff.send`)."""
        return handoff.send(state, peer, self.NAME, self.WRITERS)

    def receive(self, msg, state=None):
        """The request's state after `msg` arrives (`handoff.receive`)."""
        return handoff.receive(msg, state, self.WRITERS)
