"""The `tokenrouter` command line: one subcommand per module in tokenrouter/commands/.

Each command module defines `HELP` (one line), `configure(parser)` and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from tokenrouter.commands._args import UsageError
from tokenrouter.runtime import logs

# Building the parser imports every command module, so each imports the layers it drives
# (compiler, runtime, tuner, bench, eval, fit: torch, zmq, uvicorn) inside `run` and its
# helpers, not at the top. Measured on a 2-core host: `tokenrouter --help` takes 0.06-0.19 s
# this way; importing what the commands' `run` import first takes 4.2-4.7 s.
# name -> module under tokenrouter.commands; the order is the order of `--help`.
COMMANDS = {
    "check": "check",
    "fmt": "fmt",
    "compile": "compile",
    "explain": "explain",
    "models": "models",
    "generate": "generate",
    "serve": "serve",
    "keygen": "keygen",
    "profile": "profile",
    "tune": "tune",
    "bench": "bench",
    "eval": "eval",
    "fit": "fit",
}


# command -> {word: module}: a command's further jobs, each with options of its own
# (`tokenrouter bench runlength-check`). argparse cannot put a subcommand next to a
# command's optional FILE, so `main` picks these out before parsing.
SUBCOMMANDS = {
    "bench": {"runlength-check": "bench_runlength"},
    "models": {"pull": "models_pull"},
}


def command_module(module_name: str):
    """The module of a command or subcommand (`tokenrouter.commands.<module_name>`). An entry
    of COMMANDS or SUBCOMMANDS whose module does not exist is a bug of this file, not a
    missing extra: it fails here, naming the entry, rather than dropping a command from
    `--help`."""
    try:
        return importlib.import_module(f"tokenrouter.commands.{module_name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"tokenrouter.commands.{module_name}":
            raise  # a module the command imports is missing: its own error says which
        raise ImportError(f"tokenrouter/cli.py names the command module {module_name!r}, but "
                          f"tokenrouter/commands/{module_name}.py does not exist") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenrouter", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = command_module(module_name)
        more = SUBCOMMANDS.get(name, {})
        epilog = "also: " + "; ".join(f"tokenrouter {name} {word} --help" for word in more) if more else None
        cmd = sub.add_parser(name, help=module.HELP, description=module.HELP, epilog=epilog)
        module.configure(cmd)
        cmd.set_defaults(_run=module.run, _prog=cmd.prog)
    return parser


def build_subcommand_parser(command: str, word: str) -> argparse.ArgumentParser:
    """The parser of `tokenrouter COMMAND WORD` (see SUBCOMMANDS)."""
    module = command_module(SUBCOMMANDS[command][word])
    parser = argparse.ArgumentParser(prog=f"tokenrouter {command} {word}", description=module.HELP)
    module.configure(parser)
    parser.set_defaults(_run=module.run, _prog=parser.prog)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if len(argv) >= 2 and argv[1] in SUBCOMMANDS.get(argv[0], {}):
        parser = build_subcommand_parser(argv[0], argv[1])
        argv = argv[2:]
    else:
        parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help(sys.stderr)
        return 2
    logs.configure("tokenrouter")  # progress lines of long steps, warnings: one line each on stderr
    try:
        return int(args._run(args) or 0)
    except UsageError as exc:  # what a command lets out of `run` (commands/_args.py)
        print(f"{args._prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
