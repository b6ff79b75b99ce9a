"""Lark's tree to `tokenrouter.dsl.ast` nodes, each with its span.

The parser keeps every token (`keep_all_tokens`), so a node's span runs from its first
token to its last; keywords and punctuation only place spans, the significant tokens
(`_SIGNIFICANT`) carry the values. The conversion is recursive: `parser.py` measures the
tree's depth first, so it never runs deeper than `MAX_DEPTH`.
"""

from __future__ import annotations

from lark import Token, Tree

from tokenrouter.dsl import ast
from tokenrouter.dsl.span import Span

# Tokens that carry meaning; the others (keywords, punctuation) only place spans.
_SIGNIFICANT = frozenset({"NAME", "STRING", "NUMBER", "DURATION", "KEEP", "REWRITE", "MIN", "MAX", "THEN",
                          "CMP_OP", "PLUS", "MINUS", "MUL_OP"})


def first_token(tree):
    node = tree
    while not isinstance(node, Token):
        node = next(c for c in node.children if c is not None)
    return node


def _last_token(tree):
    node = tree
    while not isinstance(node, Token):
        node = next(c for c in reversed(node.children) if c is not None)
    return node


def _parts(tree) -> list:
    return [c for c in tree.children if c is not None and (not isinstance(c, Token) or c.type in _SIGNIFICANT)]


def _unescape(raw: str) -> str:
    body = raw[1:-1]
    out, i = [], 0
    escapes = {"n": "\n", "t": "\t", '"': '"', "\\": "\\"}
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            out.append(escapes.get(body[i + 1], body[i + 1]))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


_DURATION_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0}


class AstBuilder:
    """Lark tree -> ast nodes. Recursion depth is bounded by the depth check in `parser.py`."""

    def __init__(self, path: str):
        self.path = path

    def span_tok(self, tok) -> Span:
        return Span(self.path, tok.line, tok.column, tok.end_line, tok.end_column)

    def span(self, tree) -> Span:
        first, last = first_token(tree), _last_token(tree)
        return Span(self.path, first.line, first.column, last.end_line, last.end_column)

    def name(self, tok) -> ast.Name:
        return ast.Name(str(tok), self.span_tok(tok))

    def file(self, tree) -> ast.File:
        header, items = None, []
        for child in tree.children:
            if child.data == "header":
                header = ast.Header(self.number(_parts(child)[0]), self.span(child))
            else:
                items.append(getattr(self, child.data)(child))
        return ast.File(header, tuple(items), path=self.path)

    def _split(self, children):
        """Tokens/trees before an optional trailing `attrs` tree, and the attrs."""
        children = [c for c in children if c is not None and (not hasattr(c, "type") or c.type in _SIGNIFICANT)]
        if children and isinstance(children[-1], Tree) and children[-1].data == "attrs":
            return children[:-1], self.attrs(children[-1])
        return children, ()

    def attrs(self, tree) -> tuple[ast.Attr, ...]:
        return tuple(ast.Attr(self.name(_parts(a)[0]), self.expr(_parts(a)[1]), self.span(a))
                     for a in tree.children if not hasattr(a, "type"))

    def param_decl(self, tree):
        name, type_, default, range_ = None, None, None, None
        after_in = False
        for child in tree.children:
            if isinstance(child, Token):
                if child.type == "NAME":
                    if name is None:
                        name = child
                    else:
                        type_ = child
                after_in = after_in or child.type == "IN"
            elif after_in:
                range_ = self.expr(child)
            else:
                default = self.expr(child)
        return ast.ParamDecl(self.name(name), self.name(type_), default, range_, self.span(tree))

    def model_decl(self, tree):
        rest, attrs = self._split(tree.children)
        path = self.string(rest[1]) if len(rest) > 1 else None
        return ast.ModelDecl(self.name(rest[0]), path, attrs, self.span(tree))

    def file_ref(self, tok):
        """A weights file: a string, or the name of a `path` parameter."""
        if tok.type == "NAME":
            return ast.Ref(self.name(tok), self.span_tok(tok))
        return self.string(tok)

    def router_decl(self, tree):
        (name, model, path), attrs = self._split(tree.children)
        return ast.RouterDecl(self.name(name), self.name(model), self.file_ref(path), attrs, self.span(tree))

    def head_decl(self, tree):
        (name, model, path), attrs = self._split(tree.children)
        return ast.HeadDecl(self.name(name), self.name(model), self.file_ref(path), attrs, self.span(tree))

    def ensemble_decl(self, tree):
        rest, attrs = self._split(tree.children)
        name, mode = rest[0], rest[1]
        members = self.arglist(rest[2]) if len(rest) > 2 else ()
        return ast.EnsembleDecl(self.name(name), self.name(mode), members, attrs, self.span(tree))

    def route_block(self, tree):
        stmts = []
        for child in tree.children:
            if hasattr(child, "type"):  # the braces
                continue
            parts = _parts(child)
            if child.data == "start_stmt":
                stmts.append(ast.Start(self.name(parts[0]), self.span(child)))
            elif child.data == "transition":
                src, dst, cond, action = parts
                stmts.append(ast.Transition(self.name(src), self.name(dst), self.expr(cond),
                                            self.name(_parts(action)[0]), self.span(child)))
            else:  # visit_stmt
                clauses = []
                for clause in parts[1:]:
                    key, value = _parts(clause)
                    val = self.name(value) if hasattr(value, "type") else self.expr(value)
                    clauses.append(ast.VisitClause(self.name(key), val, self.span(clause)))
                stmts.append(ast.Visit(self.name(parts[0]), tuple(clauses), self.span(child)))
        return ast.RouteBlock(tuple(stmts), self.span(tree))

    def serve_block(self, tree):
        entries = []
        for child in tree.children:
            if hasattr(child, "type"):
                continue
            parts = _parts(child)
            target = self.name(parts[1]) if len(parts) == 3 else None
            entries.append(ast.ServeEntry(self.name(parts[0]), target, self.expr(parts[-1]), self.span(child)))
        return ast.ServeBlock(tuple(entries), self.span(tree))

    def arglist(self, tree) -> tuple[ast.Arg, ...]:
        args = []
        for arg in _parts(tree):
            parts = _parts(arg)
            if len(parts) == 2:
                args.append(ast.Arg(self.name(parts[0]), self.expr(parts[1]), self.span(arg)))
            else:
                args.append(ast.Arg(None, self.expr(parts[0]), self.span(arg)))
        return tuple(args)

    # -- expressions
    def number(self, tok) -> ast.Num:
        text = str(tok)
        is_int = text.isdigit()
        return ast.Num(int(text) if is_int else float(text), is_int, text, self.span_tok(tok))

    def string(self, tok) -> ast.Str:
        return ast.Str(_unescape(str(tok)), str(tok), self.span_tok(tok))

    def expr(self, tree):
        kind, ch = tree.data, _parts(tree)
        if kind == "expr_atom":  # ( expr )
            return self.expr(ch[0])
        span = self.span(tree)
        if kind == "number":
            return self.number(ch[0])
        if kind == "string":
            return self.string(ch[0])
        if kind == "duration":
            text = str(ch[0])
            unit = "ms" if text.endswith("ms") else ("us" if text.endswith("us") else "s")
            return ast.Duration(float(text[:-len(unit)]) * _DURATION_UNITS[unit], text, span)
        if kind == "ref":
            return ast.Ref(self.name(ch[0]), span)
        if kind == "call":
            args = self.arglist(ch[1]) if len(ch) > 1 and ch[1] is not None else ()
            return ast.Call(self.name(ch[0]), args, span)
        if kind == "list":
            return ast.ListLit(tuple(self.expr(c) for c in ch if c is not None), span)
        if kind == "neg":
            operand = self.expr(ch[1])
            if isinstance(operand, ast.Num):  # fold, so `-1` is a literal and prints back as one
                text = operand.text[1:] if operand.text.startswith("-") else "-" + operand.text
                return ast.Num(-operand.value, operand.is_int, text, span)
            return ast.Unary("-", operand, span)
        if kind == "not_op":
            return ast.Unary("not", self.expr(ch[0]), span)
        if kind in ("or_op", "and_op"):
            return ast.Binary(kind[:-3], self.expr(ch[0]), self.expr(ch[1]), span)
        if kind in ("compare", "arith"):
            return ast.Binary(str(ch[1]), self.expr(ch[0]), self.expr(ch[2]), span)
        raise AssertionError(f"unhandled grammar rule {kind!r}")  # grammar and builder out of step
