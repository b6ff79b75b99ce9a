"""Syntax errors as diagnostics: what was unexpected, where, and what was expected.

`first_syntax_error` turns the fast parser's exception into one diagnostic. A file with
syntax errors is parsed a second time by a recovering parser (`all_syntax_errors`) that
reports every one of them: it skips a bad character, and after an unexpected token it
drops the statement and resumes at the next statement boundary (a declaration keyword, a
rule, `}`), so each broken statement gives one diagnostic. `bracket_scan` finds the
brackets left open (for the note on an unexpected end of file) and the nesting depth.
"""

from __future__ import annotations

import re

import lark
from lark import Token
from lark.lexer import LexerState, PatternStr

try:
    from lark.lexer import TextSlice  # lark >= 1.3 lexes a TextSlice
except ImportError:  # lark 1.2 (the version vLLM pins) lexes the str itself
    TextSlice = None

from tokenrouter.dsl.diagnostics import Diagnostic, Note, words
from tokenrouter.dsl.grammar import basic_lexer, lark_parser
from tokenrouter.dsl.span import Span

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
    stack = bracket_scan(text)[1]
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


def first_syntax_error(exc, text: str, path: str) -> Diagnostic:
    """The one diagnostic for the fast parser's exception."""
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


def _lex_all(text: str, path: str, diags: list[Diagnostic]) -> list:
    """Every token, skipping what cannot be a token: a bad character (one E002 each), or
    an unterminated string (E002, the rest of its line skipped)."""
    lexer = basic_lexer()
    state = LexerState(TextSlice.cast_from(text) if TextSlice is not None else text)
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


def all_syntax_errors(text: str, path: str) -> list[Diagnostic]:
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
            diags.append(first_syntax_error(exc, text, path))
    return sorted(diags, key=Diagnostic.sort_key)


def bracket_scan(text: str, limit: int = 1 << 30):
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
