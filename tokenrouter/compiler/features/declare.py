"""What a step feature's declaration says, and the registry of the declared ones.

A *step feature* is a value a model's step gives a routing rule or a router network:
`entropy(slm, normalized)`, `margin(slm)`, `hidden(-1)`, a head row. Each is declared once,
in `catalog.py`, by the `step_feature` decorator on its IR node (a frozen dataclass whose
`kind` is the feature's name): its arguments as the `.route` file writes them, its type
(a scalar with a range, or a vector with a width), what it reads of the step, how the
generated code computes it on a batch (a helper of `protocol/features.py`), and how the
reference interpreter computes it for one request. Everything else reads the declaration:
the IR's expression union and its JSON (`ir.py`), the checker (`check/expr.py`,
`check/routers.py`, `check/route.py`), the code generator and the interpreter
(`backend/`), what a writer's engine computes (`needs.py`), the one printer (`text.py`)
and so `explain` and the router files' input layouts, and `fit`'s training rows.

Nothing here imports torch or numpy: the IR imports the catalog, and `tokenrouter check`
must not pay for either.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Union

from tokenrouter.dsl import ast
from tokenrouter.dsl.diagnostics import words
from tokenrouter.engines import EMBEDDING, HIDDEN, LOGITS

INF = math.inf
NAN = math.nan

# What a feature reads of its model's step (`StepFeature.reads`).
# LOGITS (the next-token logits, so the distribution: every engine gives them), HIDDEN (the
# hidden state after one layer: `StepFeature.layer` says which) and EMBEDDING (the input
# embedding of the token just sampled) are what an engine's step can give (`tokenrouter/engines.py`).
HEAD_ROW = "head row"  # an extra LM-head row from a weights file (with the final hidden state)


class FeatureError(ValueError):
    """A feature cannot be computed on this input (a vocabulary too small for it)."""


# ------------------------------------------------------------------ arguments


@dataclass(frozen=True)
class Word:
    """An argument that is one of a few words, each standing for a value of the node's field
    (`entropy(slm, normalized)`: `normalized` is `Entropy.normalized = True`)."""

    field: str
    choices: dict[str, Any]
    hint: str | None = None

    @property
    def meta(self) -> str:
        return "|".join(self.choices)

    @property
    def what(self) -> str:
        return words([f"`{c}`" for c in self.choices])

    def parse(self, node) -> Any:
        """The field's value for this argument, or None when it is not one of the words."""
        text = node.name.text if isinstance(node, ast.Ref) else None
        return self.choices.get(text) if text in self.choices else None

    def show(self, value) -> str:
        return next((w for w, v in self.choices.items() if v == value), repr(value))


@dataclass(frozen=True)
class Int:
    """A whole-number argument >= `lo`. `layer`: it numbers a decoder layer of the model
    (checked against the model's layers once they are known, `lower.py`)."""

    field: str
    meta: str  # as signatures write it: LAYER, K
    lo: int
    what: str  # "a layer number >= -1"
    hint: str | None = None
    layer: bool = False

    def parse(self, node) -> int | None:
        if isinstance(node, ast.Num) and node.is_int and node.value >= self.lo:
            return int(node.value)
        return None

    def show(self, value) -> str:
        return str(value)


Arg = Union[Word, Int]


# ------------------------------------------------------------------ types


@dataclass(frozen=True)
class Scalar:
    """One number per request. `range(node)`: (lo, hi) of its values, for E305; `words`:
    the feature in words ("normalized entropy"), for messages; `range_hint(node)`: more to
    say when a threshold is out of range."""

    range: Callable[[Any], tuple[float, float]]
    words: Union[str, Callable[[Any], str]]
    range_hint: Callable[[Any], str | None] = lambda node: None

    def words_of(self, node) -> str:
        return self.words if isinstance(self.words, str) else self.words(node)


@dataclass(frozen=True)
class Vector:
    """A vector per request: only a router network's input. `width`: the node's field that
    holds its width; `model_width`: that field is the model's hidden size, filled in when
    the model is resolved (0 before)."""

    width: str
    model_width: bool = False


# ------------------------------------------------------------------ computation


@dataclass(frozen=True)
class Call:
    """How generated code computes the feature on a batch: `fn`, a helper exported by
    `tokenrouter.protocol.features`, called with `args` in order. An argument is one of
    what the step gives (`x`, `p`, `bad`: the model's logits, probabilities and invalid-row
    mask, from `dist`; `step`: the `StepTensors`; `dtype`: the features' dtype; `row`: the
    head row the node names) or the name of one of the node's fields (its value)."""

    fn: str
    args: tuple[str, ...]


STEP_NAMES = ("x", "p", "bad", "step", "dtype", "row")


@dataclass(frozen=True)
class StepFeature:
    """The declaration of one step feature (see the module docstring).

    `reference(node, view)` computes it for one request, in float64 Python, from what
    `view` gives of the model's step (the interpreter's view; see `ReferenceView`): a float
    for a scalar, a sequence of floats for a vector. `layer(node)`: the hidden layer it
    reads, when it reads `HIDDEN`. `written`: "call" for a feature written as a function
    (`margin(slm)` in a condition, `margin` among a router's inputs), "declared" for one a
    declaration names (a `head`), which `show(node)` prints."""

    node: type
    args: tuple[Arg, ...]
    value: Union[Scalar, Vector]
    reads: tuple[str, ...]
    batched: Call
    reference: Callable[[Any, Any], Any]
    layer: Callable[[Any], int] | None = None
    written: str = "call"
    show: Callable[[Any], str] | None = None

    @property
    def name(self) -> str:
        return self.node.__dataclass_fields__["kind"].default

    @property
    def scalar(self) -> bool:
        return isinstance(self.value, Scalar)

    def signature(self) -> str:
        """As a condition writes it: `entropy(MODEL, normalized|raw)`."""
        return f"{self.name}({', '.join(['MODEL', *(a.meta for a in self.args)])})"

    def input_signature(self) -> str:
        """As a router's inputs write it (the router's model is implied): `entropy(normalized|raw)`."""
        return f"{self.name}({', '.join(a.meta for a in self.args)})" if self.args else self.name

    def text(self, node, model: str | None = None) -> str:
        """`node` as the file writes it: in a condition with its `model`, among a router's
        inputs without (`margin(slm)`, `margin`)."""
        if self.show is not None:
            return self.show(node)
        shown = [a.show(getattr(node, a.field)) for a in self.args]
        inside = ([model] if model is not None else []) + shown
        return f"{self.name}({', '.join(inside)})" if inside else self.name

    def hidden_layers(self, node) -> tuple[int, ...]:
        return (self.layer(node),) if HIDDEN in self.reads and self.layer is not None else ()


class ReferenceView(Protocol):
    """What a feature's `reference` reads of one request's step; the interpreter gives one
    bound to the model the feature reads."""

    def dist(self) -> Any:
        """The model's next-token distribution: `valid` (False for an invalid logits row:
        NaN, +inf, or no finite entry), `logp` (float64 log-probabilities), `logits` (the raw
        row; None for an ensemble's combined distribution)."""

    def hidden(self, layer: int, dim: int | None = None) -> Any:
        """The hidden state after `layer` (`dim`: the width it must have)."""

    def embedding(self, dim: int) -> Any:
        """The input embedding of the token just sampled."""

    def head_row(self, file: str) -> tuple[Any, float]:
        """The head row (weight [H], bias) in `file`."""


# ------------------------------------------------------------------ the registry

FEATURES: dict[str, StepFeature] = {}  # name -> declaration, in declaration order
_BY_NODE: dict[type, StepFeature] = {}


def step_feature(*, args: tuple[Arg, ...] = (), value, reads: tuple[str, ...], batched: Call,
                 reference: Callable, layer: Callable | None = None, written: str = "call",
                 show: Callable | None = None):
    """Declare the decorated IR node class as a step feature (see `StepFeature`)."""

    def register(node: type) -> type:
        decl = StepFeature(node, args, value, reads, batched, reference, layer, written, show)
        fields = set(node.__dataclass_fields__)
        missing = [a.field for a in args if a.field not in fields]
        unknown = [a for a in batched.args if a not in STEP_NAMES and a not in fields]
        if missing or unknown or decl.name in FEATURES or (HIDDEN in reads) != (layer is not None):
            raise TypeError(f"step feature {decl.name!r} is declared wrong: fields {missing or unknown} unknown, "
                            f"or declared twice, or it reads a hidden state without saying which layer")
        FEATURES[decl.name] = decl
        _BY_NODE[node] = decl
        return node

    return register


def feature_of(node) -> StepFeature | None:
    """The declaration of an IR node that is a step feature, else None."""
    return _BY_NODE.get(type(node))


def called() -> list[StepFeature]:
    """The features a file writes as functions: scalars, then vectors (declaration order within)."""
    calls = [f for f in FEATURES.values() if f.written == "call"]
    return [f for f in calls if f.scalar] + [f for f in calls if not f.scalar]
