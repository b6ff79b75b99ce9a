"""Argument checks shared by the commands."""

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


def report_unreadable(files: list[str], command: str) -> bool:
    """Print a usage error for each path that is not a readable file; True if any was."""
    import os
    import sys
    bad = [f for f in files if not os.path.isfile(f)]
    for f in bad:
        why = "is a directory" if os.path.isdir(f) else "no such file"
        print(f"tokenrouter {command}: error: cannot read '{f}': {why}", file=sys.stderr)
    return bool(bad)
