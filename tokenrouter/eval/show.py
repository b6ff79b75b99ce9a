"""Who wrote which token, on a terminal: each token's text on its writer's background colour
(ANSI escapes when the output is a terminal, `[writer:text]` brackets otherwise)."""

from __future__ import annotations

from typing import Sequence

# ANSI 256-colour backgrounds per writer, in the order small, large, others (black text)
ANSI_BACKGROUNDS = (153, 216, 151, 183, 229, 250)


def coloured(pieces: Sequence[str], writers: Sequence[str], order: Sequence[str], tty: bool) -> str:
    """The text of `pieces`, each marked with its writer (`order` fixes the colours)."""
    colours = {w: ANSI_BACKGROUNDS[i % len(ANSI_BACKGROUNDS)] for i, w in enumerate(order)}
    out = []
    for piece, w in zip(pieces, writers):
        if not piece:
            continue
        if tty:
            lines = piece.split("\n")  # colour each line on its own, so a newline never drags a background
            out.append("\n".join(f"\x1b[48;5;{colours.get(w, 250)}m\x1b[30m{ln}\x1b[0m" if ln else "" for ln in lines))
        else:
            out.append(f"[{w}:{piece}]")
    return "".join(out)


def legend(order: Sequence[str], tty: bool) -> str:
    return "  ".join(coloured([f" {w} "], [w], order, tty) for w in order)
