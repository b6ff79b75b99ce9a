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


QUANT_HELP = ("weight format: none (float, exact), native (a GGUF file's own Q4_0/Q4_1/Q8_0 blocks), "
              "int4 or int8 (quantise a float checkpoint on load); see docs/models.md")


def with_quant(program, items: list[str] | None):
    """The program with `--quant Q` (every model) or `--quant NAME=Q` (one model) applied."""
    import dataclasses

    from tokenrouter.compiler.builtins import QUANTS
    if not items:
        return program
    names = [m.name for m in program.models]
    every, per = None, {}
    for item in items:
        name, sep, q = item.rpartition("=")
        if q not in QUANTS:
            raise ValueError(f"--quant takes Q or NAME=Q with Q one of {', '.join(QUANTS)}, got {item!r}")
        if not sep:
            every = q
        elif name not in names:
            raise ValueError(f"--quant {item}: {name!r} is not a model of the program ({', '.join(names)})")
        else:
            per[name] = q
    models = tuple(dataclasses.replace(m, quant=per.get(m.name, every or m.quant)) for m in program.models)
    return dataclasses.replace(program, models=models)
