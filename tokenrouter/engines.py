"""The engines a model can be served on: one registration each, what every layer asks.

An engine is one package plus one registration. The registration (`Registration`) is the
engine's name (what `engine = NAME` writes in a `.route` file), its capabilities
(`Capabilities`) and the module that implements it (`implementation`), imported by name
only when a writer is served, referenced or profiled on it. So this module imports nothing
of the package but `extras`, and the checker, `explain`, the launcher, the reference, the
tuner, the bench and the docs' engine table all read the record here without loading an
engine; none of them names one.

The implementation module gives three functions (`Implementation`):

    load_writer(spec, phase_s, models=None)    the subserver's writer: a `LoadedWriter`
                                               whose engine is a `WriterEngine`
                                               (`runtime/subserver/setup.py`, `step.py`)
    reference_model(model, *, models=None, max_model_len=None, block_size=16)
                                               the single-request reference's forward of one
                                               model (`runtime/reference.py`): an object with
                                               `forward(tokens, needs) -> (logits [V], hidden
                                               {layer: [H]})` by a fresh prefill,
                                               `max_model_len`, `close()`, and `embed(tokens)`
                                               where it gives token embeddings
    profile_steps(program, model, threads, max_len, max_batch)
                                               the tuner's steps of one model (`tuner/steps.py`):
                                               (steps with step/free/seq_len, vocabulary size)

The built-in engines are tokenrouter's own (`native`, `runtime/native/`) and vLLM (`vllm`,
`runtime/vllm/`). Another distribution adds one through the entry point group
`tokenrouter.engines`: each entry point names a `Registration` (docs/architecture.md, "Add
an engine").
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType
from typing import Any, Protocol

from tokenrouter.extras import require as require_extra

__all__ = ["Capabilities", "Registration", "UnknownEngine", "DEFAULT", "ENTRY_POINTS", "LOGITS", "HIDDEN",
           "EMBEDDING", "GIVES_WORDS", "registered", "names", "registration", "capabilities", "implementation", "require",
           "engine_table"]

ENTRY_POINTS = "tokenrouter.engines"  # the group an out-of-tree engine registers under

# What a step can hand a router (`compiler/features/declare.StepFeature.reads` uses the same words).
LOGITS = "logits"  # the next-token logits (so the distribution): every engine gives them
HIDDEN = "hidden state"  # the hidden state after one layer
EMBEDDING = "token embedding"  # the input embedding of the token just sampled


@dataclass(frozen=True)
class Capabilities:
    """What an engine can do, in the terms the checker, the launcher and the tuner ask."""

    title: str  # the engine in a sentence: "tokenrouter's engine", "vLLM"
    summary: str  # what it is, in one line (the docs' table)
    devices: tuple[str, ...]  # where it runs: "cpu", "cuda"
    dtypes: tuple[str, ...]  # the model dtypes it runs
    quants: tuple[str, ...]  # the weight formats it runs ("none": the checkpoint's own weights)
    gives: tuple[str, ...]  # what its step hands a router: LOGITS, HIDDEN, EMBEDDING
    tensor_parallel: bool = False  # splits a model over ranks, a process each (`tensor_parallel = N`)
    ensembles: bool = False  # can be an ensemble's member (the members step together in one process)
    # how a departed request's KV is kept: "pending" (it stays, and a return extends it with
    # only the unseen suffix) and "rematch" (freed; a return re-reads the prefix)
    retentions: tuple[str, ...] = ("pending",)
    placed: bool = True  # the schedule's `place` picks its device (else the engine places itself)
    shares_cores: bool = True  # steps on torch threads: shares the host's cores by need (`runtime/cores.py`)
    one_per_process: bool = False  # one engine per process, for the process's life (profiled apart)
    start_timeout_s: float | None = None  # a start (import, weights) longer than the launch's timeout
    extra: str | None = None  # the optional extra that installs it (`extras.py`), if any
    module: str | None = None  # the module that extra provides, checked before serving
    explain: str = ""  # how `tokenrouter explain` names it (default: the title)
    install: str = "part of tokenrouter"  # the docs' table


@dataclass(frozen=True)
class Registration:
    """One engine: its name in a `.route` file, its capabilities, the module implementing it
    (imported by name when used) and the package that holds it (the docs' table)."""

    name: str
    capabilities: Capabilities
    implementation: str  # a module path: `Implementation`'s three functions
    package: str = ""


class Implementation(Protocol):
    """What an engine's implementation module gives (see the module docstring)."""

    def load_writer(self, spec: Any, phase_s: dict[str, float], models: dict[str, Any] | None = None) -> Any: ...

    def reference_model(self, model: Any, *, models: dict[str, Any] | None = None, max_model_len: int | None = None,
                        block_size: int = 16) -> Any: ...

    def profile_steps(self, program: Any, model: Any, threads: int, max_len: int, max_batch: int) -> Any: ...


class UnknownEngine(ValueError):
    """A name no registration has, or an entry point that is not a `Registration`."""


DEFAULT = "native"  # a model's engine when it names none

BUILTIN = (
    Registration(DEFAULT, Capabilities(
        title="tokenrouter's engine", explain="tokenrouter's own",
        summary="paged KV cache, C kernels built on the host, a measured per-host kernel plan",
        devices=("cpu", "cuda"), dtypes=("float32", "float64", "bfloat16", "float16"),
        quants=("none", "native", "int4", "int8"), gives=(LOGITS, HIDDEN, EMBEDDING),
        ensembles=True, retentions=("pending", "rematch")),
        implementation="tokenrouter.runtime.native", package="tokenrouter/runtime/native/"),
    Registration("vllm", Capabilities(
        title="vLLM", summary="vLLM's `LLMEngine`, stepped by the subserver",
        devices=("cpu", "cuda"), dtypes=("float32", "bfloat16", "float16"), quants=("none",), gives=(LOGITS,),
        tensor_parallel=True, placed=False, shares_cores=False, one_per_process=True, start_timeout_s=900.0,
        extra="vllm", module="vllm", install='`pip install "tokenrouter[vllm]"`'),
        implementation="tokenrouter.runtime.vllm", package="tokenrouter/runtime/vllm/"),
)


@functools.cache
def registered() -> tuple[Registration, ...]:
    """The built-in engines, then those of the `tokenrouter.engines` entry points (read once)."""
    out = list(BUILTIN)
    for ep in sorted(metadata.entry_points(group=ENTRY_POINTS), key=lambda e: e.name):
        where = f"entry point {ep.name} = {ep.value} ({ENTRY_POINTS})"
        try:
            reg = ep.load()
        except Exception as exc:
            raise UnknownEngine(f"{where} cannot be loaded: {type(exc).__name__}: {exc}") from None
        if not isinstance(reg, Registration):
            raise UnknownEngine(f"{where} is a {type(reg).__name__}, not a tokenrouter.engines.Registration")
        if reg.name != ep.name or any(r.name == reg.name for r in out):
            raise UnknownEngine(f"{where} registers {reg.name!r}: an engine is registered once, under its "
                                "entry point's name")
        out.append(reg)
    return tuple(out)


def names() -> tuple[str, ...]:
    """Every engine a `.route` file may name."""
    return tuple(r.name for r in registered())


def registration(name: str) -> Registration:
    for r in registered():
        if r.name == name:
            return r
    raise UnknownEngine(f"engine {name!r} is not registered (the engines are {', '.join(names())}; another "
                        f"is installed as a distribution with a {ENTRY_POINTS!r} entry point)")


def capabilities(name: str) -> Capabilities:
    return registration(name).capabilities


def implementation(name: str) -> Implementation:
    """The module implementing engine `name`, imported now (`MissingExtra` when its extra is not installed)."""
    require(name)
    module: ModuleType = importlib.import_module(registration(name).implementation)
    return module  # type: ignore[return-value]


def require(name: str) -> None:
    """`extras.MissingExtra` (one line naming the extra) unless engine `name`'s optional
    dependency can be imported."""
    caps = capabilities(name)
    if caps.extra is not None and caps.module is not None:
        require_extra(caps.extra, caps.module, f"a writer served by {caps.title} (engine = {name})")


GIVES_WORDS = {LOGITS: "logits", HIDDEN: "hidden states of any layer", EMBEDDING: "token embeddings"}


def engine_table() -> str:
    """The docs' engine table (docs/engines.md), one column per registered engine, from
    their capabilities."""
    regs = registered()
    yes = lambda b: "yes" if b else "no"  # noqa: E731
    rows = [
        ("package", [f"`{r.package}`" if r.package else r.implementation for r in regs]),
        ("what it is", [r.capabilities.summary for r in regs]),
        ("devices", [", ".join(r.capabilities.devices) for r in regs]),
        ("dtypes", [", ".join(r.capabilities.dtypes) for r in regs]),
        ("weight formats (`quant`)", [", ".join(r.capabilities.quants) for r in regs]),
        ("router inputs", [", ".join(GIVES_WORDS[g] for g in r.capabilities.gives) for r in regs]),
        ("tensor parallelism", [yes(r.capabilities.tensor_parallel) for r in regs]),
        ("ensemble members", [yes(r.capabilities.ensembles) for r in regs]),
        ("departed requests' KV", [", ".join(r.capabilities.retentions) for r in regs]),
        ("install", [r.capabilities.install for r in regs]),
    ]
    lines = ["| | " + " | ".join(f"`{r.name}`" for r in regs) + " |", "|---" * (len(regs) + 1) + "|"]
    lines += [f"| {what} | " + " | ".join(cells) + " |" for what, cells in rows]
    return "\n".join(lines)
