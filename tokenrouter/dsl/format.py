"""The canonical layout of a .route file (`tokenrouter fmt`).

One statement per line, two-space indentation, `{` at the end of the line that opens a
block and `}` alone, single spaces around operators, parentheses only where precedence
needs them, literals as written. Comments are kept: a comment on its own line stays on
its own line before the statement that follows it, a comment after code stays after that
statement. Blank lines between statements are kept (runs collapse to one). The output
parses to the same tree as the input, and formatting it again changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenrouter.dsl import ast
from tokenrouter.dsl.diagnostics import Diagnostic
from tokenrouter.dsl.parser import parse_source

INDENT = "  "
_PREC = {"or": 1, "and": 2, "not": 3, "<": 4, "<=": 4, ">": 4, ">=": 4, "==": 4, "!=": 4,
         "+": 5, "-": 5, "*": 6, "/": 6}
_ATOM, _NEG = 8, 7


def format_source(text: str, path: str = "<input>") -> tuple[str | None, list[Diagnostic]]:
    """The formatted text, or None and the syntax diagnostics."""
    tree, diags = parse_source(text, path)
    if tree is None:
        return None, diags
    return format_tree(tree, text), []


# --------------------------------------------------------------- expressions


def expr(node) -> str:
    return _expr(node)[0]


def _expr(node) -> tuple[str, int]:
    if isinstance(node, ast.Num):
        return (node.text or repr(node.value)), _ATOM
    if isinstance(node, ast.Str):
        return (node.text or '"' + node.value.replace("\\", "\\\\").replace('"', '\\"') + '"'), _ATOM
    if isinstance(node, ast.Duration):
        return (node.text or f"{node.ms:g}ms"), _ATOM
    if isinstance(node, ast.Ref):
        return node.name.text, _ATOM
    if isinstance(node, ast.Call):
        return f"{node.func.text}({args(node.args)})", _ATOM
    if isinstance(node, ast.ListLit):
        return "[" + ", ".join(expr(i) for i in node.items) + "]", _ATOM
    if isinstance(node, ast.Unary):
        text, prec = _expr(node.operand)
        if node.op == "not":  # `not (a > b)` reads better than the equivalent `not a > b`
            return "not " + (f"({text})" if prec < _ATOM else text), _PREC["not"]
        return "-" + (f"({text})" if prec < _NEG else text), _NEG
    prec = _PREC[node.op]
    left, lp = _expr(node.left)
    right, rp = _expr(node.right)
    if lp < prec or (lp == prec and prec == 4):  # comparisons do not chain
        left = f"({left})"
    if rp <= prec:  # operators are left-associative
        right = f"({right})"
    return f"{left} {node.op} {right}", prec


def args(items) -> str:
    return ", ".join((f"{a.label.text}: " if a.label else "") + expr(a.value) for a in items)


# -------------------------------------------------------------------- lines


@dataclass
class _Line:
    depth: int
    text: str
    first: int  # source lines this output line stands for
    last: int
    kind: str = "stmt"  # stmt | open | close


def _attr_block(head: str, node, attrs, depth: int) -> list[_Line]:
    s = node.span
    if not attrs:
        return [_Line(depth, head, s.line, s.end_line)]
    lines = [_Line(depth, head + " {", s.line, s.line, "open")]
    lines += [_Line(depth + 1, f"{a.key.text} = {expr(a.value)}", a.span.line, a.span.end_line) for a in attrs]
    lines.append(_Line(depth, "}", s.end_line, s.end_line, "close"))
    return lines


def _block(head: str, node, children: list[_Line], depth: int) -> list[_Line]:
    s = node.span
    return ([_Line(depth, head + " {", s.line, s.line, "open")] + children
            + [_Line(depth, "}", s.end_line, s.end_line, "close")])


def _stmt(node) -> str:
    if isinstance(node, ast.Start):
        return f"start {node.writer.text}"
    if isinstance(node, ast.Transition):
        return f"{node.source.text} -> {node.dest.text} when {expr(node.when)} {node.action.text}"
    if isinstance(node, ast.Visit):
        parts = [f"visit {node.writer.text}"]
        for c in node.clauses:
            value = c.value.text if isinstance(c.value, ast.Name) else expr(c.value)
            parts.append(f"{c.key.text} {value}")
        return " ".join(parts)
    target = f" {node.target.text}" if node.target else ""
    return f"{node.key.text}{target} = {expr(node.value)}"


def _lines(tree: ast.File) -> list[_Line]:
    out: list[_Line] = []
    if tree.header:
        h = tree.header
        out.append(_Line(0, f"tokenrouter {h.version.text}", h.span.line, h.span.end_line))
    for item in tree.items:
        if isinstance(item, ast.ParamDecl):
            text = f"param {item.name.text}: {item.type.text}"
            text += f" = {expr(item.default)}" if item.default is not None else ""
            text += f" in {expr(item.range)}" if item.range is not None else ""
            out.append(_Line(0, text, item.span.line, item.span.end_line))
        elif isinstance(item, ast.ModelDecl):
            path = f" = {expr(item.path)}" if item.path is not None else ""
            out += _attr_block(f"model {item.name.text}{path}", item, item.attrs, 0)
        elif isinstance(item, ast.RouterDecl):
            out += _attr_block(f"router {item.name.text} on {item.model.text} = {expr(item.path)}",
                               item, item.attrs, 0)
        elif isinstance(item, ast.HeadDecl):
            out += _attr_block(f"head {item.name.text} on {item.model.text} = {expr(item.path)}",
                               item, item.attrs, 0)
        elif isinstance(item, ast.EnsembleDecl):
            out += _attr_block(f"ensemble {item.name.text} = {item.mode.text}({args(item.members)})",
                               item, item.attrs, 0)
        else:
            stmts = item.stmts if isinstance(item, ast.RouteBlock) else item.entries
            head = "route" if isinstance(item, ast.RouteBlock) else "serve"
            children = [_Line(1, _stmt(s), s.span.line, s.span.end_line) for s in stmts]
            out += _block(head, item, children, 0)
    return out


def format_tree(tree: ast.File, text: str) -> str:
    """Lay out `tree` (parsed from `text`), placing its comments."""
    src = text.split("\n")
    comments = sorted(tree.comments, key=lambda c: (c.line, c.col))
    ci = 0
    result: list[str] = []
    prev_last = 0  # source line of the last thing emitted
    prev_kind = "start"

    def blank_between(a: int, b: int) -> bool:
        return any(not src[i - 1].strip() for i in range(a + 1, b) if 0 < i <= len(src))

    def emit(depth: int, content: str, first: int, last: int, kind: str):
        nonlocal prev_last, prev_kind
        if (result and prev_kind != "open" and kind != "close" and blank_between(prev_last, first)):
            result.append("")
        result.append(INDENT * depth + content)
        prev_last, prev_kind = max(prev_last, last), kind

    for line in _lines(tree):
        lead_depth = line.depth + 1 if line.kind == "close" else line.depth
        while ci < len(comments) and comments[ci].line < line.first:
            c = comments[ci]
            emit(lead_depth, c.text, c.line, c.line, "comment")
            ci += 1
        trailing = []
        while ci < len(comments) and comments[ci].line <= line.last:
            trailing.append(comments[ci].text)
            ci += 1
        content = line.text + ("  " + " ".join(trailing) if trailing else "")
        emit(line.depth, content, line.first, line.last, line.kind)
    while ci < len(comments):
        c = comments[ci]
        emit(0, c.text, c.line, c.line, "comment")
        ci += 1
    return "\n".join(result) + "\n" if result else ""
