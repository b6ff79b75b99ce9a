"""Text to syntax tree: Lark (LALR, strict) on grammars/route.lark, then a conversion to
`tokenrouter.dsl.ast` nodes with spans.

Whatever the input, `parse_source` returns diagnostics instead of raising: bytes that are
not UTF-8, oversized files, unknown characters, unexpected tokens, unclosed braces and
absurd nesting each become a friendly diagnostic. A file with syntax errors is parsed a
second time by a recovering parser (`_all_syntax_errors`) that reports every one of them:
it skips a bad character, and after an unexpected token it drops the statement and
resumes at the next statement boundary (a declaration keyword, a rule, `}`), so each
broken statement gives one diagnostic. Semantic checks are not done here.
"""

from __future__ import annotations

import copy
import re
import threading
from pathlib import Path

import lark
from lark import Token, Tree
from lark.lexer import BasicLexer, LexerState, PatternStr, TextSlice

from tokenrouter.dsl import ast
from tokenrouter.dsl.diagnostics import Diagnostic, Note, words
from tokenrouter.dsl.span import Span

MAX_BYTES = 2 * 1024 * 1024  # a routing program is a page; refuse megabytes politely
MAX_DEPTH = 200  # syntax-tree nesting; deeper input is rejected before any recursion


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
                # Spans are computed from the tokens by _Builder: keeping every token and
                # skipping Lark's position propagation makes parsing about twice as fast.
                _parser = lark.Lark(grammar_path().read_text(encoding="utf-8"), parser="lalr",
                                    strict=True, keep_all_tokens=True,
                                    lexer_callbacks={"COMMENT": _on_comment})
    return _parser


# ------------------------------------------------------------------- entry


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
    """Parse `text`; on a syntax error returns (None, [one diagnostic])."""
    if text.startswith("\ufeff"):
        text = text[1:]
    if len(text) > MAX_BYTES:
        return None, [Diagnostic("E006", f"the text has {len(text)} characters; the limit is {MAX_BYTES}",
                                 Span(path, 1, 1, 1, 2))]
    deep = _bracket_depth_error(text, path)
    if deep:
        return None, [deep]
    _local.comments = []
    try:
        tree = lark_parser().parse(text)
    except lark.exceptions.UnexpectedInput as exc:
        _local.comments = None
        if len(text) > RECOVER_LIMIT:  # a page-sized program gets every error; megabytes, the first
            return None, [_first_syntax_error(exc, text, path)]
        return None, _all_syntax_errors(text, path)
    finally:
        comments, _local.comments = _local.comments, None
    deep = _tree_depth_error(tree, path)
    if deep:
        return None, [deep]
    file = _Builder(path).file(tree)
    file_comments = tuple(ast.Comment(t.value.rstrip(), t.line, t.column) for t in comments)
    return ast.File(file.header, file.items, file_comments, path), []


# ------------------------------------------------------------- syntax errors

_TERMINAL_WORDS = {
    "NAME": "a name", "NUMBER": "a number", "STRING": "a string", "DURATION": "a duration (like 20ms)",
    "CMP_OP": "a comparison", "MUL_OP": "'*' or '/'", "$END": "the end of the file",
}


def _describe(terminal: str) -> str:
    if terminal in _TERMINAL_WORDS:
        return _TERMINAL_WORDS[terminal]
    try:
        pattern = lark_parser().get_terminal(terminal).pattern
    except KeyError:
        return terminal.lower()

    return f"'{pattern.value}'" if isinstance(pattern, PatternStr) else terminal.lower()


def _expected(terminals) -> str:
    described = sorted({_describe(t) for t in terminals if not t.startswith("__") or t.startswith("__ANON")},
                       key=lambda w: (not w.startswith("'"), w))
    if len(described) > 10:
        described = described[:10] + ["..."]
    return words(described)


def _token_text(token) -> str:
    text = str(token)
    if token.type == "$END":
        return "end of file"
    return repr(text[:30]) if len(text) <= 30 else repr(text[:30] + "...")


def _unexpected_char(exc, text: str, path: str) -> Diagnostic:
    span = Span(path, exc.line, exc.column, exc.line, exc.column + 1)
    char = exc.char
    if char == '"':
        return Diagnostic("E002", "unterminated string", span,
                          hint='close the string with " on the same line')
    shown = repr(char) if char.isprintable() else f"U+{ord(char):04X}"
    return Diagnostic("E002", f"unexpected character {shown}", span, hint=_CHAR_HINTS.get(
        char, "this character has no meaning in a .route file (comments start with '#')"))


_CHAR_HINTS = {
    "&": "write 'and'", "|": "write 'or'", "!": "write 'not' (or '!=' to compare)",
    "'": 'strings are written in double quotes: "..."', ";": "statements need no separator",
    "=": "compare with '==', or give an attribute as `key = value`",
}


def _end_span(text: str, path: str) -> Span:
    lines = text.split("\n")
    line = len(lines)
    while line > 1 and not lines[line - 1].strip():
        line -= 1
    col = len(lines[line - 1]) + 1
    return Span(path, line, col, line, col + 1)


def _unclosed_note(text: str, path: str) -> tuple[Note, ...]:
    stack = _bracket_scan(text)[1]
    if not stack:
        return ()
    char, line, col = stack[-1]
    return (Note(f"this '{char}' is not closed", Span(path, line, col, line, col + 1)),)


def _unexpected_eof(expected, text: str, path: str) -> Diagnostic:
    return Diagnostic("E003", "unexpected end of file", _end_span(text, path),
                      hint=f"expected {_expected(expected)}" if expected else None,
                      notes=_unclosed_note(text, path))


def _unexpected_token(exc, text: str, path: str) -> Diagnostic:
    token = exc.token
    if token.type == "$END":
        return _unexpected_eof(exc.expected, text, path)
    end_col = token.end_column if token.end_line == token.line else token.column + 1
    span = Span(path, token.line, token.column, token.line, end_col)
    hint = f"expected {_expected(exc.expected)}"
    if token.type in ("KEEP", "REWRITE") or str(token) in ("keep", "rewrite"):
        hint += "; an action comes last: 'SRC -> DST when CONDITION keep|rewrite'"
    return Diagnostic("E001", f"unexpected {_token_text(token)}", span, hint=hint)


# ------------------------------------------------------- every syntax error

MAX_SYNTAX_ERRORS = 30
RECOVER_LIMIT = 64 * 1024  # characters (a program is a page); larger files report their first syntax error only


def _first_syntax_error(exc, text: str, path: str) -> Diagnostic:
    if isinstance(exc, lark.exceptions.UnexpectedCharacters):
        return _unexpected_char(exc, text, path)
    if isinstance(exc, lark.exceptions.UnexpectedToken):
        return _unexpected_token(exc, text, path)
    return _unexpected_eof(exc.expected, text, path)


def _keyword_types() -> frozenset[str]:
    """Terminals that are words (`model`, `when`, `max`, ...): the contextual lexer reads
    them as names where a keyword is not expected."""
    return frozenset(t.name for t in lark_parser().terminals
                     if isinstance(t.pattern, PatternStr) and re.fullmatch(r"[A-Za-z_]\w*", t.pattern.value))


_TOP_LEVEL = frozenset({"PARAM", "MODEL", "ROUTER", "HEAD", "ENSEMBLE", "ROUTE", "SERVE"})
_basic_lexer = None


def _lexer():
    global _basic_lexer
    if _basic_lexer is None:
        conf = copy.copy(lark_parser().lexer_conf)
        conf.skip_validation = True  # the parser has validated these terminals (strict mode) already
        with _parser_lock:
            _basic_lexer = BasicLexer(conf)
    return _basic_lexer


def _lex_all(text: str, path: str, diags: list[Diagnostic]) -> list:
    """Every token, skipping what cannot be a token: a bad character (one E002 each), or
    an unterminated string (E002, the rest of its line skipped)."""
    lexer = _lexer()
    state = LexerState(TextSlice.cast_from(text))
    tokens = []
    while len(diags) < MAX_SYNTAX_ERRORS:
        try:
            tokens.append(lexer.next_token(state))
        except EOFError:
            return tokens
        except lark.exceptions.UnexpectedCharacters as exc:
            pos = state.line_ctr.char_pos
            if text[pos] == '"':
                nl = text.find("\n", pos)
                end = len(text) if nl < 0 else nl
                diags.append(_unexpected_char(exc, text, path))
            else:  # a run of bad characters (`&&`) is one mistake
                end = pos + 1
                while end < len(text) and text[end] not in ' \t\r\n"' and lexer.match(state.text, end) is None:
                    end += 1
                diag = _unexpected_char(exc, text, path)
                if end > pos + 1:
                    run = text[pos:end]
                    shown = repr(run) if run.isprintable() and len(run) <= 30 else f"{len(run)} characters"
                    diag = Diagnostic(diag.code, f"unexpected characters {shown}",
                                      Span(path, exc.line, exc.column, exc.line, exc.column + end - pos), diag.hint)
                diags.append(diag)
            tokens.append(_Skipped(pos, end))
            state.line_ctr.feed(text[pos:end])
    return tokens


class _Skipped:
    """Where the lexer skipped text: the statement around it is already reported."""

    type = "<skipped>"

    def __init__(self, pos: int, end: int):
        self.start_pos, self.end_pos = pos, end


def _level(tokens, i: int, tok) -> int | None:
    """The block depth at which `tok` (tokens[i], retyped) can begin a statement (0: a
    declaration or block, 1: a statement inside a block, or the `}` closing it), or None."""
    if tok.type in _TOP_LEVEL:
        return 0
    if tok.type in ("START", "VISIT", "RBRACE"):
        return 1
    if tok.type == "NAME":
        nxt = tokens[i + 1].type if i + 1 < len(tokens) else None
        if nxt in ("__ANON_0", "EQUAL"):  # `SRC -> ...`, `key = ...`
            return 1
        after = tokens[i + 2].type if i + 2 < len(tokens) else None
        if nxt == "NAME" and after == "EQUAL":  # `batch llm = ...`
            return 1
    return None


def _all_syntax_errors(text: str, path: str) -> list[Diagnostic]:
    """Every syntax error in `text`, each positioned; see the module docstring."""
    diags: list[Diagnostic] = []
    tokens = _lex_all(text, path, diags)
    skipped = [t.start_pos for t in tokens if isinstance(t, _Skipped)]
    keywords = _keyword_types()
    ip = lark_parser().parse_interactive("")
    checkpoints = {0: ip.copy(deepcopy_values=False)}  # depth -> the parser before a statement there
    depth, i, last_error = 0, 0, -1
    stmt_start = 0  # text offset where the statement being parsed starts

    def retype(tok, choices):
        if tok.type in keywords and tok.type not in choices and "NAME" in choices:
            return Token.new_borrow_pos("NAME", str(tok), tok)
        return tok

    def report(diag_fn, upto: int):
        # one diagnostic per statement: none after a character the lexer skipped in it
        if not any(stmt_start <= p <= upto for p in skipped) and len(diags) < MAX_SYNTAX_ERRORS:
            diags.append(diag_fn())

    def resume(j: int):
        """(parser, depth, index) at the first statement boundary from tokens[j] on that
        an enclosing level accepts; top-level keywords first go back to the top level."""
        while j < len(tokens):
            if not isinstance(tokens[j], _Skipped):
                order = sorted(checkpoints, reverse=tokens[j].type not in _TOP_LEVEL)
                for d in order:
                    choices = checkpoints[d].choices()
                    tok = retype(tokens[j], choices)
                    if _level(tokens, j, tok) == d and tok.type in choices:
                        return checkpoints[d], d, j
            j += 1
        return None

    while i < len(tokens) and len(diags) < MAX_SYNTAX_ERRORS:
        if isinstance(tokens[i], _Skipped):
            i += 1
            continue
        choices = ip.choices()
        tok = retype(tokens[i], choices)
        before = None
        if _level(tokens, i, tok) == depth and tok.type in choices:
            before = ip.copy(deepcopy_values=False)
        try:
            ip.feed_token(tok)
        except lark.exceptions.UnexpectedToken as exc:
            if i != last_error:  # (a resumed parser can fail on the same token: LALR reduces first)
                report(lambda: _unexpected_token(exc, text, path), tok.start_pos)
            found = resume(i if i != last_error else i + 1)
            last_error = i
            if found is None:
                return sorted(diags, key=Diagnostic.sort_key)
            saved, depth, i = found
            ip = saved.copy(deepcopy_values=False)
            checkpoints = {d: c for d, c in checkpoints.items() if d <= depth}
            stmt_start = tokens[i].start_pos
            continue
        if before is not None:  # a statement began here: come back to this point after an error in it
            checkpoints = {d: c for d, c in checkpoints.items() if d < depth}
            checkpoints[depth] = before
            stmt_start = tok.start_pos
        if tok.type == "LBRACE":
            depth += 1
            checkpoints[depth] = ip.copy(deepcopy_values=False)
            stmt_start = tok.end_pos
        elif tok.type == "RBRACE":
            depth = max(depth - 1, 0)
            checkpoints = {d: c for d, c in checkpoints.items() if d <= depth}
        i += 1
    try:
        if i >= len(tokens):
            ip.feed_eof()
    except lark.exceptions.UnexpectedToken as exc:
        report(lambda: _unexpected_eof(exc.expected, text, path), len(text))
    if not diags:  # the fast parser failed where this one did not: never lose its error
        try:
            lark_parser().parse(text)
        except lark.exceptions.UnexpectedInput as exc:
            diags.append(_first_syntax_error(exc, text, path))
    return sorted(diags, key=Diagnostic.sort_key)


def _bracket_scan(text: str, limit: int = 1 << 30):
    """(where the nesting first went deeper than `limit` or None, the stack of brackets
    still open at the end), skipping strings and comments. Cheap and robust, for the
    depth limit and the unclosed-brace note."""
    stack: list[tuple[str, int, int]] = []
    too_deep = None
    line, col, i, n = 1, 1, 0, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line, col, i = line + 1, 1, i + 1
            continue
        if c == "#":
            j = text.find("\n", i)
            j = n if j < 0 else j
            col += j - i
            i = j
            continue
        if c == '"':
            j = i + 1
            while j < n and text[j] not in '"\n':
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n) if j < n and text[j] == '"' else j
            col += j - i
            i = j
            continue
        if c in "([{":
            stack.append((c, line, col))
            if len(stack) > limit and too_deep is None:
                too_deep = (line, col)
        elif c in ")]}" and stack:
            stack.pop()
        i += 1
        col += 1
    return too_deep, stack


def _bracket_depth_error(text: str, path: str) -> Diagnostic | None:
    too_deep, _ = _bracket_scan(text, MAX_DEPTH // 2)
    if too_deep is None:
        return None
    line, col = too_deep
    return Diagnostic("E005", f"brackets nested more than {MAX_DEPTH // 2} deep", Span(path, line, col, line, col + 1),
                      hint="split the expression or remove redundant parentheses")


def _tree_depth_error(tree, path: str) -> Diagnostic | None:
    """Iterative depth measure, so the (recursive) conversion below never overflows."""
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            tok = _first_token(node)
            span = Span(path, tok.line, tok.column, tok.line, tok.column + 1)
            return Diagnostic("E005", f"expression too deeply nested or too long (more than {MAX_DEPTH} levels)", span,
                              hint="split the condition into simpler rules")
        stack.extend((c, depth + 1) for c in node.children if isinstance(c, Tree))
    return None


# -------------------------------------------------------------- conversion

# Tokens that carry meaning; the others (keywords, punctuation) only place spans.
_SIGNIFICANT = frozenset({"NAME", "STRING", "NUMBER", "DURATION", "KEEP", "REWRITE", "MIN", "MAX", "THEN",
                          "CMP_OP", "PLUS", "MINUS", "MUL_OP"})


def _first_token(tree):
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


class _Builder:
    """Lark tree -> ast nodes. Recursion depth is bounded by `_tree_depth_error`."""

    def __init__(self, path: str):
        self.path = path

    def span_tok(self, tok) -> Span:
        return Span(self.path, tok.line, tok.column, tok.end_line, tok.end_column)

    def span(self, tree) -> Span:
        first, last = _first_token(tree), _last_token(tree)
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
