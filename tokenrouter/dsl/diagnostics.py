"""Diagnostics: one error or warning with a stable code, a span, a hint and notes, and
their rendering as `file:line:col`, the source line and a caret under the span.

The catalogue `CODES` is the single list of codes (docs/language.md has the same table;
a test keeps them in step). Codes never change meaning once released.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Iterable, Literal

from tokenrouter.dsl.span import Span

Severity = Literal["error", "warning"]

# code -> (severity, short title). E0xx syntax and input, E1xx names, E2xx attributes,
# E3xx expressions and features, E4xx routing, E5xx ensembles, E6xx serving, E7xx parameters
# and bindings, W models.
CODES: dict[str, tuple[Severity, str]] = {
    "E001": ("error", "syntax error: unexpected token"),
    "E002": ("error", "syntax error: unexpected character"),
    "E003": ("error", "syntax error: unexpected end of file"),
    "E004": ("error", "the file is not UTF-8 text"),
    "E005": ("error", "nesting too deep"),
    "E006": ("error", "the file is too large"),
    "E010": ("error", "missing language version header"),
    "E011": ("error", "unsupported language version"),
    "E101": ("error", "duplicate name"),
    "E102": ("error", "undefined name"),
    "E103": ("error", "a name of the wrong kind"),
    "E104": ("error", "unknown built-in model"),
    "E201": ("error", "unknown attribute"),
    "E202": ("error", "duplicate attribute"),
    "E203": ("error", "invalid attribute value"),
    "E204": ("error", "missing attribute"),
    "E301": ("error", "unknown function"),
    "E302": ("error", "wrong number of arguments"),
    "E303": ("error", "wrong argument type"),
    "E304": ("error", "type mismatch"),
    "E305": ("error", "threshold outside the range of its feature"),
    "E306": ("error", "invalid router input"),
    "E308": ("error", "cannot load a model"),
    "E309": ("error", "models do not share a tokenizer"),
    "E310": ("error", "router weights do not fit their declaration"),
    "E311": ("error", "no readable router weights file"),
    "E401": ("error", "missing start"),
    "E402": ("error", "duplicate start"),
    "E403": ("error", "condition reads a model that is not running"),
    "E404": ("error", "handoff to itself"),
    "E405": ("error", "unreachable rule"),
    "E406": ("error", "invalid visit bound"),
    "E407": ("error", "missing route block"),
    "E501": ("error", "negative ensemble weight"),
    "E502": ("error", "ensemble weights do not sum to 1"),
    "E503": ("error", "invalid ensemble members"),
    "E601": ("error", "unknown serving key"),
    "E602": ("error", "invalid serving value"),
    "E603": ("error", "duplicate serving setting"),
    "E701": ("error", "invalid parameter declaration"),
    "E702": ("error", "parameter value of the wrong type"),
    "E703": ("error", "parameter value outside its range"),
    "E704": ("error", "--set names an undeclared parameter"),
    "E705": ("error", "parameter without a value"),
    "E706": ("error", "model without a path or binding"),
    "E707": ("error", "--model names an undeclared model"),
    "E708": ("error", "invalid parameter range"),
    "E801": ("error", "a feature the model's serving engine cannot give"),
    "W001": ("warning", "ping-pong: overlapping switch-up and switch-back thresholds"),
    "W002": ("warning", "declared but never used"),
    "W003": ("warning", "model path does not exist"),
    "W004": ("warning", "router fitted for other models"),
}


@dataclass(frozen=True)
class Note:
    message: str
    span: Span | None = None


@dataclass(frozen=True)
class Diagnostic:
    code: str
    message: str
    span: Span | None
    hint: str | None = None
    notes: tuple[Note, ...] = ()

    @property
    def severity(self) -> Severity:
        return CODES[self.code][0]

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def sort_key(self) -> tuple[int, int]:
        return (self.span.line, self.span.col) if self.span else (0, 0)


def sort_diagnostics(diags: Iterable[Diagnostic]) -> list[Diagnostic]:
    """Source order; stable, so diagnostics at the same place keep the order found."""
    return sorted(diags, key=Diagnostic.sort_key)


_MAX_SHOWN = 120  # a source line longer than this is shown as a window around the span


def _printable(line: str) -> str:
    return "".join(c if (c.isprintable() or c == " ") else ("?" if c != "\t" else " ") for c in line)


def _excerpt(lines: list[str], span: Span) -> list[str]:
    if not (1 <= span.line <= len(lines)):
        return []
    text = _printable(lines[span.line - 1])
    start = max(span.col - 1, 0)
    end = span.end_col - 1 if span.end_line == span.line else len(text)
    end = max(end, start + 1)
    offset, prefix, suffix = 0, "", ""
    if len(text) > _MAX_SHOWN:
        offset = max(0, min(start - 40, len(text) - _MAX_SHOWN))
        prefix = "..." if offset else ""
        suffix = "..." if offset + _MAX_SHOWN < len(text) else ""
        text = text[offset:offset + _MAX_SHOWN]
        start, end = start - offset, min(end - offset, _MAX_SHOWN)
    gutter = str(span.line)
    pad = " " * len(gutter)
    caret = " " * (len(prefix) + start) + "^" * max(1, end - start)
    return [f" {gutter} | {prefix}{text.rstrip()}{suffix}", f" {pad} | {caret}"]


def render(diag: Diagnostic, source: str | None) -> str:
    """`file:line:col: error[CODE]: message`, the line with a caret, hint and notes."""
    lines = source.splitlines() if source is not None else []
    where = f"{diag.span}: " if diag.span else ""
    out = [f"{where}{diag.severity}[{diag.code}]: {diag.message}"]
    if diag.span:
        out += _excerpt(lines, diag.span)
    if diag.hint:
        out.append(f"  = hint: {diag.hint}")
    for note in diag.notes:
        if note.span:
            out.append(f"{note.span}: note: {note.message}")
            out += _excerpt(lines, note.span)
        else:
            out.append(f"  = note: {note.message}")
    return "\n".join(out)


def to_json(diag: Diagnostic, file: str) -> dict:
    """The machine-readable form (`tokenrouter check --format json`, docs/language.md):
    line and col are 1-based, `end` is exclusive; a diagnostic about the command line
    itself (`--set`, `--model`) has no position: line, col and end are null."""
    def where(span: Span | None) -> dict:
        if span is None:
            return {"file": file, "line": None, "col": None, "end": None}
        return {"file": span.file, "line": span.line, "col": span.col,
                "end": {"line": span.end_line, "col": span.end_col}}

    return {"code": diag.code, "severity": diag.severity, **where(diag.span), "message": diag.message,
            "hints": [diag.hint] if diag.hint else [],
            "notes": [{"message": n.message, **where(n.span)} for n in diag.notes]}


def render_all(diags: Iterable[Diagnostic], source: str | None) -> str:
    return "\n".join(render(d, source) for d in diags)


def words(items: Iterable[str], conj: str = "or") -> str:
    """['a', 'b', 'c'] -> "a, b or c"."""
    items = list(dict.fromkeys(items))
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} {conj} {items[-1]}"


def did_you_mean(name: str, candidates: Iterable[str]) -> str | None:
    """A close match among `candidates`, by edit similarity, or None."""
    pool = [c for c in candidates if c != name]
    match = difflib.get_close_matches(name, pool, n=1, cutoff=0.6)
    if not match:
        lowered = {c.lower(): c for c in pool}
        if name.lower() in lowered:
            return lowered[name.lower()]
        return None
    return match[0]
