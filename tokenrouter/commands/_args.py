"""Argument checks shared by the commands."""

from __future__ import annotations

import os
import sys


class UsageError(ValueError):
    """A mistake on the command line. A command may let it out of `run`: `cli.main` prints
    it as `tokenrouter COMMAND: error: ...` and exits with status 2."""


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
    bad = [f for f in files if not os.path.isfile(f)]
    for f in bad:
        why = "is a directory" if os.path.isdir(f) else "no such file"
        print(f"tokenrouter {command}: error: cannot read '{f}': {why}", file=sys.stderr)
    return bool(bad)


# ------------------------------------------------ deployment bindings (--set, --model)

def add_binding_args(parser, model_help: str | None = None) -> None:
    """`--set NAME=VALUE` and `--model NAME=PATH`, both repeatable: the same two flags on
    every command that loads a .route program. Read them back with `bindings(args)`."""
    parser.add_argument("--set", dest="set_params", action="append", default=None, metavar="NAME=VALUE",
                        help="set a parameter of the program (repeatable); the value is checked against "
                             "the parameter's declared type and range")
    parser.add_argument("--model", dest="model_bindings", action="append", default=None, metavar="NAME=PATH",
                        help=model_help or "bind a model to a checkpoint folder, .gguf file or built-in name "
                                           "(repeatable); required for a model declared without a path")


def pairs(values, flag: str, form: str = "NAME=VALUE") -> dict[str, str]:
    """['a=1', 'b=x=y'] -> {'a': '1', 'b': 'x=y'}; a UsageError names the flag and the bad
    item (no '=', an empty name, a name given twice)."""
    out: dict[str, str] = {}
    for item in values or ():
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise UsageError(f"{flag} takes {form}, got {item!r}")
        if not name.isidentifier():
            raise UsageError(f"{flag} {item!r}: {name!r} is not a name")
        if name in out:
            raise UsageError(f"{flag} {name} is given twice ({name}={out[name]} and {item})")
        out[name] = value
    return out


def bindings(args) -> tuple[dict[str, str] | None, dict[str, str] | None]:
    """(params, model_paths) from `add_binding_args`' flags, each None when not given, ready
    for `compiler.pipeline.check_file` / `load_program`. A malformed item is a UsageError
    (exit 2); the values themselves are checked against the program by the checker."""
    params = pairs(getattr(args, "set_params", None), "--set")
    models = pairs(getattr(args, "model_bindings", None), "--model", "NAME=PATH")
    for name, path in models.items():
        if not path.strip():
            raise UsageError(f"--model {name}= needs a path")
    return params or None, models or None


QUANT_HELP = ("weight format: none (float, exact), native (a GGUF file's own Q4_0/Q4_1/Q8_0 blocks), "
              "int4 or int8 (quantise a float checkpoint on load); default: the program's, else the "
              "model's own (native for the qwen2.5-coder built-ins, none otherwise); see docs/models.md")


def with_quant(program, items: list[str] | None):
    """`--quant` applied to a loaded program (`compiler.pipeline.with_quant`; imported here
    lazily so that building the command line does not import the compiler)."""
    from tokenrouter.compiler.pipeline import with_quant as apply

    return apply(program, items)
