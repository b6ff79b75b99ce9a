"""The syntax tree of a .route file: what was written, with a source span on every node.

Nodes are frozen dataclasses. Spans (and the literal text of numbers) are excluded from
equality, so two trees compare equal when they say the same thing however they were laid
out: that is what `parse(fmt(x)) == parse(x)` means. No meaning is attached here; names
are resolved and checked by the compiler (`compiler/check/`), the layer above.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from tokenrouter.dsl.span import Span


def _span() -> Span | None:
    return field(default=None, compare=False, repr=False)


# ---------------------------------------------------------------- expressions


@dataclass(frozen=True)
class Name:
    text: str
    span: Span | None = _span()


@dataclass(frozen=True)
class Num:
    value: float
    is_int: bool
    text: str = field(default="", compare=False)
    span: Span | None = _span()
    param: str | None = field(default=None, compare=False)  # set by the checker where a parameter was bound


@dataclass(frozen=True)
class Str:
    value: str
    text: str = field(default="", compare=False)  # as written, quotes and escapes included
    span: Span | None = _span()


@dataclass(frozen=True)
class Duration:
    ms: float
    text: str = field(default="", compare=False)
    span: Span | None = _span()


@dataclass(frozen=True)
class Ref:
    """A bare name in an expression: a router, a head, `visit_tokens`, or a keyword-like
    argument such as `normalized` or `auto`."""

    name: Name
    span: Span | None = _span()


@dataclass(frozen=True)
class Arg:
    label: Name | None  # `a: 0.5` in an ensemble's member list
    value: "Expr"
    span: Span | None = _span()


@dataclass(frozen=True)
class Call:
    func: Name
    args: tuple[Arg, ...]
    span: Span | None = _span()


@dataclass(frozen=True)
class ListLit:
    items: tuple["Expr", ...]
    span: Span | None = _span()


@dataclass(frozen=True)
class Unary:
    op: str  # "-" | "not"
    operand: "Expr"
    span: Span | None = _span()


@dataclass(frozen=True)
class Binary:
    op: str  # "or" "and" "<" "<=" ">" ">=" "==" "!=" "+" "-" "*" "/"
    left: "Expr"
    right: "Expr"
    span: Span | None = _span()


Expr = Union[Num, Str, Duration, Ref, Call, ListLit, Unary, Binary]


# ----------------------------------------------------------------- statements


@dataclass(frozen=True)
class Attr:
    key: Name
    value: Expr
    span: Span | None = _span()


@dataclass(frozen=True)
class Header:
    version: Num
    span: Span | None = _span()


@dataclass(frozen=True)
class ParamDecl:
    """`param NAME: TYPE [= DEFAULT] [in [LO, HI]]`: a value the deployment may override
    with `--set NAME=VALUE`. Without a default it must be set."""

    name: Name
    type: Name  # float | int | duration | path | string (checked, not parsed)
    default: Expr | None = None
    range: Expr | None = None  # a two-item list literal, checked
    span: Span | None = _span()


@dataclass(frozen=True)
class ModelDecl:
    name: Name
    path: Str | None  # None: declared by role only; a deployment binds it (--model NAME=PATH)
    attrs: tuple[Attr, ...] = ()
    span: Span | None = _span()


@dataclass(frozen=True)
class RouterDecl:
    name: Name
    model: Name
    path: Str | Ref  # a file, or a `path` parameter that names one
    attrs: tuple[Attr, ...] = ()
    span: Span | None = _span()


@dataclass(frozen=True)
class HeadDecl:
    name: Name
    model: Name
    path: Str | Ref
    attrs: tuple[Attr, ...] = ()
    span: Span | None = _span()


@dataclass(frozen=True)
class EnsembleDecl:
    name: Name
    mode: Name
    members: tuple[Arg, ...]
    attrs: tuple[Attr, ...] = ()
    span: Span | None = _span()


@dataclass(frozen=True)
class Start:
    writer: Name
    span: Span | None = _span()


@dataclass(frozen=True)
class Transition:
    source: Name
    dest: Name
    when: Expr
    action: Name  # keep | rewrite
    span: Span | None = _span()


@dataclass(frozen=True)
class VisitClause:
    key: Name  # min | max | then
    value: Expr | Name
    span: Span | None = _span()


@dataclass(frozen=True)
class Visit:
    writer: Name
    clauses: tuple[VisitClause, ...]
    span: Span | None = _span()


RouteStmt = Union[Start, Transition, Visit]


@dataclass(frozen=True)
class RouteBlock:
    stmts: tuple[RouteStmt, ...]
    span: Span | None = _span()


@dataclass(frozen=True)
class ServeEntry:
    key: Name
    target: Name | None  # the model it applies to; None = every model / global
    value: Expr
    span: Span | None = _span()


@dataclass(frozen=True)
class ServeBlock:
    entries: tuple[ServeEntry, ...]
    span: Span | None = _span()


Item = Union[ParamDecl, ModelDecl, RouterDecl, HeadDecl, EnsembleDecl, RouteBlock, ServeBlock]


@dataclass(frozen=True)
class Comment:
    text: str  # including the leading '#'
    line: int
    col: int


@dataclass(frozen=True)
class File:
    header: Header | None
    items: tuple[Item, ...]
    comments: tuple[Comment, ...] = field(default=(), compare=False, repr=False)
    path: str = field(default="<input>", compare=False)
