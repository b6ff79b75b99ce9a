"""The grammar (grammars/route.lark) and the Lark machinery built from it, once per process.

`lark_parser()` is the fast parser (LALR, strict) every parse starts with; `parse_tree`
runs it and collects the file's comments on the way (the formatter keeps them);
`basic_lexer()` is a plain lexer on the same terminals, for the recovering parser of
`syntax_errors.py`. `grammar_path()` finds the grammar in a wheel or in a source tree.
"""

from __future__ import annotations

import copy
import threading
from pathlib import Path

import lark
from lark.lexer import BasicLexer


class GrammarNotFound(RuntimeError):
    """grammars/route.lark is missing from the installation."""


def grammar_path() -> Path:
    """grammars/route.lark: inside the package when installed from a wheel (setup.py copies
    it there), else at the root of the source tree next to the package (editable install)."""
    package = Path(__file__).resolve().parents[1]
    candidates = [package / "grammars" / "route.lark", package.parent / "grammars" / "route.lark"]
    for path in candidates:
        if path.is_file():
            return path
    raise GrammarNotFound(
        "the .route grammar is missing from this installation: looked for "
        + " and ".join(str(p) for p in candidates)
        + ". Reinstall tokenrouter (pip install tokenrouter, or pip install -e . from a checkout)")


_local = threading.local()
_parser = None
_parser_lock = threading.Lock()


def _on_comment(token):
    comments = getattr(_local, "comments", None)
    if comments is not None:
        comments.append(token)
    return token


def lark_parser():
    """The compiled parser, built once per process (building takes ~100 ms)."""
    global _parser
    if _parser is None:
        with _parser_lock:
            if _parser is None:
                # Spans are computed from the tokens (tree_to_ast.py): keeping every token and
                # skipping Lark's position propagation makes parsing about twice as fast.
                _parser = lark.Lark(grammar_path().read_text(encoding="utf-8"), parser="lalr",
                                    strict=True, keep_all_tokens=True,
                                    lexer_callbacks={"COMMENT": _on_comment})
    return _parser


def parse_tree(text: str):
    """(the Lark tree of `text`, the comment tokens in it), from the fast parser; raises
    lark's `UnexpectedInput` on a syntax error."""
    _local.comments = []
    try:
        tree = lark_parser().parse(text)
    finally:
        comments, _local.comments = _local.comments, None
    return tree, comments


_basic_lexer = None


def basic_lexer():
    """A lexer on the parser's terminals that reads tokens one at a time, whatever the
    parser would expect; built once per process."""
    global _basic_lexer
    if _basic_lexer is None:
        conf = copy.copy(lark_parser().lexer_conf)
        conf.skip_validation = True  # the parser has validated these terminals (strict mode) already
        with _parser_lock:
            _basic_lexer = BasicLexer(conf)
    return _basic_lexer
