"""Who wrote which token, on a terminal: each run of tokens one writer wrote on that writer's
background colour (ANSI escapes when the output is a terminal), `[writer:text]` brackets
around each run otherwise (scripts/demo.sh)."""

from __future__ import annotations

from typing import Sequence

# ANSI 256-colour backgrounds per writer, in the order small, large, others (black text)
ANSI_BACKGROUNDS = (153, 216, 151, 183, 229, 250)


def runs(pieces: Sequence[str], writers: Sequence[str]) -> list[tuple[str, str]]:
    """(writer, text) for each stretch of consecutive tokens one writer wrote; tokens that
    add no text (special tokens, half a character) join their neighbours' stretch."""
    out: list[tuple[str, str]] = []
    for piece, w in zip(pieces, writers):
        if not piece:
            continue
        if out and out[-1][0] == w:
            out[-1] = (w, out[-1][1] + piece)
        else:
            out.append((w, piece))
    return out


def coloured(pieces: Sequence[str], writers: Sequence[str], order: Sequence[str], tty: bool) -> str:
    """The text of `pieces`, each writer's stretch marked (`order` fixes the colours)."""
    colours = {w: ANSI_BACKGROUNDS[i % len(ANSI_BACKGROUNDS)] for i, w in enumerate(order)}
    out = []
    for w, text in runs(pieces, writers):
        if tty:
            lines = text.split("\n")  # colour each line on its own, so a newline never drags a background
            out.append("\n".join(f"\x1b[48;5;{colours.get(w, 250)}m\x1b[30m{ln}\x1b[0m" if ln else "" for ln in lines))
        else:
            out.append(f"[{w}:{text}]")
    return "".join(out)


def legend(order: Sequence[str], tty: bool, what: dict[str, str] | None = None) -> str:
    """How to read `coloured`'s output: each writer's colour on a terminal, its bracket form
    otherwise, with `what[writer]` (e.g. "the small model") after it."""
    what = what or {}
    parts = []
    for w in order:
        sample = coloured([f" {w} "], [w], order, True) if tty else f"[{w}:...]"
        parts.append(f"{sample} {what[w]}" if w in what else sample)
    return ",  ".join(parts)
