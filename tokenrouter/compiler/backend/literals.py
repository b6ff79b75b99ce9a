"""What generated code may contain of a program, made safe: every value that reaches a
generated module passes through one of these.

User names appear only as Python string literals made by `repr` (`py_str`); numbers are
checked to be numbers and printed by `repr(float)`/`int` (`py_float`, `py_int`); comments
are reduced to printable ASCII on one line (`comment_text`), docstrings to letters, digits
and " _.,:-" (`doc_text`); a span is named by its file's base name and line (`span_text`),
so no path leaks into the module and it does not depend on where the program lies.
"""

from __future__ import annotations

import math
import os

from tokenrouter.compiler import ir

_MASK64 = (1 << 64) - 1


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
