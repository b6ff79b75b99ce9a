"""`tokenrouter check FILE...`: parse and check .route files, print every diagnostic.

Each file that checks gets a line `FILE: ok` (with its warnings counted) on stderr, which
`-q` leaves out. `--format json` prints one JSON object per diagnostic on stdout instead
(one per line; the schema is in docs/language.md), for editors and CI. Exit status: 0 when no file has an
error (warnings are printed), 1 when any has, 2 on usage errors (no file given, a path that
is not a readable file, a malformed --set or --model)."""

from __future__ import annotations

import argparse
import json
import sys

from tokenrouter.commands._args import add_binding_args, bindings, report_unreadable

HELP = "check .route files and report every error and warning"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help=".route files to check")
    parser.add_argument("--emit", choices=["ir"], help="print the checked program's IR (JSON) on stdout")
    parser.add_argument("--format", choices=["text", "json"], default="text",
                        help="diagnostics as text with carets on stderr (default), or as JSON objects, "
                             "one per line, on stdout")
    parser.add_argument("-q", "--quiet", action="store_true", help="no `FILE: ok` line for a file that checks")
    add_binding_args(parser)


def run(args) -> int:
    from tokenrouter.compiler.pipeline import check_file
    from tokenrouter.runtime.loader import model_facts
    from tokenrouter.dsl.diagnostics import render, to_json

    params, model_paths = bindings(args)  # a malformed --set or --model: a UsageError, exit 2
    if args.format == "json" and args.emit:
        print("tokenrouter check: error: --format json and --emit ir both write to stdout; pick one",
              file=sys.stderr)
        return 2
    if report_unreadable(args.files, "check"):
        return 2
    status = 0
    for path in args.files:
        program, diags = check_file(path, model_paths=model_paths, params=params, model_facts=model_facts)
        if args.format == "json":
            for d in diags:
                print(json.dumps(to_json(d, path), ensure_ascii=False))
            status = max(status, int(any(d.is_error for d in diags)))
            continue
        source = _text(path)
        for d in diags:
            print(render(d, source), file=sys.stderr)
        errors = sum(d.is_error for d in diags)
        warnings = len(diags) - errors
        if errors:
            status = 1
            print(f"{path}: {_count(errors, 'error')}, {_count(warnings, 'warning')}", file=sys.stderr)
            continue
        if not args.quiet:
            print(f"{path}: ok" + (f", {_count(warnings, 'warning')}" if warnings else ""), file=sys.stderr)
        if args.emit == "ir" and program is not None:
            print(program.to_json())
    return status


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None
