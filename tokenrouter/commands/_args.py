"""Argument parsers shared by the commands: comma-separated number lists."""

from __future__ import annotations


def positive_ints(text: str, what: str) -> list[int]:
    """'1,8,16' -> [1, 8, 16] (sorted, unique, each >= 1); ValueError names the flag."""
    try:
        vals = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"{what} must be comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in vals):
        raise ValueError(f"{what} must be >= 1")
    return vals
