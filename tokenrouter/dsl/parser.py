"""Text to syntax tree: Lark (LALR, strict) on grammars/route.lark, then a conversion to
`tokenrouter.dsl.ast` nodes with spans.

Whatever the input, `parse_source` returns diagnostics instead of raising: bytes that are
not UTF-8, oversized files, unknown characters, unexpected tokens, unclosed braces and
absurd nesting each become a friendly diagnostic. A file with syntax errors is parsed a
second time by a recovering parser that reports every one of them. Semantic checks are not
done here.

This module is the entry point and holds the input limits (size, nesting); the jobs behind
it are their own modules: `grammar.py` (the grammar file and the Lark parser built from
it), `syntax_errors.py` (syntax errors as diagnostics, and the recovering parser) and
`tree_to_ast.py` (Lark's tree to AST nodes). `grammar_path`, `lark_parser`,
`GrammarNotFound`, `MAX_SYNTAX_ERRORS` and `RECOVER_LIMIT` are importable from here.
"""

from __future__ import annotations

import lark
from lark import Tree

from tokenrouter.dsl import ast
from tokenrouter.dsl.diagnostics import Diagnostic
from tokenrouter.dsl.grammar import GrammarNotFound, grammar_path, lark_parser, parse_tree
from tokenrouter.dsl.span import Span
from tokenrouter.dsl.syntax_errors import (MAX_SYNTAX_ERRORS, RECOVER_LIMIT, all_syntax_errors, bracket_scan,
                                           first_syntax_error)
from tokenrouter.dsl.tree_to_ast import AstBuilder, first_token

__all__ = ["GrammarNotFound", "MAX_BYTES", "MAX_DEPTH", "MAX_SYNTAX_ERRORS", "RECOVER_LIMIT", "grammar_path",
           "lark_parser", "parse_bytes", "parse_source"]

MAX_BYTES = 2 * 1024 * 1024  # a routing program is a page; refuse megabytes politely
MAX_DEPTH = 200  # syntax-tree nesting; deeper input is rejected before any recursion


def parse_bytes(data: bytes, path: str = "<input>") -> tuple[ast.File | None, list[Diagnostic], str]:
    """Decode and parse; returns (tree or None, diagnostics, the decoded text)."""
    if len(data) > MAX_BYTES:
        return None, [Diagnostic(
            "E006", f"the file is {len(data) / 1e6:.1f} MB; a .route file may be at most "
            f"{MAX_BYTES // (1024 * 1024)} MB", Span(path, 1, 1, 1, 2),
            hint="a routing program is a page of text; is this the right file?")], ""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        return None, [Diagnostic(
            "E004", f"the file is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
            Span(path, line, col, line, col + 1), hint="a .route file is UTF-8 text")], ""
    tree, diags = parse_source(text, path)
    return tree, diags, text


def parse_source(text: str, path: str = "<input>") -> tuple[ast.File | None, list[Diagnostic]]:
    """Parse `text`; returns (tree, []) or, on an error, (None, its diagnostics)."""
    if text.startswith("\ufeff"):
        text = text[1:]
    if len(text) > MAX_BYTES:
        return None, [Diagnostic("E006", f"the text has {len(text)} characters; the limit is {MAX_BYTES}",
                                 Span(path, 1, 1, 1, 2))]
    deep = _bracket_depth_error(text, path)
    if deep:
        return None, [deep]
    try:
        tree, comments = parse_tree(text)
    except lark.exceptions.UnexpectedInput as exc:
        if len(text) > RECOVER_LIMIT:  # a page-sized program gets every error; megabytes, the first
            return None, [first_syntax_error(exc, text, path)]
        return None, all_syntax_errors(text, path)
    deep = _tree_depth_error(tree, path)
    if deep:
        return None, [deep]
    file = AstBuilder(path).file(tree)
    file_comments = tuple(ast.Comment(t.value.rstrip(), t.line, t.column) for t in comments)
    return ast.File(file.header, file.items, file_comments, path), []


def _bracket_depth_error(text: str, path: str) -> Diagnostic | None:
    too_deep, _ = bracket_scan(text, MAX_DEPTH // 2)
    if too_deep is None:
        return None
    line, col = too_deep
    return Diagnostic("E005", f"brackets nested more than {MAX_DEPTH // 2} deep", Span(path, line, col, line, col + 1),
                      hint="split the expression or remove redundant parentheses")


def _tree_depth_error(tree, path: str) -> Diagnostic | None:
    """Iterative depth measure, so the (recursive) conversion of tree_to_ast.py never overflows."""
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            tok = first_token(node)
            span = Span(path, tok.line, tok.column, tok.line, tok.column + 1)
            return Diagnostic("E005", f"expression too deeply nested or too long (more than {MAX_DEPTH} levels)", span,
                              hint="split the condition into simpler rules")
        stack.extend((c, depth + 1) for c in node.children if isinstance(c, Tree))
    return None
