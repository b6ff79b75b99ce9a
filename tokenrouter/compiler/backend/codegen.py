"""Jinja2 code generation of the fused, batched router module of a program.

`generate_module(program)` returns the Python source of one module with, per writer, a
class whose `route(step)` is a single tensor program over the whole batch (no loop over
requests): the distribution of each model the rules read is computed once, and each step
feature is one call of the helper its declaration names (`features/catalog.py`, helpers in
`protocol/features.py`); router networks are `torch.nn.Module`s handed in at load time
(see `weights/nets.py`, `compiled.py`); the decisions leave the device in one copy. Each
class declares what its `route` reads of the step (`compiler/needs.py`). What is the same
for every program (the feature helpers, the seeded hash, `send`/`receive`, which move only
the unseen suffix) is not emitted: the module imports it from `tokenrouter.protocol`. The
semantics are the reference interpreter's (`interpreter.py`), which is the oracle.

`validate.check_program` first checks what generation relies on; `_WriterLowering` then
lowers one writer's rules (its transitions, then its max bound) into the statements of its
`route`, and the template (`templates/module.py.j2`) lays the classes out.

Safety: nothing a `.route` file says reaches the module as code; every value passes
through `literals.py` (names as `repr` strings, numbers checked, comments and docstrings
reduced to harmless characters). Comments quote each rule with the one printer
(`compiler/text.py`). The module is passed through `compile()` before it is returned, and
the output is deterministic (no dict-order, time or path dependence: comments name a span's
file by its base name).
"""

from __future__ import annotations

import dataclasses
import math
import os
import textwrap
from dataclasses import dataclass, field

import jinja2

from tokenrouter.compiler import ir
from tokenrouter.compiler.backend.literals import (CodegenError, comment_text, doc_text, py_float, py_int, py_str,
                                                   span_text, to_int64)
from tokenrouter.compiler.backend.validate import check_program, feature_fields
from tokenrouter.compiler.features import FEATURES, HEAD_ROW, LOGITS, StepFeature, feature_of
from tokenrouter.compiler.needs import writer_needs
from tokenrouter.compiler.text import expr_text

__all__ = ["CodegenError", "generate_module", "head_keys"]

_TEMPLATES = os.path.join(os.path.dirname(__file__), "templates")
_MASK64 = (1 << 64) - 1
_CMP = {"<", "<=", ">", ">=", "==", "!="}
_ARITH = {"+", "-", "*", "/"}
# what every module imports of `tokenrouter.protocol.features`, besides the features' helpers
_CORE = ("INF", "NAN", "dist", "dist_of_logprobs", "member_dist", "truth", "uniform")


# ------------------------------------------------------------------ lowering


@dataclass
class _Val:
    code: str
    kind: str  # "num" | "bool"
    const: bool = False


@dataclass
class _Block:
    comment: str | None
    lines: list[str] = field(default_factory=list)


class _WriterLowering:
    """Lowers the rules of one writer into the statements of its batched `route`."""

    def __init__(self, program: ir.Program, writer: str, heads: list[tuple[str, str]]):
        self.p, self.writer, self.heads = program, writer, heads
        self.ensemble = next((e for e in program.ensembles if e.name == writer), None)
        self.routers = {r.name: r for r in program.routers}
        self.memo: dict[tuple, str] = {}
        self.block = _Block(None)
        self.blocks: list[_Block] = []
        self.where = ""

    # -- statements
    def new_block(self, comment: str | None) -> None:
        self.block = _Block(None if comment is None else comment_text(comment))
        self.blocks.append(self.block)

    def let(self, key: tuple, code: str, prefix: str) -> str:
        if key not in self.memo:
            name = f"{prefix}{len(self.memo)}"
            self.block.lines.append(f"{name} = {code}")
            self.memo[key] = name
        return self.memo[key]

    def fail(self, msg: str) -> CodegenError:
        return CodegenError(f"{self.where}: {msg}" if self.where else msg)

    # -- the rules: one block per transition, then the max bound
    def transitions(self) -> None:
        """The transitions out of the writer, tried in order once its min bound is met."""
        bound = self.p.bound(self.writer)
        transitions = self.p.transitions_from(self.writer)
        if transitions:
            self.new_block(f"{span_text(bound.span) if bound.span else 'bound'}: "
                           f"transitions are tried from visit token {int(bound.min_tokens)} on")
            self.block.lines.append(f"open_ = vt >= {py_int(bound.min_tokens)}")
        writers = self.p.writers()
        for n, t in enumerate(transitions):
            self.where = span_text(t.span)
            self.new_block(comment_text(f"{self.where}: {t.source} -> {t.dest} when {expr_text(t.when, named=False)} {t.action}"))
            cond = self.truth(self.materialise(self.lower(t.when)))
            self.block.lines.append(f"c = {cond.code} & open_")
            self.block.lines.append(f"dest.masked_fill_(c, {writers.index(t.dest)})")
            if t.action == "rewrite" and t.dest != self.writer:
                self.block.lines.append("keep.masked_fill_(c, 0)")
            if n < len(transitions) - 1:
                self.block.lines.append("open_ &= ~c")

    def max_bound(self) -> None:
        """At the writer's max bound the request moves to the bound's `then`, keeping its token."""
        bound = self.p.bound(self.writer)
        if bound.max_tokens is None:
            return
        self.where = span_text(bound.span)
        self.new_block(comment_text(f"{self.where}: visit {self.writer} max {bound.max_tokens} "
                                    f"then {bound.then} (keep)"))
        self.block.lines.append(f"forced = vt >= {py_int(bound.max_tokens)}")
        self.block.lines.append(f"dest.masked_fill_(forced, {self.p.writers().index(bound.then)})")
        self.block.lines.append("keep.masked_fill_(forced, 1)")

    # -- distributions: (x, p, bad) variable names
    def dist(self, model: str) -> tuple[str, str, str]:
        key = ("dist", model)
        if key not in self.memo:
            n = len(self.memo)
            names = f"x{n}", f"p{n}", f"bad{n}"
            if self.ensemble is None and model == self.writer:
                src = "dist(step.logits, self.dtype)"
            elif self.ensemble is not None and model in self.ensemble.members:
                src = f"dist(step.member_logits[{self.ensemble.members.index(model)}], self.dtype)"
            elif self.ensemble is not None and model == self.writer:
                src = "dist_of_logprobs(self.combine(step))"
            else:
                raise self.fail(f"the step of {self.writer!r} does not read {model!r}'s distribution")
            self.block.lines.append(f"{', '.join(names)} = {src}")
            self.memo[key] = ",".join(names)
        return tuple(self.memo[key].split(","))  # type: ignore[return-value]

    def materialise(self, v: _Val) -> _Val:
        if not v.const:
            return v
        return _Val(f"torch.full((B,), {v.code}, dtype=self.dtype, device=vt.device)", v.kind)

    def num(self, v: _Val) -> _Val:
        return _Val(f"{v.code}.to(self.dtype)", "num") if v.kind == "bool" else v

    def truth(self, v: _Val) -> _Val:
        if v.kind == "bool":
            return v
        return _Val(f"truth({self.materialise(v).code})", "bool")

    # -- expressions
    def lower(self, e: object) -> _Val:
        if isinstance(e, ir.Const):
            return _Val(py_float(e.value), "num", const=True)
        if isinstance(e, ir.VisitTokens):
            return _Val(self.let(("vt",), "vt.to(self.dtype)", "f"), "num")
        if isinstance(e, ir.Bernoulli):
            p = py_float(e.p)
            seed_c = to_int64(ir.splitmix64(int(py_int(e.seed)) & _MASK64))
            u = self.let(("uniform", e.seed), f"uniform({seed_c}, step.request_seed, step.position)", "u")
            return _Val(f"({u} < {p})", "bool")
        decl = feature_of(e)
        if decl is not None:
            key = (decl.name, *(getattr(e, f) for f in e.__dataclass_fields__ if f not in ("span", "kind")))
            if key not in self.memo:
                self.let(key, self.feature(decl, e, e.model), "f")
            return _Val(self.memo[key], "num")
        if isinstance(e, ir.RouterProb):
            return _Val(self.router_prob(e.router), "num")
        if isinstance(e, ir.Compare):
            if e.op not in _CMP:
                raise self.fail(f"unknown comparison {e.op!r}")
            a, b = self.num(self.lower(e.left)), self.num(self.lower(e.right))
            if a.const and b.const:
                a = self.materialise(a)
            return _Val(f"({a.code} {e.op} {b.code})", "bool")
        if isinstance(e, ir.Arith):
            if e.op not in _ARITH:
                raise self.fail(f"unknown operator {e.op!r}")
            a, b = self.num(self.lower(e.left)), self.num(self.lower(e.right))
            if a.const and b.const:
                a = self.materialise(a)
            return _Val(f"({a.code} {e.op} {b.code})", "num")
        if isinstance(e, ir.Logic):
            if e.op == "not":
                if len(e.args) != 1:
                    raise self.fail("'not' takes one operand")
                return _Val(f"(~{self.truth(self.lower(e.args[0])).code})", "bool")
            if e.op not in ("and", "or") or not e.args:
                raise self.fail(f"bad logic operator {e.op!r}")
            op = " & " if e.op == "and" else " | "
            return _Val("(" + op.join(self.truth(self.lower(a)).code for a in e.args) + ")", "bool")
        raise self.fail(f"unknown expression {e!r}")

    def router_prob(self, name: str) -> str:
        r = self.routers.get(name)
        if r is None:
            raise self.fail(f"unknown router {name!r}")
        if self.ensemble is not None or r.model != self.writer:
            raise self.fail(f"router {name!r} reads {r.model!r}'s step, which the step of "
                            f"{self.writer!r} does not have")
        key = ("router", name)
        if key in self.memo:
            return self.memo[key]
        cols = []
        for inp in r.inputs:
            if isinstance(inp, ir.InputScalar):
                if _mentions_router(inp.expr):
                    raise self.fail(f"router {name!r}: a router's input cannot read a router")
                v = self.materialise(self.num(self.lower(inp.expr)))
                cols.append(f"{v.code}[:, None]")
            else:
                cols.append(self.feature(feature_of(inp), inp, r.model))
        return self.let(key, f"self.nets[{py_str(name)}](torch.cat(({', '.join(cols)},), -1))", "f")

    def feature(self, decl: StepFeature, node, model: str) -> str:
        """The call of the helper that computes a step feature of `model` on the batch, with
        what the step gives (`features.Call`) and the node's fields as literals."""
        if decl.reads != (LOGITS,) and (self.ensemble is not None or model != self.writer):
            raise self.fail(f"{decl.name} of {model!r} read in the step of {self.writer!r}")
        given = feature_fields(decl, node, self.where) | {"step": "step", "dtype": "self.dtype"}
        if LOGITS in decl.reads:
            given |= dict(zip(("x", "p", "bad"), self.dist(model)))
        if HEAD_ROW in decl.reads:
            given["row"] = f"self.heads[{self.heads.index((node.model, node.file))}]"
        return f"{decl.batched.fn}({', '.join(given[a] for a in decl.batched.args)})"


def _mentions_router(e: ir.Expr) -> bool:
    return any(isinstance(x, ir.RouterProb) for x in ir.walk(e))


def head_keys(program: ir.Program) -> list[tuple[str, str]]:
    """The program's distinct head rows as (model, file), in the order `self.heads` holds them."""
    keys: list[tuple[str, str]] = []
    exprs = [t.when for t in program.transitions]
    exprs += [i.expr for r in program.routers for i in r.inputs if isinstance(i, ir.InputScalar)]
    for root in exprs:
        for e in ir.walk(root):
            decl = feature_of(e)
            if decl is not None and HEAD_ROW in decl.reads and (e.model, e.file) not in keys:
                keys.append((e.model, e.file))
    return keys


def _writer_view(program: ir.Program, index: int, writer: str, heads: list[tuple[str, str]]) -> dict:
    """What the template needs of one writer's class."""
    low = _WriterLowering(program, writer, heads)
    low.transitions()
    low.max_bound()
    needs = writer_needs(program, writer)
    return {
        "cls": f"Router{index}",
        "name": py_str(writer),
        "name_doc": doc_text(writer),
        "index": index,
        "hidden_layers": "(" + "".join(f"{py_int(x)}, " for x in needs.hidden_layers) + ")",
        "token_embedding": "True" if needs.token_embedding else "False",
        "blocks": [dataclasses.asdict(b) for b in low.blocks],
        "ensemble": None if low.ensemble is None else _ensemble_view(low.ensemble),
    }


def _ensemble_view(ens: ir.Ensemble) -> dict:
    """An ensemble's constants for its `combine`."""
    total = 0.0
    for w in ens.weights:
        total += w
    cum, acc = [], 0.0
    for w in ens.weights:
        acc += w
        cum.append(acc / total)
    return {
        "comment": comment_text(f"{span_text(ens.span)}: ensemble {ens.name} = {ens.mode}"
                                f"({', '.join(f'{m}: {w!r}' for m, w in zip(ens.members, ens.weights))})"
                                + (f" topk_union {ens.topk_union}" if ens.topk_union else "")),
        "mode": ens.mode,
        "n": len(ens.members),
        "log_weights": "(" + "".join(f"{py_float(math.log(w / total) if w > 0 else -math.inf)}, "
                                     for w in ens.weights) + ")",
        "cum": "(" + "".join(f"{py_float(c)}, " for c in cum) + ")",
        "topk": "None" if ens.topk_union is None else py_int(ens.topk_union),
        "seed_c": to_int64(ir.splitmix64(int(py_int(ens.seed)) & _MASK64)),
    }


_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(_TEMPLATES),
    undefined=jinja2.StrictUndefined,
    autoescape=False,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
)


def _helpers_import() -> str:
    """The module's import of `tokenrouter.protocol.features`: the core helpers and every
    declared feature's (the same for every program)."""
    names = sorted({*_CORE, *(f.batched.fn for f in FEATURES.values())})
    head = "from tokenrouter.protocol.features import ("
    lines = textwrap.wrap(", ".join(names) + ")", 110 - len(head), break_on_hyphens=False)
    return head + ("\n" + " " * len(head)).join(lines)


def generate_module(program: ir.Program) -> str:
    """The router module of `program` as Python source (deterministic; checked by `compile`)."""
    if not isinstance(program, ir.Program):
        raise CodegenError("generate_module expects an ir.Program")
    check_program(program)
    heads = head_keys(program)
    writers = program.writers()
    view = {
        "source": comment_text(os.path.basename(str(program.source)) or "<program>"),
        "source_doc": doc_text(os.path.basename(str(program.source)) or "<program>"),
        "ir_version": py_int(program.ir_version),
        "language_version": py_int(program.language_version),
        "writers": "(" + "".join(f"{py_str(w)}, " for w in writers) + ")",
        "models": "(" + "".join(f"{py_str(m.name)}, " for m in program.models) + ")",
        "start": py_str(program.start),
        "routers": [_writer_view(program, i, w, heads) for i, w in enumerate(writers)],
        "helpers": _helpers_import(),
    }
    source = _ENV.get_template("module.py.j2").render(**view)
    try:
        compile(source, f"<router module of {view['source']}>", "exec")
    except SyntaxError as exc:  # a bug in the generator, never the user's doing
        raise CodegenError(f"generated module does not compile: {exc}") from None
    return source
