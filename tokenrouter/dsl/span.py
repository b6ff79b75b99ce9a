"""Where a piece of `.route` text is: file, first line and column, last line and column.

The parser puts one on every AST node, the checker carries it into the IR, and diagnostics
and generated code point back at the source line with it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    file: str
    line: int
    col: int
    end_line: int
    end_col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"
