"""The routing IR: a frozen, versioned, JSON-serialisable description of a checked program.

The IR is the contract between the front end (parse, check, lower) and everything that
runs a program (reference interpreter, code generator, runtime, tuner). A routing
program is a small state machine whose states are *writers* (a model, or an ensemble
that combines several models' distributions in one step). After the writer of a request
produces a token, the transitions leaving that state are tried in source order; the
first whose condition holds moves the request to its destination, and its action says
whether the token just produced is kept or rewritten (dropped, so the destination
writes that position instead). When none holds the request stays.

Every node carries the `Span` of the `.route` text it came from, so generated code and
diagnostics point back at the source line. `walk(expr)` is the traversal of an expression
every pass over the IR uses.

The step features' nodes (`Entropy`, `Margin`, `HeadLogit`, `InputHidden`, ...) are
declared with their semantics in `features/catalog.py`; the IR takes them from the
registry (scalars are expressions, vectors router inputs) and names them too:
`ir.Margin` is `features.catalog.Margin`.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Iterator, Literal, Union

from tokenrouter import engines
from tokenrouter.compiler.features import FEATURES
from tokenrouter.dsl.span import Span

IR_VERSION = 1

# the step features' nodes, by class name (see the module docstring)
FEATURE_NODES: dict[str, type] = {f.node.__name__: f.node for f in FEATURES.values()}


def __getattr__(name: str) -> type:
    """`ir.Entropy`, `ir.InputHidden`, ...: the step features' nodes."""
    if name in FEATURE_NODES:
        return FEATURE_NODES[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------- expressions
# Scalar-valued per request unless stated. `model` is the model whose step is read.


@dataclass(frozen=True)
class Const:
    """A number. `param` names the parameter it came from, if any (`x > tau`): the value
    is already bound, so nothing that runs a program needs it; it is there for people
    (`tokenrouter explain`) and does not take part in equality."""

    value: float
    span: Span | None = None
    kind: Literal["const"] = "const"
    param: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class RouterProb:
    """Output of a trained router network (see `RouterNet`), a probability in [0, 1]."""

    router: str
    span: Span | None = None
    kind: Literal["router_prob"] = "router_prob"


@dataclass(frozen=True)
class Bernoulli:
    """A seeded coin with P(true) = p, for synthetic workloads. Reproducible: the draw is
    a pure function of (seed, request seed, output position), never of batch layout.
    The hash is `tokenrouter.compiler.ir.bernoulli_uniform`."""

    p: float
    seed: int
    span: Span | None = None
    kind: Literal["bernoulli"] = "bernoulli"


@dataclass(frozen=True)
class VisitTokens:
    """Tokens the current writer has produced in this visit, counting the one just
    produced (so it is 1 on a visit's first step)."""

    span: Span | None = None
    kind: Literal["visit_tokens"] = "visit_tokens"


@dataclass(frozen=True)
class Compare:
    op: Literal["<", "<=", ">", ">=", "==", "!="]
    left: "Expr"
    right: "Expr"
    span: Span | None = None
    kind: Literal["compare"] = "compare"


@dataclass(frozen=True)
class Logic:
    op: Literal["and", "or", "not"]
    args: tuple["Expr", ...]
    span: Span | None = None
    kind: Literal["logic"] = "logic"


@dataclass(frozen=True)
class Arith:
    op: Literal["+", "-", "*", "/"]
    left: "Expr"
    right: "Expr"
    span: Span | None = None
    kind: Literal["arith"] = "arith"


Expr = Union[(Const, *(f.node for f in FEATURES.values() if f.scalar), RouterProb, Bernoulli, VisitTokens,
              Compare, Logic, Arith)]


def walk(e: Expr) -> Iterator[Expr]:
    """`e` and every expression inside it, depth first: a node before its operands, left
    before right, `Logic`'s arguments in order."""
    yield e
    if isinstance(e, (Compare, Arith)):
        yield from walk(e.left)
        yield from walk(e.right)
    elif isinstance(e, Logic):
        for a in e.args:
            yield from walk(a)


# ------------------------------------------------------------- router inputs
# Vector features and scalar ones, concatenated in declared order to form a router
# network's input.


@dataclass(frozen=True)
class InputScalar:
    """A scalar feature (entropy, top-1 probability, margin) as one input column."""

    expr: Expr
    kind: Literal["scalar"] = "scalar"


RouterInput = Union[(*(f.node for f in FEATURES.values() if not f.scalar), InputScalar)]


@dataclass(frozen=True)
class RouterNet:
    """A trained router network loaded from a safetensors file; its input is the
    concatenation of `inputs` in declared order, its output one probability.

    `arch` names the network (the tensor layout of each is in `weights/nets.py`):
    - "mlp": `layers.{i}.weight` [out, in], `layers.{i}.bias` [out], `activation` between
      layers; one logit (sigmoid) when the last layer has 1 row, else
      softmax(...)[output_index].
    - "citer": CITER's classifier, h -> 2h -> h -> 1 with its batch norms folded into the
      linear layers (so an "mlp" of that shape, ReLU, one sigmoid unit).
    - "r2r": R2R's classifier: a linear projection per input (optional per input; R2R
      projects the top-k logits to the hidden width), concatenation, a linear layer, residual
      MLP blocks (pre-LayerNorm, `activation`), a final LayerNorm and one logit (sigmoid)."""

    name: str
    model: str  # whose step it reads
    file: str
    inputs: tuple[RouterInput, ...]
    activation: Literal["relu", "gelu", "silu", "tanh"] = "relu"
    output_index: int = 0
    span: Span | None = None
    arch: Literal["mlp", "citer", "r2r"] = "mlp"


# ------------------------------------------------------------------ program


@dataclass(frozen=True)
class Model:
    name: str
    path: str  # a checkpoint folder, a .gguf file, or a built-in name ("smollm2-135m")
    role: Literal["small", "large", "member"] = "small"
    dtype: Literal["float32", "float64", "bfloat16", "float16"] = "float32"
    span: Span | None = None
    # weight format: none (float) | native (a GGUF's own blocks) | int4 | int8 (quantised on load)
    quant: Literal["none", "native", "int4", "int8"] = "none"
    # the engine that serves it, a registered name (`tokenrouter/engines.py`, docs/engines.md),
    # over `tensor_parallel` ranks
    engine: str = engines.DEFAULT
    tensor_parallel: int = 1

    def __post_init__(self) -> None:
        engines.registration(self.engine)  # `engines.UnknownEngine` for a name nobody registered


@dataclass(frozen=True)
class Ensemble:
    """A writer that combines members' next-token distributions in one step.
    average: p = sum_i w_i * softmax(logits_i) (restricted to the union of the members'
    top-`topk_union` tokens and renormalised, when set); mixture: one member per step,
    drawn with probabilities w_i from a seeded hash like `Bernoulli`'s, writes alone."""

    name: str
    members: tuple[str, ...]
    weights: tuple[float, ...]
    mode: Literal["average", "mixture"] = "average"
    topk_union: int | None = None
    seed: int = 0
    span: Span | None = None


@dataclass(frozen=True)
class Transition:
    source: str  # a writer: model or ensemble name
    dest: str
    when: Expr
    action: Literal["keep", "rewrite"]
    span: Span | None = None


@dataclass(frozen=True)
class VisitBound:
    """A writer writes at least `min_tokens` (transitions out are not tried before) and
    at most `max_tokens` tokens a visit; after the max it goes to `then` keeping the token.
    max_tokens None means unbounded."""

    writer: str
    min_tokens: int = 1
    max_tokens: int | None = None
    then: str | None = None
    span: Span | None = None


@dataclass(frozen=True)
class Schedule:
    """How to serve: never changes the tokens produced, only speed.
    batch: per model, the delayed-batching threshold B_i, or "auto" (the tuner chooses).
    max_wait_ms: per model, longest a ready request waits for a batch to fill.
    graph_batch_sizes / graph_tokens: the (batch, tokens-per-request) graph buckets.
    placement: per model, a device ("cpu", "cuda:0") or "host:port" for a remote subserver.
    threads: per model, CPU threads for its subserver (0 = torch's default)."""

    batch: tuple[tuple[str, int | Literal["auto"]], ...] = ()
    max_wait_ms: tuple[tuple[str, float], ...] = ()
    graph_batch_sizes: tuple[int, ...] = ()
    graph_tokens: tuple[int, ...] = ()
    placement: tuple[tuple[str, str], ...] = ()
    threads: tuple[tuple[str, int], ...] = ()
    span: Span | None = None


@dataclass(frozen=True)
class Param:
    """A parameter of the program and the value it was checked with. `value` is a float
    (`float`), an int (`int`), milliseconds (`duration`), an absolute path (`path`) or the
    text (`string`); `origin` says whether it is the declaration's default or was given on
    the command line (`--set NAME=VALUE`), and `text` is the value as written there.
    `lo`/`hi` are the declared range (None: unbounded)."""

    name: str
    type: Literal["float", "int", "duration", "path", "string"]
    value: Union[float, int, str]
    origin: Literal["default", "set"]
    text: str
    lo: float | None = None
    hi: float | None = None
    span: Span | None = None


@dataclass(frozen=True)
class Program:
    source: str
    language_version: int
    models: tuple[Model, ...]
    start: str  # the writer of every request's first token
    transitions: tuple[Transition, ...] = ()
    bounds: tuple[VisitBound, ...] = ()
    ensembles: tuple[Ensemble, ...] = ()
    routers: tuple[RouterNet, ...] = ()
    schedule: Schedule = field(default_factory=Schedule)
    params: tuple[Param, ...] = ()  # bound values, already substituted where they are used
    ir_version: int = IR_VERSION

    # -- convenience, all derived
    def model(self, name: str) -> Model:
        return next(m for m in self.models if m.name == name)

    def engine_of(self, writer: str) -> str:
        """The engine that steps `writer`: its model's, or for an ensemble the default one
        (its members step together in one process)."""
        return next((m.engine for m in self.models if m.name == writer), engines.DEFAULT)

    def writers(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.models) + tuple(e.name for e in self.ensembles)

    def transitions_from(self, writer: str) -> tuple[Transition, ...]:
        return tuple(t for t in self.transitions if t.source == writer)

    def param(self, name: str) -> Param:
        return next(p for p in self.params if p.name == name)

    def bound(self, writer: str) -> VisitBound:
        return next((b for b in self.bounds if b.writer == writer), VisitBound(writer))

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(to_jsonable(self), indent=indent, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "Program":
        data = json.loads(text)
        if data.get("ir_version") != IR_VERSION:
            raise ValueError(f"IR version {data.get('ir_version')!r} is not {IR_VERSION}")
        return _build(Program, data)


# ------------------------------------------------------------ serialisation

_EXPR_KINDS = {c.__dataclass_fields__["kind"].default: c for c in typing.get_args(Expr)}
_INPUT_KINDS = {c.__dataclass_fields__["kind"].default: c for c in typing.get_args(RouterInput)}


def to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (tuple, list)):
        return [to_jsonable(x) for x in obj]
    return obj


def _build(tp: Any, data: Any) -> Any:
    """Rebuild a dataclass tree from `to_jsonable` output, guided by the type hints."""
    if data is None:
        return None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        choices = [a for a in args if a is not type(None)]
        if isinstance(data, dict) and "kind" in data:
            kinds = _EXPR_KINDS if Const in choices else _INPUT_KINDS
            return _build(kinds[data["kind"]], data)
        if isinstance(data, dict):
            return _build(next(a for a in choices if dataclasses.is_dataclass(a)), data)
        if isinstance(data, list):
            return _build(next(a for a in choices if typing.get_origin(a) is tuple), data)
        return data
    if isinstance(data, dict) and dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return tp(**{k: _build(hints[k], v) for k, v in data.items()})
    if isinstance(data, list) and origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], x) for x in data)
        return tuple(_build(a, x) for a, x in zip(args, data))
    return data


# ---------------------------------------------------- the shared seeded hash

_MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """The SplitMix64 finaliser; generated code implements the same in int64 tensors."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def bernoulli_uniform(seed: int, request_seed: int, position: int) -> float:
    """A uniform draw in [0, 1) from (program seed, request seed, output position):
    the top 53 bits of splitmix64(splitmix64(splitmix64(seed) ^ request_seed) ^ position)."""
    h = splitmix64(splitmix64(splitmix64(seed & _MASK64) ^ (request_seed & _MASK64)) ^ (position & _MASK64))
    return (h >> 11) * (1.0 / (1 << 53))
