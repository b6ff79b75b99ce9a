"""Jinja2 code generation of the fused, batched router module of a program.

`generate_module(program)` returns the Python source of one module with, per writer, a
class whose `route(step)` is a single tensor program over the whole batch (no loop over
requests): the log-softmax of each distribution the rules read is computed once, and
entropy, top-1 probability, margin and top-k derive from it; router networks are
`torch.nn.Module`s handed in at load time (see `weights/nets.py`, `compiled.py`); the
decisions leave the device in one copy. Each class declares what its `route` reads of
the step (`compiler/needs.py`). What is the same for every program (the feature helpers,
the seeded hash, `send`/`receive`, which move only the unseen suffix) is not emitted: the
module imports it from `tokenrouter.protocol`. The semantics are the reference
interpreter's (`interpreter.py`), which is the oracle.

`_check_program` first checks what generation relies on; `_WriterLowering` then lowers
one writer's rules (its transitions, then its max bound) into the statements of its
`route`, and the template (`templates/module.py.j2`) lays the classes out.

Safety: nothing a `.route` file says reaches the module as code. User names appear only
as Python string literals made by `repr`; class and variable names are generated from
indices; numbers are checked to be numbers and printed by `repr(float)`/`int`; comments
are reduced to printable ASCII on one line, docstrings to letters, digits and " _.,:-".
The module is passed through `compile()` before it is returned, and the output is
deterministic (no dict-order, time or path dependence: comments name a span's file by its
base name).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field

import jinja2

from tokenrouter.compiler import ir
from tokenrouter.compiler.needs import writer_needs

_TEMPLATES = os.path.join(os.path.dirname(__file__), "templates")
_MASK64 = (1 << 64) - 1
_CMP = {"<", "<=", ">", ">=", "==", "!="}
_ARITH = {"+", "-", "*", "/"}
_ACTIVATIONS = {"relu", "gelu", "silu", "tanh"}


class CodegenError(ValueError):
    """The IR cannot be compiled (it names something that does not exist, a feature its
    writer's step does not have, or a value of the wrong type)."""


# ------------------------------------------------------------------ safe literals


def py_str(value: object) -> str:
    if not isinstance(value, str):
        raise CodegenError(f"expected a string, got {type(value).__name__} {value!r}")
    return repr(value)


def py_int(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int):
        raise CodegenError(f"expected an integer, got {type(value).__name__} {value!r}")
    return str(int(value))


def py_float(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CodegenError(f"expected a number, got {type(value).__name__} {value!r}")
    x = float(value)
    if math.isnan(x):
        return "NAN"
    if math.isinf(x):
        return "INF" if x > 0 else "(-INF)"
    return repr(x)


def to_int64(value: int) -> int:
    """An unsigned 64-bit pattern as the signed int64 torch holds."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def comment_text(text: str, limit: int = 150) -> str:
    """`text` as one line of printable ASCII, safe after a '#'."""
    out = []
    for ch in text:
        o = ord(ch)
        if 0x20 <= o < 0x7F:
            out.append(ch)
        elif ch in "\t\n\r":
            out.append(" ")
        else:
            out.append(f"\\u{o:04x}" if o <= 0xFFFF else f"\\U{o:08x}")
    s = " ".join("".join(out).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def doc_text(text: str, limit: int = 80) -> str:
    """`text` reduced to characters that mean nothing inside a docstring ('?' for the rest)."""
    s = "".join(ch if ch.isascii() and (ch.isalnum() or ch in " _.,:-") else "?" for ch in text)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def span_text(span: ir.Span | None) -> str:
    if span is None:
        return "<no span>"
    return comment_text(f"{os.path.basename(str(span.file))}:{int(span.line)}")


def render(e: object) -> str:
    """An expression as `.route`-like text, for comments only."""
    if isinstance(e, ir.Const):
        return repr(e.value)
    if isinstance(e, ir.Entropy):
        return f"entropy({e.model}{', normalized' if e.normalized else ''})"
    if isinstance(e, ir.TopProb):
        return f"top_prob({e.model})"
    if isinstance(e, ir.Margin):
        return f"margin({e.model})"
    if isinstance(e, ir.RouterProb):
        return e.router
    if isinstance(e, ir.HeadLogit):
        return f"head({e.model}, {os.path.basename(e.file)!r}{', sigmoid' if e.sigmoid else ''})"
    if isinstance(e, ir.Bernoulli):
        return f"bernoulli({e.p!r}, seed={e.seed!r})"
    if isinstance(e, ir.VisitTokens):
        return "visit_tokens"
    if isinstance(e, ir.Compare):
        return f"{render(e.left)} {e.op} {render(e.right)}"
    if isinstance(e, ir.Arith):
        return f"({render(e.left)} {e.op} {render(e.right)})"
    if isinstance(e, ir.Logic):
        if e.op == "not":
            return f"not ({render(e.args[0])})"
        return "(" + f" {e.op} ".join(render(a) for a in e.args) + ")"
    return type(e).__name__


# ------------------------------------------------------------------ validation


def _check_program(p: ir.Program) -> None:
    """What code generation relies on; the front end's checker reports these first."""
    names = [m.name for m in p.models] + [e.name for e in p.ensembles]
    for n in names:
        py_str(n)
    if len(set(names)) != len(names):
        raise CodegenError(f"writer names are not unique: {names}")
    writers, models = set(names), {m.name for m in p.models}
    if p.start not in writers:
        raise CodegenError(f"start writer {p.start!r} is not declared")
    _check_rules(p, writers)
    for e in p.ensembles:
        _check_ensemble(e, models)
    seen = set()
    for r in p.routers:
        _check_router(r, models, seen)


def _check_rules(p: ir.Program, writers: set[str]) -> None:
    """Transitions and visit bounds name declared writers; actions and counts are valid."""
    for t in p.transitions:
        where = span_text(t.span)
        if t.source not in writers or t.dest not in writers:
            raise CodegenError(f"{where}: transition {t.source!r} -> {t.dest!r} names an undeclared writer")
        if t.action not in ("keep", "rewrite"):
            raise CodegenError(f"{where}: action must be keep or rewrite, not {t.action!r}")
    for b in p.bounds:
        where = span_text(b.span)
        if b.writer not in writers:
            raise CodegenError(f"{where}: visit bound on undeclared writer {b.writer!r}")
        py_int(b.min_tokens)
        if b.max_tokens is not None:
            py_int(b.max_tokens)
            if b.then is None:
                raise CodegenError(f"{where}: the bound on {b.writer!r} sets max but no 'then'")
        if b.then is not None and b.then not in writers:
            raise CodegenError(f"{where}: 'then' names undeclared writer {b.then!r}")


def _check_ensemble(e: ir.Ensemble, models: set[str]) -> None:
    where = span_text(e.span)
    if not e.members or any(m not in models for m in e.members):
        raise CodegenError(f"{where}: ensemble {e.name!r} members must be declared models")
    if len(e.weights) != len(e.members):
        raise CodegenError(f"{where}: ensemble {e.name!r} needs one weight per member")
    for w in e.weights:
        py_float(w)
    if any(not (math.isfinite(w) and w >= 0) for w in e.weights) or sum(e.weights) <= 0:
        raise CodegenError(f"{where}: ensemble {e.name!r} weights must be finite, >= 0, not all 0")
    if e.mode not in ("average", "mixture"):
        raise CodegenError(f"{where}: ensemble mode must be average or mixture")
    if e.topk_union is not None and int(py_int(e.topk_union)) < 1:
        raise CodegenError(f"{where}: topk_union must be at least 1")
    py_int(e.seed)


def _check_router(r: ir.RouterNet, models: set[str], seen: set[str]) -> None:
    """One router network (`seen`: the names of those before it)."""
    where = span_text(r.span)
    py_str(r.name)
    if r.name in seen:
        raise CodegenError(f"{where}: router {r.name!r} declared twice")
    seen.add(r.name)
    if r.model not in models:
        raise CodegenError(f"{where}: router {r.name!r} reads undeclared model {r.model!r}")
    if r.activation not in _ACTIVATIONS:
        raise CodegenError(f"{where}: unknown activation {r.activation!r}")
    py_int(r.output_index)
    if not r.inputs:
        raise CodegenError(f"{where}: router {r.name!r} has no inputs")
    for inp in r.inputs:
        if isinstance(inp, (ir.InputHidden, ir.InputTokenEmbedding)):
            if int(py_int(inp.dim)) < 0:  # 0: not known before the model is resolved
                raise CodegenError(f"{where}: input width must not be negative")
            if isinstance(inp, ir.InputHidden):
                py_int(inp.layer)
        elif isinstance(inp, ir.InputTopkLogits):
            if int(py_int(inp.k)) < 1:
                raise CodegenError(f"{where}: top-k needs k >= 1")
        elif not isinstance(inp, ir.InputScalar):
            raise CodegenError(f"{where}: unknown router input {inp!r}")


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
            self.new_block(comment_text(f"{self.where}: {t.source} -> {t.dest} when {render(t.when)} {t.action}"))
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
        if isinstance(e, ir.Entropy):
            x, p, bad = self.dist(e.model)
            h = self.let(("entropy", e.model), f"entropy({p}, {bad})", "f")
            if not e.normalized:
                return _Val(h, "num")
            return _Val(self.let(("nentropy", e.model), f"{h} / log_vocab({p})", "f"), "num")
        if isinstance(e, (ir.TopProb, ir.Margin)):
            x, p, bad = self.dist(e.model)
            t2 = self.let(("top2", e.model), f"top2({p}, {bad})", "t")
            if isinstance(e, ir.TopProb):
                return _Val(f"{t2}[:, 0]", "num")
            return _Val(self.let(("margin", e.model), f"{t2}[:, 0] - {t2}[:, 1]", "f"), "num")
        if isinstance(e, ir.RouterProb):
            return _Val(self.router_prob(e.router), "num")
        if isinstance(e, ir.HeadLogit):
            return _Val(self.head_logit(e), "num")
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
            if isinstance(inp, ir.InputHidden):
                cols.append(f"hidden(step, {py_int(inp.layer)}, self.dtype)")
            elif isinstance(inp, ir.InputTokenEmbedding):
                cols.append("embedding(step, self.dtype)")
            elif isinstance(inp, ir.InputTopkLogits):
                x, p, bad = self.dist(r.model)
                cols.append(f"topk({x}, {py_int(inp.k)}, {bad})")
            else:
                if _mentions_router(inp.expr):
                    raise self.fail(f"router {name!r}: a router's input cannot read a router")
                v = self.materialise(self.num(self.lower(inp.expr)))
                cols.append(f"{v.code}[:, None]")
        return self.let(key, f"self.nets[{py_str(name)}](torch.cat(({', '.join(cols)},), -1))", "f")

    def head_logit(self, e: ir.HeadLogit) -> str:
        if self.ensemble is not None or e.model != self.writer:
            raise self.fail(f"head of {e.model!r} read in the step of {self.writer!r}")
        i = self.heads.index((e.model, e.file))
        sig = "True" if e.sigmoid else "False"
        return self.let(("head", i, e.sigmoid), f"head(step, self.heads[{i}], {sig}, self.dtype)", "f")


def _mentions_router(e: ir.Expr) -> bool:
    return any(isinstance(x, ir.RouterProb) for x in ir.walk(e))


def head_keys(program: ir.Program) -> list[tuple[str, str]]:
    """The program's distinct head rows as (model, file), in the order `self.heads` holds them."""
    keys: list[tuple[str, str]] = []
    exprs = [t.when for t in program.transitions]
    exprs += [i.expr for r in program.routers for i in r.inputs if isinstance(i, ir.InputScalar)]
    for root in exprs:
        for e in ir.walk(root):
            if isinstance(e, ir.HeadLogit) and (e.model, e.file) not in keys:
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


def generate_module(program: ir.Program) -> str:
    """The router module of `program` as Python source (deterministic; checked by `compile`)."""
    if not isinstance(program, ir.Program):
        raise CodegenError("generate_module expects an ir.Program")
    _check_program(program)
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
    }
    source = _ENV.get_template("module.py.j2").render(**view)
    try:
        compile(source, f"<router module of {view['source']}>", "exec")
    except SyntaxError as exc:  # a bug in the generator, never the user's doing
        raise CodegenError(f"generated module does not compile: {exc}") from None
    return source
